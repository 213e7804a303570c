package rest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/internal/testpki"
)

// answerWatch is a ResponseWriter that records when the answer's header
// was written.
type answerWatch struct {
	*httptest.ResponseRecorder
	answered atomic.Bool
}

func (w *answerWatch) WriteHeader(code int) {
	w.answered.Store(true)
	w.ResponseRecorder.WriteHeader(code)
}

func (w *answerWatch) Write(b []byte) (int, error) {
	w.answered.Store(true)
	return w.ResponseRecorder.Write(b)
}

// readRecorder is a request body that counts the bytes the Coordinator
// read from it before it wrote its answer (afterwards the unread rest is
// drained, which is not a read by the endpoint).
type readRecorder struct {
	r      io.Reader
	w      *answerWatch
	before atomic.Int64
}

func (b *readRecorder) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if !b.w.answered.Load() {
		b.before.Add(int64(n))
	}
	return n, err
}

func (b *readRecorder) Close() error { return nil }

// refusingVerifier refuses every quote.
type refusingVerifier struct{}

func (refusingVerifier) Verify(context.Context, []byte) (*dcap.Result, error) {
	return nil, errors.New("not a quote")
}

// checkCallers are the client certificates a request is sent with (the
// Marble's is each running core's own).
type checkCallers struct {
	user, stranger *x509.Certificate
}

func newCheckCallers(t *testing.T) *checkCallers {
	t.Helper()
	user := testpki.SelfSigned(t, "alice", testpki.Serial(11)).Cert
	return &checkCallers{user: user, stranger: selfSignedCert(t)}
}

// checkManifest has the user alice (secrets and manifest updates), a
// Marble m, and the feature gates given.
func checkManifest(user *x509.Certificate, gates ...string) []byte {
	userPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: user.Raw}))
	g, _ := json.Marshal(gates)
	m := map[string]any{
		"Packages": map[string]any{"p": map[string]any{"Debug": true}},
		"Marbles":  map[string]any{"m": map[string]any{"Package": "p", "Parameters": map[string]any{"Argv": []string{"./m"}}}},
		"Secrets":  map[string]any{"usersecret": map[string]any{"Type": "symmetric-key", "Size": 128, "UserDefined": true}},
		"Users":    map[string]any{"alice": map[string]any{"Certificate": userPEM, "Roles": []string{"admin", "writer"}}},
		"Roles": map[string]any{
			"admin":  map[string]any{"ResourceType": "Manifest", "Actions": []string{"UpdateManifest"}},
			"writer": map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"usersecret"}, "Actions": []string{"WriteSecret", "ReadSecret"}},
		},
		"Config": map[string]any{"FeatureGates": json.RawMessage(g)},
	}
	raw, _ := json.Marshal(m)
	return raw
}

// checkCore is a real core in one state.
type checkCore struct {
	name     string
	c        *core.Core
	state    core.State
	features bool              // SignQuoteEndpoint and MonotonicCounter are on
	enclave  bool              // its key sealer protects the key
	marble   *x509.Certificate // of an activated Marble (running cores)
}

// enclaveSealer seals as in simulation but does not say that it leaves
// the key unprotected, so the core applies an enclave's rules.
type enclaveSealer struct{ seal.KeySealer }

