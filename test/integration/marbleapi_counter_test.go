package integration

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// postCounter sets a monotonic counter with cert as the client
// certificate and returns the answer.
func (s *marbleSetup) postCounter(t *testing.T, cert *tls.Certificate, name string, value uint64) response {
	t.Helper()
	// A client per call: its connection is closed after the answer, so
	// that many calls do not hold many idle connections from one address
	// (the Client API bounds those per source: docs/http.md).
	hc := s.c.client(s.root, cert)
	defer hc.CloseIdleConnections()
	return do(t, hc, http.MethodPost, s.c.url("/api/v2/monotonic-counter"),
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
// and name; only the leaf identifies the Marble (docs/design/decisions.md#d14); and after a
// package update (a new Marble Root) the old certificate is refused while
// a new activation of the same UUID sees its counter.
func TestMarbleAPIMonotonicCounter(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// expectCounterRefused checks a refused counter: the status, JSend fail,
// and a message that says each of words.
func expectCounterRefused(t *testing.T, r response, status int, words ...string) {
	t.Helper()
	expect(t, r, status, "fail")
	for _, w := range words {
		if !strings.Contains(r.Message, w) {
			t.Errorf("message %q does not say %q", r.Message, w)
		}
	}
}

// TestMarbleAPIMonotonicCounterLimits: the configured limits refuse new
// counters with a JSend fail naming the limit and its setting — a name too
// long (400), too many counters of one Marble, keyed by type and UUID
// (403), too many in all (403) — while existing counters can still be
// raised, also after a restart; a refusal stores nothing.
func TestMarbleAPIMonotonicCounterLimits(t *testing.T) {
	t.Parallel()
	s := newMarbleSetupEnv(t, []string{"QUARRY_MAX_COUNTERS_PER_MARBLE=3", "QUARRY_MAX_COUNTER_NAME=16", "QUARRY_MAX_COUNTERS=5"}, "MonotonicCounter")
	m := newTestMarble(t)
	a := parseActivated(t, m.mustActivate(t, s.c, "backend", marbleUUIDA))
	b := parseActivated(t, m.mustActivate(t, s.c, "backend", marbleUUIDB))

	expectCounterRefused(t, s.postCounter(t, &a.tls, strings.Repeat("n", 17), 1), http.StatusBadRequest,
		"17 bytes", "at most 16", "--max-counter-name", "QUARRY_MAX_COUNTER_NAME")
	s.setCounter(t, &a.tls, strings.Repeat("n", 16), 1)
	s.setCounter(t, &a.tls, "b", 1)
	s.setCounter(t, &a.tls, "c", 1)
	expectCounterRefused(t, s.postCounter(t, &a.tls, "d", 1), http.StatusForbidden,
		"has 3 monotonic counters", marbleUUIDA, "--max-counters-per-marble", "QUARRY_MAX_COUNTERS_PER_MARBLE")
	if got := s.setCounter(t, &a.tls, "c", 7); got != 1 {
		t.Fatalf("raising an existing counter at the limit: previous %d, want 1", got)
	}
	// Another UUID has its own counters, up to the total of 5.
	s.setCounter(t, &b.tls, "a", 1)
	s.setCounter(t, &b.tls, "b", 1)
	expectCounterRefused(t, s.postCounter(t, &b.tls, "c", 1), http.StatusForbidden,
		"holds 5 monotonic counters", "--max-counters", "QUARRY_MAX_COUNTERS")

	s.c.restart()
	if got := s.setCounter(t, &a.tls, "c", 8); got != 7 {
		t.Fatalf("after a restart: previous %d, want 7", got)
	}
	expectCounterRefused(t, s.postCounter(t, &b.tls, "c", 1), http.StatusForbidden, "QUARRY_MAX_COUNTERS")
	// None of the refused counters exists: setting them to 0 answers 0
	// (a refused one would have been 1).
	for _, tc := range []struct {
		cert *activated
		name string
	}{{&a, "d"}, {&b, "c"}} {
		if got := s.setCounter(t, &tc.cert.tls, tc.name, 0); got != 0 {
			t.Fatalf("refused counter %q is %d", tc.name, got)
		}
	}
}

// TestMarbleAPIMonotonicCounterDefaultLimits: without settings, the
// names of about 4 KB that once let a Marble grow the sealed state past
// etcd's request limit are refused, and so is a Marble's 65th counter;
// the admin's requests still work after it.
func TestMarbleAPIMonotonicCounterDefaultLimits(t *testing.T) {
	t.Parallel()
	s := newMarbleSetup(t, "MonotonicCounter")
	a := parseActivated(t, newTestMarble(t).mustActivate(t, s.c, "backend", marbleUUIDA))
	expectCounterRefused(t, s.postCounter(t, &a.tls, strings.Repeat("x", 4000), 1), http.StatusBadRequest,
		"4000 bytes", "at most 128", "QUARRY_MAX_COUNTER_NAME")
	for i := range 64 {
		s.setCounter(t, &a.tls, fmt.Sprintf("%0128d", i), 1)
	}
	expectCounterRefused(t, s.postCounter(t, &a.tls, "one more", 1), http.StatusForbidden,
		"has 64 monotonic counters", "QUARRY_MAX_COUNTERS_PER_MARBLE")
	expect(t, do(t, s.adminClient(), http.MethodPost, s.c.url("/api/v2/secrets"),
		map[string]any{"secrets": map[string]any{"token": map[string]any{"key": []byte("t")}}}), http.StatusOK, "success")
}
