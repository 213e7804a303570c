package core

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
)

const actSignerID = "2222222222222222222222222222222222222222222222222222222222222222"

// activationManifest has a Marble "backend" (MaxActivations 2, TLS tag,
// files and env from shared and per-Marble secrets) and "frontend"
// (unlimited, a template on a user-defined secret).
func activationManifest(admin faultUser, gates ...string) []byte {
	doc := map[string]any{
		"Packages": map[string]any{"pkg": map[string]any{"SignerID": actSignerID, "ProductID": 3, "SecurityVersion": 2}},
		"Marbles": map[string]any{
			"backend": map[string]any{"Package": "pkg", "MaxActivations": 2, "TLS": []string{"web"},
				"Parameters": map[string]any{
					"Files": map[string]any{"/keys/shared": "{{hex .Secrets.shared.Private}}", "/keys/mine": "{{hex .Secrets.mine.Private}}"},
					"Env":   map[string]any{"CERT": "{{pem .Secrets.percert.Cert}}", "MARBLE_PREDEFINED_ROOT_CA": "overridden?", "LEAF": "{{pem .MarbleRun.MarbleCert.Cert}}", "PREVCERT": "{{pem .Previous.Secrets.percert.Cert}}"},
					"Argv":  []string{"./backend", "--serve"},
				}},
			"frontend": map[string]any{"Package": "pkg",
				"Parameters": map[string]any{"Env": map[string]any{"TOKEN": "{{string .Secrets.token}}"}}},
		},
		"Secrets": map[string]any{
			"shared":  map[string]any{"Type": "symmetric-key", "Size": 128, "Shared": true},
			"mine":    map[string]any{"Type": "symmetric-key", "Size": 256},
			"percert": map[string]any{"Type": "cert-ecdsa", "Size": 256},
			"token":   map[string]any{"Type": "plain", "UserDefined": true},
		},
		"Users": map[string]any{"admin": map[string]any{"Certificate": admin.pem, "Roles": []string{"w"}}},
		"Roles": map[string]any{"w": map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"token"}, "Actions": []string{"WriteSecret", "ReadSecret"}}},
		"TLS": map[string]any{"web": map[string]any{
			"Incoming": []any{map[string]any{"Port": "8443"}, map[string]any{"Port": "9443", "Cert": "percert", "DisableClientAuth": true}},
			"Outgoing": []any{map[string]any{"Addr": "db", "Port": "5432"}},
		}},
		"Config": map[string]any{"FeatureGates": gates},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b
}

// marbleClient is what a Marble brings to an activation: its TLS client
// certificate (self-signed, as the premain makes) and a CSR.
type marbleClient struct {
	cert *x509.Certificate
	csr  []byte
}

func newMarbleClient(t *testing.T) marbleClient {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "MarbleRun Marble"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "MarbleRun Marble", Organization: []string{"ignored"}}, DNSNames: []string{"backend.local"},
		IPAddresses: []net.IP{net.IPv4(10, 0, 0, 7)}}, k)
	if err != nil {
		t.Fatal(err)
	}
	return marbleClient{cert: cert, csr: csr}
}

func (m marbleClient) request(typ, id string, quote []byte) ActivationRequest {
	return ActivationRequest{Quote: quote, CSR: m.csr, MarbleType: typ, UUID: id, Peer: []*x509.Certificate{m.cert}}
}

const (
	uuidA = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
	uuidB = "7ba7b810-9dad-41d1-80b4-00c04fd430c8"
)

