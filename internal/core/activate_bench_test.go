package core

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// The activation benchmarks measure core.Activate, the Coordinator's whole
// use case for one Marble (quote verification unless in simulation, CSR
// check, Marble certificate, per-Marble secrets, templates, and with
// MaxActivations the sealed commit of the count), with N Marbles activating
// concurrently and again and again (re-activation with the same UUID is
// allowed). Each Marble's key, certificate, CSR and quote are made before
// the timer starts, as a premain makes them once. ns/op is wall time per
// activation (throughput, as with b.RunParallel); activations/s is its
// inverse. gRPC and TLS are not included: quarry-bench -scenarios activate
// measures them end to end.
//
//	go test -run '^$' -bench 'Activate' -benchmem ./internal/core

// Package of the benchmark manifests: what the synthetic quotes claim.
const (
	benchSignerID  = "3333333333333333333333333333333333333333333333333333333333333333"
	benchProductID = 7
	benchSVN       = 2
)

// activateManifest returns a manifest with one Marble type "marble": two
// shared secrets (an ECDSA certificate and a symmetric key) in its files and
// environment and, with perMarble, also a per-Marble ECDSA P-256 certificate
// and a per-Marble 256-bit symmetric key. maxActivations 0 means unlimited.
func activateManifest(b testing.TB, perMarble bool, maxActivations uint) []byte {
	secrets := map[string]any{
		"shared_cert": map[string]any{"Type": "cert-ecdsa", "Size": 256, "Shared": true},
		"shared_key":  map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true},
	}
	files := map[string]any{
		"/secrets/shared.crt": "{{pem .Secrets.shared_cert.Cert}}",
		"/secrets/shared.key": "{{pem .Secrets.shared_cert.Private}}",
	}
	env := map[string]any{"SHARED_KEY": "{{hex .Secrets.shared_key.Private}}"}
	if perMarble {
		secrets["marble_cert"] = map[string]any{"Type": "cert-ecdsa", "Size": 256}
		secrets["marble_key"] = map[string]any{"Type": "symmetric-key", "Size": 256}
		files["/secrets/marble.crt"] = "{{pem .Secrets.marble_cert.Cert}}"
		files["/secrets/marble.key"] = "{{pem .Secrets.marble_cert.Private}}"
		env["MARBLE_KEY"] = "{{hex .Secrets.marble_key.Private}}"
	}
	marble := map[string]any{"Package": "bench", "Parameters": map[string]any{
		"Files": files, "Env": env, "Argv": []string{"./marble", "--serve"},
	}}
	if maxActivations > 0 {
		marble["MaxActivations"] = maxActivations
	}
	raw, err := json.Marshal(map[string]any{
		"Packages": map[string]any{"bench": map[string]any{
			"SignerID": benchSignerID, "ProductID": benchProductID, "SecurityVersion": benchSVN,
		}},
		"Marbles": map[string]any{"marble": marble},
		"Secrets": secrets,
	})
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// benchMarble is one simulated Marble: its activation request, made once.
type benchMarble struct {
	req ActivationRequest
}

// newBenchMarble makes a Marble's identity as the premain does: a P-384
// key, a self-signed TLS client certificate, a CSR, a random UUID and, if
// pl is not nil, a synthetic quote whose report data is SHA-256 of the
// certificate and whose enclave matches the benchmark package.
func newBenchMarble(b testing.TB, pl *dcaptest.Platform) benchMarble {
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "MarbleRun Marble"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		b.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		b.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		DNSNames: tmpl.DNSNames, IPAddresses: tmpl.IPAddresses,
	}, k)
	if err != nil {
		b.Fatal(err)
	}
	var quote []byte
	if pl != nil {
		e := dcaptest.Enclave{ISVProdID: benchProductID, ISVSVN: benchSVN}
		signer, _ := hex.DecodeString(benchSignerID)
		copy(e.MRSIGNER[:], signer)
		e.MRENCLAVE[0] = 0x42
		sum := sha256.Sum256(der)
		copy(e.ReportData[:], sum[:])
		quote = pl.Quote(b, dcaptest.QuoteOptions{Enclave: e})
	}
	return benchMarble{req: ActivationRequest{
		Quote: quote, CSR: csr, MarbleType: "marble", UUID: uuid.NewString(), Peer: []*x509.Certificate{cert},
	}}
}

// benchIssuer makes the Coordinator non-simulated (it has a quote).
type benchIssuer struct{}

func (benchIssuer) Issue(context.Context, [64]byte) ([]byte, error) {
	return []byte("coordinator quote"), nil
}

// activateEnv is what one activation benchmark runs against.
type activateEnv struct {
	perMarble      bool
	maxActivations uint
	// dcap, when set, makes the Coordinator non-simulated with this
	// verifier, and the Marbles' quotes come from platform.
	dcap     *dcap.Verifier
	platform *dcaptest.Platform
	// stores returns the stores of the sealed state (default: memstore).
	stores func(b *testing.B) (data, key store.Store)
}

// newCore returns a Coordinator with the benchmark manifest set.
func (e activateEnv) newCore(b *testing.B) *Core {
	var data, key store.Store = memstore.New(), memstore.New()
	if e.stores != nil {
		data, key = e.stores(b)
	}
	opts := Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}}
	if e.dcap != nil {
		opts.Issuer, opts.QuoteVerifier = benchIssuer{}, e.dcap
	}
	c, err := New(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.SetManifest(context.Background(), activateManifest(b, e.perMarble, e.maxActivations)); err != nil {
		b.Fatal(err)
	}
	if c.simulation != (e.dcap == nil) {
		b.Fatalf("simulation = %v", c.simulation)
	}
	return c
}