// checkCores returns cores in recovery mode (also in an enclave),
// accepting a manifest, running with the features on (and a quote
// verifier), and running with them off.
func checkCores(t *testing.T, who *checkCallers) []checkCore {
	t.Helper()
	ctx := context.Background()
	var sealer seal.KeySealer = seal.SimulationKeySealer{}
	newCore := func(data, key *memstore.Store) *core.Core {
		c, err := core.New(ctx, core.Options{Data: data, Key: key, KeySealer: sealer, QuoteVerifier: refusingVerifier{}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	running := func(gates ...string) *core.Core {
		c := newCore(memstore.New(), memstore.New())
		if _, err := c.SetManifest(ctx, checkManifest(who.user, gates...)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	on := running("SignQuoteEndpoint", "MonotonicCounter")
	off := running()
	// Recovery mode: the sealed state of a running core without its key.
	recovering := func() *core.Core {
		data := memstore.New()
		rc := newCore(data, memstore.New())
		if _, err := rc.SetManifest(ctx, checkManifest(who.user)); err != nil {
			t.Fatal(err)
		}
		return newCore(data, memstore.New())
	}
	cores := []checkCore{
		{name: "recovery", c: recovering(), state: core.StateRecovery},
		{name: "accepting manifest", c: newCore(memstore.New(), memstore.New()), state: core.StateAcceptingManifest},
		{name: "running, features on", c: on, state: core.StateAcceptingMarbles, features: true, marble: activatedMarble(t, on)},
		{name: "running, features off", c: off, state: core.StateAcceptingMarbles, marble: activatedMarble(t, off)},
	}
	sealer = enclaveSealer{seal.SimulationKeySealer{}}
	cores = append(cores, checkCore{name: "recovery in an enclave", c: recovering(), state: core.StateRecovery, enclave: true})
	for _, cc := range cores {
		if got := cc.c.Status(); got != cc.state {
			t.Fatalf("%s: state %d, want %d", cc.name, got, cc.state)
		}
	}
	return cores
}

// activatedMarble activates Marble m on c and returns its certificate.
func activatedMarble(t *testing.T, c *core.Core) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "marble"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	act, err := c.Activate(context.Background(), core.ActivationRequest{CSR: csr, MarbleType: "m",
		UUID: "6ba7b810-9dad-41d1-80b4-00c04fd430c8", Peer: []*x509.Certificate{selfSignedCert(t)}})
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(act.Env[core.EnvCertificateChain])
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestNoBodyReadBeforeTheChecks sends a body to every route of both
// generations, in every state, without a certificate, with a stranger's,
// a user's and a Marble's, and with the v1 recover on and off
// (docs/design/decisions.md#d16): wherever the state, the feature or the caller is wrong the answer
// is an error and not one byte of the body was read before it. A route
// may read only where the table below says so (a new route that reads a
// body fails here until it is added); where it may, it must read (the
// recorder works).
func TestNoBodyReadBeforeTheChecks(t *testing.T) {
	who := newCheckCallers(t)
	cores := checkCores(t, who)
	user := func(cc checkCore, caller string) bool {
		return cc.state == core.StateAcceptingMarbles && caller == "user"
	}
	mayRead := map[string]func(cc checkCore, caller string, v1Recover bool) bool{
		"POST /api/v2/manifest": func(cc checkCore, _ string, _ bool) bool {
			return cc.state == core.StateRecovery || cc.state == core.StateAcceptingManifest
		},
		"POST /api/v2/recover": func(cc checkCore, _ string, _ bool) bool { return cc.state == core.StateRecovery },
		"POST /recover": func(cc checkCore, _ string, on bool) bool {
			return on && cc.state == core.StateRecovery && !cc.enclave
		},
		"POST /api/v2/secrets":         func(cc checkCore, caller string, _ bool) bool { return user(cc, caller) },
		"POST /api/v2/update":          func(cc checkCore, caller string, _ bool) bool { return user(cc, caller) },
		"POST /api/v2/update-manifest": func(cc checkCore, caller string, _ bool) bool { return user(cc, caller) },
		"POST /api/v2/sign-quote": func(cc checkCore, _ string, _ bool) bool {
			return cc.state == core.StateAcceptingMarbles && cc.features
		},
		"POST /api/v2/monotonic-counter": func(cc checkCore, caller string, _ bool) bool {
			return cc.state == core.StateAcceptingMarbles && cc.features && caller == "marble"
		},
	}
	for _, p := range []string{"manifest", "secrets", "update", "update-manifest"} {
		mayRead["POST /"+p] = mayRead["POST /api/v2/"+p]
	}
	callers := map[string][]*x509.Certificate{
		"none": nil, "stranger": {who.stranger}, "user": {who.user}, "marble": nil,
		// A user's certificate behind a stranger's leaf: only the leaf identifies the caller.
		"stranger before user": {who.stranger, who.user},
	}
	body := `{"manifest":"e30=","recoverySecret":"AAAA","secrets":{},"sgxQuote":"AAAA","name":"c","value":1}`
	for _, v1Recover := range []bool{false, true} {
		for _, cc := range cores {
			h, srv := newServer(cc.c, Options{MaxManifestBytes: 1 << 20, EnableV1Recover: v1Recover})
			for _, rt := range srv.allRoutes() {
				for caller, peer := range callers {
					if caller == "marble" {
						if cc.marble == nil {
							continue
						}
						peer = []*x509.Certificate{cc.marble}
					}
					key := rt.method + " " + rt.path
					name := fmt.Sprintf("v1recover=%v/%s/%s/%s", v1Recover, cc.name, caller, key)
					may := mayRead[key] != nil && mayRead[key](cc, caller, v1Recover)
					w := &answerWatch{ResponseRecorder: httptest.NewRecorder()}
					rec := &readRecorder{r: strings.NewReader(body + strings.Repeat(" ", 4096)), w: w}
					r := httptest.NewRequest(rt.method, rt.path, nil)
					r.Body, r.ContentLength = rec, int64(len(body)+4096)
					if strings.HasSuffix(rt.path, "/secrets") && rt.method == http.MethodGet {
						r.URL.RawQuery = "s=usersecret"
					}
					r.TLS = &tls.ConnectionState{PeerCertificates: peer}
					h.ServeHTTP(w, r)
					read := rec.before.Load()
					switch {
					case !may && read != 0:
						t.Errorf("%s: %d bytes of the body read before the answer %d %s", name, read, w.Code, w.Body.String())
					case !may && w.Code < 400 && rt.method == http.MethodPost:
						t.Errorf("%s: answered %d although it may not read the body", name, w.Code)
					case may && read == 0:
						t.Errorf("%s: allowed, but the body was not read (answer %d %s)", name, w.Code, w.Body.String())
					}
				}
			}
		}
	}
	// Every route the table names exists.
	_, srv := newServer(cores[0].c, Options{MaxManifestBytes: 1 << 20})
	known := map[string]bool{}
	for _, rt := range srv.allRoutes() {
		known[rt.method+" "+rt.path] = true
	}
	for key := range mayRead {
		if !known[key] {
			t.Errorf("the table names %s, which is no route", key)
		}
	}
}