func newActivationCore(t *testing.T, s stores, opts Options) *Core {
	t.Helper()
	opts.Data, opts.Key, opts.KeySealer = s.data, s.key, seal.SimulationKeySealer{}
	c, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pemDecode(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("no PEM in %q", b)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestActivateSimulation(t *testing.T) {
	admin := newFaultUser(t, "admin")
	s := newStores()
	c := newActivationCore(t, s, Options{})
	if _, err := c.Activate(context.Background(), newMarbleClient(t).request("backend", uuidA, nil)); !errors.Is(err, ErrWrongState) || err.Error() != "cannot accept marbles in current state" {
		t.Fatalf("activation in state 2: %v", err)
	}
	if _, err := c.SetManifest(context.Background(), activationManifest(admin)); err != nil {
		t.Fatal(err)
	}
	m := newMarbleClient(t)
	act, err := c.Activate(context.Background(), m.request("backend", strings.ToUpper(uuidA), nil))
	if err != nil {
		t.Fatal(err)
	}
	snap := c.snap.Load()
	// The leaf: CN = canonical UUID, marble-type extension, issued by the
	// Marble Root, the Coordinator's key (not the CSR's), CSR SANs.
	chain := act.Env[EnvCertificateChain]
	leaf := pemDecode(t, chain)
	if leaf.Subject.CommonName != uuidA || len(leaf.Subject.Organization) != 0 {
		t.Errorf("leaf subject %v", leaf.Subject)
	}
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "backend.local" || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.IPv4(10, 0, 0, 7)) {
		t.Errorf("leaf SANs %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
	if leaf.IsCA || leaf.KeyUsage != x509.KeyUsageDigitalSignature|x509.KeyUsageKeyAgreement {
		t.Errorf("leaf CA %v key usage %v", leaf.IsCA, leaf.KeyUsage)
	}
	var typ []byte
	for _, e := range leaf.Extensions {
		if e.Id.Equal(ca.OIDMarbleType) {
			typ = e.Value
		}
	}
	if string(typ) != "backend" {
		t.Errorf("marble-type extension %q", typ)
	}
	if err := leaf.CheckSignatureFrom(snap.ca.MarbleRoot); err != nil {
		t.Errorf("leaf not signed by the Marble Root: %v", err)
	}
	if !bytes.Equal(act.Env[EnvRootCA], pemCert(snap.ca.MarbleRoot.Raw)) {
		t.Error("MARBLE_PREDEFINED_ROOT_CA is not the Marble Root (or the manifest's Env overrode it)")
	}
	if inter := pemDecode(t, chain[len(pemCert(leaf.Raw)):]); !inter.Equal(snap.ca.Intermediate) {
		t.Error("the chain's second certificate is not the intermediate")
	}
	if !bytes.Equal(act.Env[EnvCoordinatorRoot], pemCert(snap.ca.Root.Raw)) {
		t.Error("MARBLE_PREDEFINED_COORDINATOR_ROOT_CA")
	}
	blk, _ := pem.Decode(act.Env[EnvPrivateKey])
	key, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil || !key.(*ecdsa.PrivateKey).PublicKey.Equal(leaf.PublicKey) {
		t.Fatalf("private key does not belong to the leaf: %v", err)
	}
	if key.(*ecdsa.PrivateKey).PublicKey.Equal(m.cert.PublicKey) {
		t.Error("the leaf reuses the Marble's key")
	}
	if string(act.Env["LEAF"]) != string(pemCert(leaf.Raw)) {
		t.Error("template .MarbleRun.MarbleCert is not the leaf")
	}
	// Shared secret as stored; per-Marble key derived for this UUID.
	if got, want := string(act.Files["/keys/shared"]), hex.EncodeToString(snap.persisted.Secrets["shared"].Private); got != want {
		t.Errorf("shared secret %s, want %s", got, want)
	}
	mine1 := string(act.Files["/keys/mine"])
	id, _ := parseUUIDForTest(uuidA)
	want, _ := secrets.DerivePerMarble(snap.persisted.RootSecret, "mine", snap.manifest.Secrets["mine"], secrets.Binding{UUID: id, Marble: "backend"})
	if mine1 != hex.EncodeToString(want.Private) {
		t.Error("per-Marble key is not HKDF(root secret, UUID+name, marble)")
	}
	if len(act.Argv) != 2 || act.Argv[0] != "./backend" {
		t.Errorf("argv %v", act.Argv)
	}
	// TTLS: incoming with and without Cert, outgoing.
	var ttls struct {
		TLS struct {
			Incoming map[string]struct {
				CACrt, CliCrt, CliKey string
				ClientAuth            bool `json:"clientAuth"`
			}
			Outgoing map[string]struct{ CACrt, CliCrt, CliKey string }
		} `json:"tls"`
	}
	if err := json.Unmarshal(act.Env[EnvTTLSConfig], &ttls); err != nil {
		t.Fatalf("MARBLE_TTLS_CONFIG: %v", err)
	}
	in, in2, out := ttls.TLS.Incoming["*:8443"], ttls.TLS.Incoming["*:9443"], ttls.TLS.Outgoing["db:5432"]
	if !in.ClientAuth || in.CliCrt != string(pemCert(leaf.Raw)) || in.CACrt != string(act.Env[EnvRootCA]) {
		t.Errorf("incoming 8443: %+v", in)
	}
	if in2.ClientAuth || in2.CliCrt == in.CliCrt || pemDecode(t, []byte(in2.CliCrt)).Subject.CommonName == uuidA {
		t.Errorf("incoming 9443 with Cert: %+v", in2)
	}
	if string(act.Env["PREVCERT"]) != string(act.Env["CERT"]) {
		t.Error("before any update .Previous.Secrets is not .Secrets (per-Marble certificate issued twice)")
	}
	if in2.CliCrt != string(act.Env["CERT"]) {
		t.Error("the TTLS Cert and the template see different per-Marble certificates")
	}
	if out.CliCrt != in.CliCrt {
		t.Errorf("outgoing: %+v", out)
	}

	// Same UUID again: same per-Marble key, new certificate; another UUID:
	// another key. MaxActivations 2 then refuses, also after a restart.
	again, err := c.Activate(context.Background(), m.request("backend", uuidA, nil))
	if err != nil {
		t.Fatal(err)
	}
	if string(again.Files["/keys/mine"]) != mine1 || string(again.Env["CERT"]) == string(act.Env["CERT"]) {
		t.Error("same UUID: per-Marble key changed or per-Marble certificate reused")
	}
	_, err = c.Activate(context.Background(), m.request("backend", uuidB, nil))
	var ae *ActivationError
	if !errors.As(err, &ae) || ae.Reason != RefusedMaxActivations || !errors.Is(err, ErrForbidden) ||
		err.Error() != `marble verification failed: reached max activations count (2) for marble type "backend"` {
		t.Fatalf("third activation: %v", err)
	}
	c2 := newActivationCore(t, s, Options{})
	if _, err := c2.Activate(context.Background(), m.request("backend", uuidB, nil)); !errors.As(err, &ae) || ae.Reason != RefusedMaxActivations {
		t.Fatalf("after a restart: %v", err)
	}
	other, err := c2.Activate(context.Background(), m.request("frontend", uuidB, nil))
	if err == nil || !strings.Contains(err.Error(), "customizing marble parameters") || errors.Is(err, ErrForbidden) {
		t.Fatalf("template on a user-defined secret not uploaded: %v %v", other, err)
	}
	events, dropped := c.ActivationEvents()
	if len(events) != 2 || dropped != 0 || events[0].UUID != uuidA || events[0].MarbleType != "backend" || events[0].Quote != nil {
		t.Errorf("events %+v dropped %d", events, dropped)
	}
}

func parseUUIDForTest(s string) (secrets.UUID, error) {
	b, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	var u secrets.UUID
	copy(u[:], b)
	return u, err
}

func TestActivateRefusals(t *testing.T) {
	admin := newFaultUser(t, "admin")
	s := newStores()
	c := newActivationCore(t, s, Options{})
	if _, err := c.SetManifest(context.Background(), activationManifest(admin)); err != nil {
		t.Fatal(err)
	}
	m := newMarbleClient(t)
	badSig := append([]byte{}, m.csr...)
	badSig[len(badSig)-3] ^= 0xff
	for _, tc := range []struct {
		name   string
		req    ActivationRequest
		class  error
		reason ActivationRefusal
		msg    string
	}{
		{"no client certificate", ActivationRequest{CSR: m.csr, MarbleType: "backend", UUID: uuidA}, ErrUnauthenticated, RefusedNoCertificate, "couldn't get marble TLS certificate"},
		{"unknown marble type", m.request("nope", uuidA, nil), ErrForbidden, RefusedUnknownType, "marble verification failed: unknown marble type requested"},
		{"bad UUID", m.request("backend", "not-a-uuid", nil), ErrInvalidRequest, RefusedUUID, "invalid UUID: "},
		{"garbage CSR", ActivationRequest{CSR: []byte("garbage"), MarbleType: "backend", UUID: uuidA, Peer: m.request("", "", nil).Peer}, nil, RefusedCSR, "generating marble authentication secrets: parsing CSR: "},
		{"CSR with a bad signature", ActivationRequest{CSR: badSig, MarbleType: "backend", UUID: uuidA, Peer: m.request("", "", nil).Peer}, nil, RefusedCSR, "generating marble authentication secrets: "},
	} {
		before := describe(c)
		_, err := c.Activate(context.Background(), tc.req)
		var ae *ActivationError
		if !errors.As(err, &ae) || ae.Reason != tc.reason || !strings.HasPrefix(err.Error(), tc.msg) {
			t.Errorf("%s: %v (reason %v)", tc.name, err, ae)
			continue
		}
		for _, class := range []error{ErrWrongState, ErrUnauthenticated, ErrForbidden, ErrInvalidRequest} {
			if errors.Is(err, class) != (class == tc.class) {
				t.Errorf("%s: class %v is %v", tc.name, class, errors.Is(err, class))
			}
		}
		if describe(c) != before {
			t.Errorf("%s: a refused activation changed the state", tc.name)
		}
	}
	if events, _ := c.ActivationEvents(); len(events) != 0 {
		t.Errorf("refusals recorded as events: %v", events)
	}
}

// fakeIssuer makes the Coordinator non-simulated; fakeVerifier "verifies"
// a quote that is a 384-byte report body.
type fakeIssuer struct{}

func (fakeIssuer) Issue(context.Context, [64]byte) ([]byte, error) {
	return []byte("coordinator quote"), nil
}

type fakeVerifier struct{ status tcbstatus.Status }

func (v fakeVerifier) Verify(_ context.Context, quote []byte) (*dcap.Result, error) {
	if len(quote) != 384 {
		return nil, fmt.Errorf("not a quote (%d bytes)", len(quote))
	}
	res := &dcap.Result{Status: v.status}
	copy(res.Report[:], quote)
	return res, nil
}

// report builds the fake quote: a report body for m's certificate.
func report(m marbleClient, mutate func(b []byte)) []byte {
	b := make([]byte, 384)
	signer, _ := hex.DecodeString(actSignerID)
	copy(b[128:160], signer)
	binary.LittleEndian.PutUint16(b[256:], 3) // ProductID
	binary.LittleEndian.PutUint16(b[258:], 2) // SVN
	sum := sha256.Sum256(m.cert.Raw)
	copy(b[320:], sum[:])
	if mutate != nil {
		mutate(b)
	}
	return b
}

func TestActivateVerifiesQuotes(t *testing.T) {
	admin := newFaultUser(t, "admin")
	m := newMarbleClient(t)
	other := newMarbleClient(t)
	for _, tc := range []struct {
		name   string
		status tcbstatus.Status
		quote  []byte
		want   string // "" = accepted
	}{
		{"good quote", tcbstatus.UpToDate, report(m, nil), ""},
		{"SWHardeningNeeded accepted by default", tcbstatus.SWHardeningNeeded, report(m, nil), ""},
		{"empty quote", tcbstatus.UpToDate, nil, "the quote is empty"},
		{"not a quote", tcbstatus.UpToDate, []byte("junk"), "not a quote"},
		{"quote over another certificate", tcbstatus.UpToDate, report(other, nil), "not bound to the TLS client certificate"},
		{"wrong MRSIGNER", tcbstatus.UpToDate, report(m, func(b []byte) { b[130] ^= 1 }), "MRSIGNER"},
		{"wrong ProductID", tcbstatus.UpToDate, report(m, func(b []byte) { b[256] = 4 }), "ISVPRODID"},
		{"SVN too low", tcbstatus.UpToDate, report(m, func(b []byte) { b[258] = 1 }), "ISVSVN"},
		{"debug enclave", tcbstatus.UpToDate, report(m, func(b []byte) { b[48] |= 0x02 }), "debug"},
		{"OutOfDate not accepted", tcbstatus.OutOfDate, report(m, nil), "TCB status"},
	} {
		s := newStores()
		c := newActivationCore(t, s, Options{Issuer: fakeIssuer{}, QuoteVerifier: fakeVerifier{status: tc.status}})
		if _, err := c.SetManifest(context.Background(), activationManifest(admin)); err != nil {
			t.Fatal(err)
		}
		_, err := c.Activate(context.Background(), m.request("backend", uuidA, tc.quote))
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var ae *ActivationError
		if !errors.As(err, &ae) || ae.Reason != RefusedQuote || !errors.Is(err, ErrForbidden) ||
			!strings.HasPrefix(err.Error(), "marble verification failed: invalid quote: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if c.snap.Load().persisted.Activations["backend"] != 0 {
			t.Errorf("%s: a refused activation was counted", tc.name)
		}
	}
	// Not in simulation and no verifier: refused, saying what to configure.
	c := newActivationCore(t, newStores(), Options{Issuer: fakeIssuer{}})
	if _, err := c.SetManifest(context.Background(), activationManifest(admin)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Activate(context.Background(), m.request("backend", uuidA, report(m, nil))); err == nil || !strings.Contains(err.Error(), "--collateral-file") {
		t.Fatalf("without a verifier: %v", err)
	}
}

func TestActivationEventsBounded(t *testing.T) {
	var l eventLog
	l.limit = 3
	for i := range 5 {
		l.record(ActivationEvent{UUID: fmt.Sprint(i)})
	}
	got, dropped := l.snapshot()
	if dropped != 2 || len(got) != 3 || got[0].UUID != "2" || got[2].UUID != "4" {
		t.Fatalf("events %+v dropped %d", got, dropped)
	}
}

func TestMonotonicCounter(t *testing.T) {
	admin := newFaultUser(t, "admin")
	s := newStores()
	c := newActivationCore(t, s, Options{})
	if _, err := c.SetManifest(context.Background(), activationManifest(admin, "MonotonicCounter")); err != nil {
		t.Fatal(err)
	}
	m := newMarbleClient(t)
	act, err := c.Activate(context.Background(), m.request("backend", uuidA, nil))
	if err != nil {
		t.Fatal(err)
	}
	leaf := pemDecode(t, act.Env[EnvCertificateChain])
	peer := []*x509.Certificate{leaf}
	for _, step := range []struct{ set, want uint64 }{{5, 0}, {3, 5}, {9, 5}, {9, 9}} {
		got, err := c.SetMonotonicCounter(context.Background(), peer, "c", step.set)
		if err != nil || got != step.want {
			t.Fatalf("set %d: %d, %v; want %d", step.set, got, err, step.want)
		}
	}
	if got, _ := c.SetMonotonicCounter(context.Background(), peer, "other", 1); got != 0 {
		t.Errorf("another counter starts at %d", got)
	}
	// Survives a restart.
	c2 := newActivationCore(t, s, Options{})
	if got, err := c2.SetMonotonicCounter(context.Background(), peer, "c", 0); err != nil || got != 9 {
		t.Fatalf("after a restart: %d, %v", got, err)
	}
	// Leaf only (intermediates prove nothing), self-signed certificates, user certificates.
	for name, p := range map[string][]*x509.Certificate{
		"marble leaf second": {m.cert, leaf},
		"self-signed":        {m.cert},
		"user certificate":   {admin.cert},
		"none":               nil,
	} {
		if _, err := c2.SetMonotonicCounter(context.Background(), p, "c", 100); !errors.Is(err, ErrUnauthenticated) || !strings.HasPrefix(err.Error(), "unauthorized marble: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A package update renews the Marble Root: the old certificate stops
	// working.
	if err := c2.updatePackagesForTest(t); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.SetMonotonicCounter(context.Background(), peer, "c", 100); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("a certificate from before the package update: %v", err)
	}
	// Without the gate: 403.
	c3 := newActivationCore(t, newStores(), Options{})
	if _, err := c3.SetManifest(context.Background(), activationManifest(admin)); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.SetMonotonicCounter(context.Background(), peer, "c", 1); !errors.Is(err, ErrForbidden) {
		t.Fatalf("gate off: %v", err)
	}
}

// updatePackagesForTest rotates the CAs as a package update does.
func (c *Core) updatePackagesForTest(t *testing.T) error {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	a, err := s.ca.Rotate(rand.Reader, time.Now())
	if err != nil {
		return err
	}
	next := *s
	next.ca = a
	c.snap.Store(&next)
	return nil
}

// An Incoming TLS entry whose Cert is a user-defined secret not uploaded
// yet is refused (MarbleRun hands out empty PEM blocks).
func TestActivateTTLSNeedsUploadedCert(t *testing.T) {
	admin := newFaultUser(t, "admin")
	doc := map[string]any{}
	if err := json.Unmarshal(activationManifest(admin), &doc); err != nil {
		t.Fatal(err)
	}
	doc["Secrets"].(map[string]any)["usercert"] = map[string]any{"Type": "cert-ecdsa", "Size": 256, "UserDefined": true}
	doc["TLS"].(map[string]any)["web"].(map[string]any)["Incoming"] = []any{map[string]any{"Port": "9443", "Cert": "usercert", "DisableClientAuth": true}}
	raw, _ := json.Marshal(doc)
	c := newActivationCore(t, newStores(), Options{})
	if _, err := c.SetManifest(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	_, err := c.Activate(context.Background(), newMarbleClient(t).request("backend", uuidA, nil))
	var ae *ActivationError
	if !errors.As(err, &ae) || ae.Reason != RefusedTTLS || !strings.Contains(err.Error(), "must be uploaded first") {
		t.Fatalf("TTLS with a certificate not uploaded: %v", err)
	}
	if c.snap.Load().persisted.Activations["backend"] != 0 {
		t.Fatal("the refused activation was counted")
	}
}

// Concurrent activations never pass MaxActivations: the count is checked
// again under the lock before it is committed.
func TestActivateMaxActivationsConcurrent(t *testing.T) {
	admin := newFaultUser(t, "admin")
	c := newActivationCore(t, newStores(), Options{})
	if _, err := c.SetManifest(context.Background(), activationManifest(admin)); err != nil {
		t.Fatal(err)
	}
	m := newMarbleClient(t)
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Activate(context.Background(), m.request("backend", uuidA, nil))
			errs <- err
		}()
	}
	ok := 0
	for range n {
		err := <-errs
		var ae *ActivationError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &ae) && ae.Reason == RefusedMaxActivations:
		default:
			t.Errorf("unexpected refusal: %v", err)
		}
	}
	if ok != 2 || c.snap.Load().persisted.Activations["backend"] != 2 {
		t.Fatalf("%d activations succeeded, %d counted; MaxActivations is 2", ok, c.snap.Load().persisted.Activations["backend"])
	}
}