// run activates b.N times, spread over n concurrent Marbles, and reports
// activations/s. Every activation must succeed.
func (e activateEnv) run(b *testing.B, n int) {
	c := e.newCore(b)
	marbles := make([]benchMarble, n)
	for i := range marbles {
		marbles[i] = newBenchMarble(b, e.platform)
	}
	ctx := context.Background()
	// One activation per Marble before the timer: every one is accepted
	// (and the simulation warning is logged once).
	for _, m := range marbles {
		if _, err := c.Activate(ctx, m.req); err != nil {
			b.Fatal(err)
		}
	}
	var (
		next   atomic.Int64
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	b.ReportAllocs()
	b.ResetTimer()
	for _, m := range marbles {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) && failed.Load() == nil {
				if _, err := c.Activate(ctx, m.req); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "activations/s")
}

// dcapEnv returns a synthetic DCAP platform and a verifier with its
// collateral (UpToDate) and the synthetic root as the trust anchor, at the
// PKI's time.
func dcapEnv(b *testing.B) (*dcaptest.Platform, *dcap.Verifier) {
	p := dcaptest.NewPKI(b)
	pl := p.NewPlatform(b, dcaptest.DefaultExtension())
	v := &dcap.Verifier{
		Collateral: collateral.Static{Collateral: pl.Collateral(b, dcaptest.CollateralOptions{})},
		RootCA:     p.Root,
		Now:        func() time.Time { return p.Time },
	}
	return pl, v
}

// BenchmarkActivate: shared secrets only and with per-Marble certificate
// secrets, in simulation and with DCAP quotes verified by the pure-Go
// verifier, for 1, 8 and 32 concurrent Marbles; no MaxActivations (nothing
// is stored).
func BenchmarkActivate(b *testing.B) {
	pl, v := dcapEnv(b)
	for _, mode := range []struct {
		name string
		env  activateEnv
	}{
		{"sim/shared", activateEnv{}},
		{"sim/permarble", activateEnv{perMarble: true}},
		{"dcap/shared", activateEnv{dcap: v, platform: pl}},
		{"dcap/permarble", activateEnv{perMarble: true, dcap: v, platform: pl}},
	} {
		for _, n := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/marbles=%d", mode.name, n), func(b *testing.B) { mode.env.run(b, n) })
		}
	}
}

// BenchmarkActivateCounted: a Marble type with MaxActivations, so that every
// activation commits its count to the sealed state (re-seal, store) before
// it answers; in simulation, shared secrets only, in memory and durably in
// files (fsync).
func BenchmarkActivateCounted(b *testing.B) {
	fileStores := func(b *testing.B) (store.Store, store.Store) {
		dir := b.TempDir()
		data, err := filestore.New(dir, "sealed_data")
		if err != nil {
			b.Fatal(err)
		}
		key, err := filestore.New(dir, "sealed_key")
		if err != nil {
			b.Fatal(err)
		}
		return data, key
	}
	for _, st := range []struct {
		name   string
		stores func(*testing.B) (store.Store, store.Store)
	}{{"memstore", nil}, {"filestore", fileStores}} {
		for _, n := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/marbles=%d", st.name, n), func(b *testing.B) {
				activateEnv{maxActivations: 1 << 40, stores: st.stores}.run(b, n)
			})
		}
	}
}

// TestActivateBenchSetup runs each benchmark configuration's setup and a
// few activations, so that `go test` catches a benchmark that would fail.
func TestActivateBenchSetup(t *testing.T) {
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	v := &dcap.Verifier{
		Collateral: collateral.Static{Collateral: pl.Collateral(t, dcaptest.CollateralOptions{})},
		RootCA:     p.Root,
		Now:        func() time.Time { return p.Time },
	}
	for _, perMarble := range []bool{false, true} {
		for _, d := range []*dcap.Verifier{nil, v} {
			opts := Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}}
			var platform *dcaptest.Platform
			if d != nil {
				opts.Issuer, opts.QuoteVerifier, platform = benchIssuer{}, d, pl
			}
			c, err := New(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.SetManifest(context.Background(), activateManifest(t, perMarble, 3)); err != nil {
				t.Fatal(err)
			}
			m := newBenchMarble(t, platform)
			for i := range 3 {
				act, err := c.Activate(context.Background(), m.req)
				if err != nil {
					t.Fatalf("perMarble %v, dcap %v, activation %d: %v", perMarble, d != nil, i+1, err)
				}
				_, hasMarbleCert := act.Files["/secrets/marble.crt"]
				if len(act.Files["/secrets/shared.crt"]) == 0 || hasMarbleCert != perMarble || len(act.Env[EnvCertificateChain]) == 0 {
					t.Fatalf("perMarble %v: files %v", perMarble, act.Files)
				}
			}
			if _, err := c.Activate(context.Background(), m.req); err == nil {
				t.Fatal("a fourth activation past MaxActivations 3 was accepted")
			}
			if d != nil {
				// Another Marble's quote does not cover this certificate.
				other := newBenchMarble(t, platform)
				req := m.req
				req.Quote = other.req.Quote
				_, err := c.Activate(context.Background(), req)
				var ae *ActivationError
				if !errors.As(err, &ae) || ae.Reason != RefusedQuote {
					t.Fatalf("a quote over another certificate: %v", err)
				}
			}
		}
	}
}
