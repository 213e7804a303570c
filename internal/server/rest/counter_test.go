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
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/internal/testpki"
)

// counterSetup is a real core (in memory, simulation) with a manifest
// whose Marble "m" has been activated once: its Marble certificate.
type counterSetup struct {
	h      http.Handler
	c      *core.Core
	marble *x509.Certificate
}

func newCounterSetup(t *testing.T, gates ...string) *counterSetup {
	t.Helper()
	ctx := context.Background()
	c, err := core.New(ctx, core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	s := &counterSetup{h: New(c, Options{MaxManifestBytes: 1 << 20}), c: c}
	g, _ := json.Marshal(gates)
	raw := `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p","Parameters":{"Argv":["./m"]}}},"Config":{"FeatureGates":` + string(g) + `}}`
	if _, err := c.SetManifest(ctx, []byte(raw)); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "marble"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	act, err := c.Activate(ctx, core.ActivationRequest{CSR: csr, MarbleType: "m", UUID: "6ba7b810-9dad-41d1-80b4-00c04fd430c8",
		Peer: []*x509.Certificate{selfSignedCert(t)}})
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(act.Env[core.EnvCertificateChain])
	if s.marble, err = x509.ParseCertificate(blk.Bytes); err != nil {
		t.Fatal(err)
	}
	return s
}

func selfSignedCert(t *testing.T) *x509.Certificate {
	t.Helper()
	return testpki.SelfSigned(t, "6ba7b810-9dad-41d1-80b4-00c04fd430c8", testpki.Serial(7)).Cert
}

// post sends a counter request with the peer chain and returns the status
// and the decoded envelope.
func (s *counterSetup) post(t *testing.T, method, path, body string, peer ...*x509.Certificate) (int, map[string]any) {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.TLS = &tls.ConnectionState{PeerCertificates: peer}
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, r)
	var env map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil {
		t.Fatalf("answer is not JSON: %q", w.Body.String())
	}
	return w.Code, env
}

const counterPath = "/api/v2/monotonic-counter"

func TestMonotonicCounter(t *testing.T) {
	s := newCounterSetup(t, "MonotonicCounter")
	for _, step := range []struct{ set, prev float64 }{{5, 0}, {3, 5}, {9, 5}, {9, 9}} {
		code, env := s.post(t, http.MethodPost, counterPath, `{"name":"c","value":`+jsonNumber(step.set)+`}`, s.marble)
		if code != http.StatusOK || env["status"] != "success" || env["data"].(map[string]any)["value"] != step.prev {
			t.Fatalf("set %v: %d %v, want previous %v", step.set, code, env, step.prev)
		}
	}
	// Counters are per name; the largest uint64 is a value.
	code, env := s.post(t, http.MethodPost, counterPath, `{"name":"other","value":18446744073709551615}`, s.marble)
	if code != http.StatusOK || env["data"].(map[string]any)["value"] != float64(0) {
		t.Fatalf("another counter: %d %v", code, env)
	}
}

func jsonNumber(f float64) string { b, _ := json.Marshal(f); return string(b) }

// TestMonotonicCounterRefusals: every refusal is a JSend fail with its
// status, the state and the certificate checked before the body.
func TestMonotonicCounterRefusals(t *testing.T) {
	on := newCounterSetup(t, "MonotonicCounter")
	off := newCounterSetup(t, "SignQuoteEndpoint")
	fresh, err := core.New(context.Background(), core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	state2 := &counterSetup{h: New(fresh, Options{MaxManifestBytes: 1 << 20})}
	user := selfSignedCert(t)
	for _, tc := range []struct {
		name   string
		s      *counterSetup
		method string
		path   string
		body   string
		peer   []*x509.Certificate
		status int
		msg    string
	}{
		{"state 2, before the body", state2, "POST", counterPath, "{", []*x509.Certificate{on.marble}, 409, "cannot set a monotonic counter in state 2"},
		{"no certificate, before the body", on, "POST", counterPath, "{", nil, 401, "unauthorized marble: no client certificate"},
		{"a user's self-signed certificate", on, "POST", counterPath, `{"name":"c","value":1}`, []*x509.Certificate{user}, 401, "unauthorized marble: x509: certificate signed by unknown authority"},
		{"the Marble's certificate second in the chain (docs/design/decisions.md#d14)", on, "POST", counterPath, `{"name":"c","value":1}`, []*x509.Certificate{user, on.marble}, 401, "unauthorized marble"},
		{"another Coordinator's Marble certificate", on, "POST", counterPath, `{"name":"c","value":1}`, []*x509.Certificate{off.marble}, 401, "unauthorized marble"},
		{"gate off", off, "POST", counterPath, `{"name":"c","value":1}`, []*x509.Certificate{off.marble}, 403, "MonotonicCounter feature is not enabled in the manifest"},
		{"malformed JSON", on, "POST", counterPath, `{"name":`, []*x509.Certificate{on.marble}, 400, "malformed JSON"},
		{"negative value", on, "POST", counterPath, `{"name":"c","value":-1}`, []*x509.Certificate{on.marble}, 400, "malformed JSON"},
		{"value over uint64", on, "POST", counterPath, `{"name":"c","value":18446744073709551616}`, []*x509.Certificate{on.marble}, 400, "malformed JSON"},
		{"empty body", on, "POST", counterPath, ``, []*x509.Certificate{on.marble}, 400, "the body is empty"},
		{"body over 4 KiB", on, "POST", counterPath, `{"name":"` + strings.Repeat("n", 4096) + `","value":1}`, []*x509.Certificate{on.marble}, 413, "the limit is 4096 bytes"},
		{"GET", on, "GET", counterPath, ``, []*x509.Certificate{on.marble}, 405, "method not allowed"},
		{"no v1 path", on, "POST", "/monotonic-counter", `{"name":"c","value":1}`, []*x509.Certificate{on.marble}, 404, "unknown path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, env := tc.s.post(t, tc.method, tc.path, tc.body, tc.peer...)
			status := "fail"
			if tc.path == "/monotonic-counter" {
				status = "error" // v1 never fails
			}
			msg, _ := env["message"].(string)
			if msg == "" {
				msg, _ = env["Message"].(string)
			}
			if st, _ := env["status"].(string); st == "" {
				env["status"] = env["Status"]
			}
			if code != tc.status || env["status"] != status || !strings.Contains(msg, tc.msg) {
				t.Fatalf("answer %d %v; want %d %s with %q", code, env, tc.status, status, tc.msg)
			}
		})
	}
	// None of the refusals set a counter.
	code, env := on.post(t, http.MethodPost, counterPath, `{"name":"c","value":0}`, on.marble)
	if code != http.StatusOK || env["data"].(map[string]any)["value"] != float64(0) {
		t.Fatalf("after the refusals: %d %v", code, env)
	}
}
