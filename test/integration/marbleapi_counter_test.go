package integration

import (
	"crypto/tls"
	"net/http"
	"testing"
)

// postCounter sets a monotonic counter with cert as the client
// certificate and returns the answer.
func (s *marbleSetup) postCounter(t *testing.T, cert *tls.Certificate, name string, value uint64) response {
	t.Helper()
	return do(t, s.c.client(s.root, cert), http.MethodPost, s.c.url("/api/v2/monotonic-counter"),
		map[string]any{"name": name, "value": value})
}

// setCounter sets a counter and returns the previous value.
func (s *marbleSetup) setCounter(t *testing.T, cert *tls.Certificate, name string, value uint64) uint64 {
	t.Helper()
	r := s.postCounter(t, cert, name, value)
	expect(t, r, http.StatusOK, "success")
	var d struct {
		Value *uint64 `json:"value"`
	}
	decode(t, r, &d)
	if d.Value == nil {
		t.Fatalf("no value in %s", r.Raw)
	}
	return *d.Value
}

// TestMarbleAPIMonotonicCounter: a Marble sets its counters with the
// certificate of its activation (MarbleRun's sequence 5 → 0, 3 → 5,
// 9 → 5); they survive SIGKILL and a restart; they are per Marble UUID
// and name; only the leaf identifies the Marble (D14); and after a
// package update (a new Marble Root) the old certificate is refused while
// a new activation of the same UUID sees its counter.
func TestMarbleAPIMonotonicCounter(t *testing.T) {
	s := newMarbleSetup(t, "MonotonicCounter")
	m := newTestMarble(t)
	a := parseActivated(t, m.mustActivate(t, s.c, "backend", marbleUUIDA))

	for _, step := range []struct{ set, prev uint64 }{{5, 0}, {3, 5}, {9, 5}} {
		if got := s.setCounter(t, &a.tls, "c", step.set); got != step.prev {
			t.Fatalf("set %d: previous %d, want %d", step.set, got, step.prev)
		}
	}
	// The chain as MarbleRun's Marbles present it (leaf, intermediate).
	withChain := tls.Certificate{Certificate: [][]byte{a.chain[0].Raw, a.chain[1].Raw}, PrivateKey: a.key}
	if got := s.setCounter(t, &withChain, "other", 1); got != 0 {
		t.Fatalf("another name: previous %d, want 0", got)
	}

	s.c.restart()
	if got := s.setCounter(t, &a.tls, "c", 10); got != 9 {
		t.Fatalf("after SIGKILL and restart: previous %d, want 9", got)
	}
	// Another UUID of the same type has its own counters.
	b := parseActivated(t, m.mustActivate(t, s.c, "backend", marbleUUIDB))
	if got := s.setCounter(t, &b.tls, "c", 1); got != 0 {
		t.Fatalf("another UUID: previous %d, want 0", got)
	}

	// Not a Marble: 401, whatever follows the leaf.
	selfSigned, _ := newUserCert(t, "MarbleRun Marble")
	expect(t, s.postCounter(t, &selfSigned, "c", 100), http.StatusUnauthorized, "fail")
	expect(t, s.postCounter(t, &s.admin, "c", 100), http.StatusUnauthorized, "fail")
	expect(t, s.postCounter(t, nil, "c", 100), http.StatusUnauthorized, "fail")
	second := tls.Certificate{Certificate: [][]byte{selfSigned.Certificate[0], a.leaf.Raw}, PrivateKey: selfSigned.PrivateKey}
	r := s.postCounter(t, &second, "c", 100)
	expect(t, r, http.StatusUnauthorized, "fail")
	if r.Message != "unauthorized marble: x509: certificate signed by unknown authority" {
		t.Fatalf("Marble certificate second in the chain: %q", r.Message)
	}
	// The Marble's own self-signed TLS certificate is no Marble certificate.
	expect(t, s.postCounter(t, &m.cert, "c", 100), http.StatusUnauthorized, "fail")

	// A package update renews the Marble Root: the old certificate stops
	// working, a new activation of the same UUID finds its counter.
	expect(t, do(t, s.adminClient(), http.MethodPost, s.c.url("/api/v2/update"),
		map[string][]byte{"manifest": []byte(`{"Packages":{"pkg":{"SecurityVersion":2}}}`)}), http.StatusOK, "success")
	r = s.postCounter(t, &a.tls, "c", 100)
	expect(t, r, http.StatusUnauthorized, "fail")
	renewed := parseActivated(t, m.mustActivate(t, s.c, "backend", marbleUUIDA))
	if got := s.setCounter(t, &renewed.tls, "c", 11); got != 10 {
		t.Fatalf("after the update: previous %d, want 10", got)
	}
	// None of the refusals changed it.
	if got := s.setCounter(t, &renewed.tls, "c", 0); got != 11 {
		t.Fatalf("previous %d, want 11", got)
	}
}

// TestMarbleAPIMonotonicCounterDisabled: without the feature gate a Marble
// gets 403 fail, as sign-quote's disabled gate.
func TestMarbleAPIMonotonicCounterDisabled(t *testing.T) {
	s := newMarbleSetup(t, "SignQuoteEndpoint")
	a := parseActivated(t, newTestMarble(t).mustActivate(t, s.c, "backend", marbleUUIDA))
	r := s.postCounter(t, &a.tls, "c", 5)
	expect(t, r, http.StatusForbidden, "fail")
	if r.Message != "MonotonicCounter feature is not enabled in the manifest" {
		t.Fatalf("message %q", r.Message)
	}
	// Unauthenticated callers learn nothing about the gate.
	expect(t, s.postCounter(t, &s.admin, "c", 5), http.StatusUnauthorized, "fail")
}

// TestMarbleAPIMonotonicCounterState: before a manifest the endpoint is a
// state conflict (409), and it exists in /api/v2 only.
func TestMarbleAPIMonotonicCounterState(t *testing.T) {
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	expect(t, do(t, hc, http.MethodPost, c.url("/api/v2/monotonic-counter"), `{"name":"c","value":1}`), http.StatusConflict, "fail")
	r := do(t, hc, http.MethodPost, c.url("/monotonic-counter"), `{"name":"c","value":1}`)
	if r.HTTPStatus != http.StatusNotFound {
		t.Fatalf("v1 path: %d %s, want 404", r.HTTPStatus, r.Raw)
	}
	r = do(t, hc, http.MethodGet, c.url("/api/v2/monotonic-counter"), nil)
	if r.HTTPStatus != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d %s, want 405", r.HTTPStatus, r.Raw)
	}
}
