package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/quarry-cc/quarry/internal/core"
)

// fakeCoordinator is a Coordinator, StateChecker and EventSource with set
// answers.
type fakeCoordinator struct {
	state            core.State
	pending          *core.PendingUpdate
	accepted, needed int
	sealed           int64
	storeErr         error
	events           []core.ActivationEvent
	dropped          uint64
}

func (f *fakeCoordinator) Status() core.State { return f.state }
func (f *fakeCoordinator) PendingUpdate(context.Context) (core.PendingUpdate, error) {
	if f.pending == nil {
		return core.PendingUpdate{}, core.ErrNotFound
	}
	return *f.pending, nil
}
func (f *fakeCoordinator) RecoverySharesAccepted() (int, int) { return f.accepted, f.needed }
func (f *fakeCoordinator) SealedStateSize() int64             { return f.sealed }
func (f *fakeCoordinator) CheckStore(context.Context) error   { return f.storeErr }
func (f *fakeCoordinator) ActivationEvents() ([]core.ActivationEvent, uint64) {
	return f.events, f.dropped
}

// gather returns the value of the series of name with exactly labels (name
// → value); ok false when absent.
func gather(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			return valueOf(m), true
		}
	}
	return 0, false
}

func valueOf(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return m.GetUntyped().GetValue()
}

func expectValue(t *testing.T, reg *prometheus.Registry, want float64, name string, labels map[string]string) {
	t.Helper()
	got, ok := gather(t, reg, name, labels)
	if !ok {
		t.Errorf("%s%v missing", name, labels)
	} else if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

func TestGaugesReadTheCoordinator(t *testing.T) {
	f := &fakeCoordinator{state: core.StateAcceptingMarbles, sealed: 1234}
	next := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	var haveCollateral bool
	m := New(f, Options{Version: "v1.2.3", Commit: "abc", SkipProcessCollectors: true,
		CollateralNextUpdate: func() (time.Time, bool) { return next, haveCollateral }})
	reg := m.Registry()
	expectValue(t, reg, 3, "coordinator_state", nil)
	expectValue(t, reg, 0, "coordinator_version_info", map[string]string{"version": "v1.2.3", "commit": "abc"})
	expectValue(t, reg, 1234, "quarry_sealed_state_bytes", nil)
	expectValue(t, reg, 0, "quarry_update_pending", nil)
	expectValue(t, reg, 0, "quarry_update_missing_acknowledgements", nil)
	expectValue(t, reg, 0, "quarry_recovery_shares_accepted", nil)
	if _, ok := gather(t, reg, "quarry_collateral_next_update_timestamp_seconds", nil); ok {
		t.Error("collateral timestamp exported while none is cached")
	}
	if _, ok := gather(t, reg, "go_goroutines", nil); ok {
		t.Error("Go collector registered although skipped")
	}

	f.state = core.StateRecovery
	f.pending = &core.PendingUpdate{MissingAcknowledgments: 2}
	f.accepted, f.needed = 1, 3
	haveCollateral = true
	expectValue(t, reg, 1, "coordinator_state", nil)
	expectValue(t, reg, 1, "quarry_update_pending", nil)
	expectValue(t, reg, 2, "quarry_update_missing_acknowledgements", nil)
	expectValue(t, reg, 1, "quarry_recovery_shares_accepted", nil)
	expectValue(t, reg, float64(next.Unix()), "quarry_collateral_next_update_timestamp_seconds", nil)

	m.OnCommit(core.CommitResult{Duration: 3 * time.Millisecond, SealedBytes: 10})
	m.OnCommit(core.CommitResult{Duration: time.Millisecond, Err: errors.New("disk full")})
	m.OnCommit(core.CommitResult{Duration: time.Millisecond})
	expectValue(t, reg, 2, "quarry_state_commits_total", map[string]string{"result": "success"})
	expectValue(t, reg, 1, "quarry_state_commits_total", map[string]string{"result": "failure"})
	expectValue(t, reg, 3, "quarry_state_commit_duration_seconds", nil)

	// Two Metrics do not share a registry (no global state).
	other := New(f, Options{SkipProcessCollectors: true})
	expectValue(t, other.Registry(), 0, "quarry_state_commits_total", map[string]string{"result": "success"})
}

func TestActivationLabels(t *testing.T) {
	const id = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
	attempts := []core.ActivationAttempt{
		{MarbleType: "backend", UUID: id, KnownType: true},
		{MarbleType: "backend", UUID: strings.ToUpper(id), KnownType: true, Refused: core.RefusedQuote},
		{MarbleType: "evil\nrandom", UUID: "garbage", Refused: core.RefusedUnknownType},
		{MarbleType: "backend", UUID: id, Refused: core.RefusedState}, // before a manifest
	}
	t.Run("without uuid", func(t *testing.T) {
		m := New(&fakeCoordinator{}, Options{SkipProcessCollectors: true})
		for _, a := range attempts {
			m.OnActivation(a)
		}
		reg := m.Registry()
		expectValue(t, reg, 2, "coordinator_marble_activations_total", map[string]string{"type": "backend"})
		expectValue(t, reg, 2, "coordinator_marble_activations_total", map[string]string{"type": UnknownMarbleType})
		expectValue(t, reg, 1, "coordinator_marble_activations_success_total", map[string]string{"type": "backend"})
		expectValue(t, reg, 1, "quarry_activation_failures_total", map[string]string{"type": "backend", "reason": "quote"})
		expectValue(t, reg, 1, "quarry_activation_failures_total", map[string]string{"type": UnknownMarbleType, "reason": "unknown_marble_type"})
		expectValue(t, reg, 1, "quarry_activation_failures_total", map[string]string{"type": UnknownMarbleType, "reason": "state"})
	})
	t.Run("with uuid", func(t *testing.T) {
		m := New(&fakeCoordinator{}, Options{SkipProcessCollectors: true, MarbleUUIDLabel: true})
		for _, a := range attempts {
			m.OnActivation(a)
		}
		reg := m.Registry()
		// The upper-case spelling is the same instance.
		expectValue(t, reg, 2, "coordinator_marble_activations_total", map[string]string{"type": "backend", "uuid": id})
		expectValue(t, reg, 1, "coordinator_marble_activations_success_total", map[string]string{"type": "backend", "uuid": id})
		expectValue(t, reg, 1, "coordinator_marble_activations_total", map[string]string{"type": UnknownMarbleType, "uuid": InvalidUUID})
		expectValue(t, reg, 1, "coordinator_marble_activations_total", map[string]string{"type": UnknownMarbleType, "uuid": id})
	})
}

func TestMethodLabelIsBounded(t *testing.T) {
	r := newRequestMetrics()
	for _, m := range []string{"GET", "POST", "BREW", "get", strings.Repeat("X", 1000)} {
		r.Started("/p")
		r.Finished("/p", m, http.StatusOK, 10, 20, time.Millisecond)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(r)
	expectValue(t, reg, 1, "server_client_api_http_request_total", map[string]string{"path": "/p", "code": "200", "method": "get"})
	expectValue(t, reg, 1, "server_client_api_http_request_total", map[string]string{"path": "/p", "code": "200", "method": "post"})
	expectValue(t, reg, 3, "server_client_api_http_request_total", map[string]string{"path": "/p", "code": "200", "method": "other"})
	expectValue(t, reg, 0, "server_client_api_http_in_flight_requests", map[string]string{"path": "/p"})
	expectValue(t, reg, 5, "server_client_api_http_response_size_histogram_bytes", map[string]string{"path": "/p"})
}

func TestProbe(t *testing.T) {
	storeErr := errors.New("disk gone")
	for _, tc := range []struct {
		name       string
		state      core.State
		inRecovery bool
		storeErr   error
		extraErr   error
		ready      bool
		reason     string
	}{
		{"starting", core.StateUninitialized, false, nil, nil, false, "state 0"},
		{"recovery", core.StateRecovery, false, nil, nil, false, "recovery mode"},
		{"recovery when configured", core.StateRecovery, true, nil, nil, true, ""},
		{"waiting for a manifest", core.StateAcceptingManifest, false, nil, nil, true, ""},
		{"running", core.StateAcceptingMarbles, false, nil, nil, true, ""},
		{"store fails", core.StateAcceptingMarbles, false, storeErr, nil, false, "cannot be read back"},
		{"store fails in recovery when configured", core.StateRecovery, true, storeErr, nil, false, "cannot be read back"},
		{"extra check fails", core.StateAcceptingManifest, false, nil, storeErr, false, "cannot be read back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeCoordinator{state: tc.state, storeErr: tc.storeErr}
			p := NewProbe(f, tc.inRecovery, func(context.Context) error { return tc.extraErr })
			st, err := p.Ready(context.Background())
			if st != tc.state {
				t.Errorf("state %d, want %d", st, tc.state)
			}
			if tc.ready {
				if err != nil {
					t.Fatalf("not ready: %v", err)
				}
				return
			}
			var nr *NotReadyError
			if !errors.As(err, &nr) || !strings.Contains(nr.NotReadyReason(), tc.reason) {
				t.Fatalf("err = %v, want a NotReadyError with %q", err, tc.reason)
			}
			if tc.storeErr != nil && !errors.Is(err, storeErr) {
				t.Errorf("the cause is lost: %v", err)
			}
			if strings.Contains(nr.NotReadyReason(), "disk gone") {
				t.Errorf("the shown reason carries the cause: %q", nr.NotReadyReason())
			}
		})
	}
}

func TestHandler(t *testing.T) {
	quote := []byte{1, 2, 3}
	when := time.Date(2025, 5, 6, 7, 8, 9, 123456789, time.UTC)
	f := &fakeCoordinator{state: core.StateAcceptingMarbles, dropped: 7, events: []core.ActivationEvent{
		{Time: when, MarbleType: "a", UUID: "u1", Quote: quote},
		{Time: when, MarbleType: "b", UUID: "u2"},
	}}
	m := New(f, Options{SkipProcessCollectors: true})
	h := Handler(m.Registry(), f, NewProbe(f, false), nil)
	get := func(method, path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
		return w
	}
	if w := get("GET", "/metrics"); w.Code != 200 || !strings.Contains(w.Body.String(), "coordinator_state 3") {
		t.Errorf("/metrics: %d %s", w.Code, w.Body)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if w := get("GET", p); w.Code != 200 {
			t.Errorf("%s: %d %s", p, w.Code, w.Body)
		}
	}
	f.storeErr = errors.New("gone")
	if w := get("GET", "/readyz"); w.Code != 503 || !strings.Contains(w.Body.String(), "cannot be read back") || strings.Contains(w.Body.String(), "gone") {
		t.Errorf("/readyz with a failing store: %d %s", w.Code, w.Body)
	}
	if w := get("GET", "/healthz"); w.Code != 200 {
		t.Errorf("/healthz with a failing store: %d", w.Code)
	}
	for _, r := range [][2]string{{"GET", "/"}, {"GET", "/metrics/x"}, {"POST", "/metrics"}, {"PUT", "/events"}, {"GET", "/api/v2/status"}, {"BREW", "/healthz"}} {
		if w := get(r[0], r[1]); w.Code != 404 {
			t.Errorf("%s %s: %d, want 404", r[0], r[1], w.Code)
		}
	}

	w := get("GET", "/events")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" || w.Header().Get(DroppedEventsHeader) != "7" {
		t.Fatalf("/events: %d %v", w.Code, w.Header())
	}
	var got []map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"time": "2025-05-06T07:08:09.123456789Z", "activation": map[string]any{"marbleType": "a", "uuid": "u1", "quote": "AQID"}},
		{"time": "2025-05-06T07:08:09.123456789Z", "activation": map[string]any{"marbleType": "b", "uuid": "u2", "quote": nil}},
	}
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("/events = %s, want %s", gotJSON, wantJSON)
	}
	f.events = nil
	if w := get("GET", "/events"); strings.TrimSpace(w.Body.String()) != "[]" {
		t.Errorf("no events: %s, want []", w.Body)
	}
}

// TestEtcdMetrics: with store etcd, each endpoint's database size, the
// part in use and the quota are asked at scrape time; an endpoint that
// does not answer is up 0 without sizes; a quota the member does not
// report is absent; compactions are counted. Without etcd none exist.
func TestEtcdMetrics(t *testing.T) {
	members := []EtcdMember{
		{Endpoint: "http://a:2379", OK: true, DBSize: 5000, DBSizeInUse: 3000, Quota: 2 << 30},
		{Endpoint: "http://b:2379"},
		{Endpoint: "http://c:2379", OK: true, DBSize: 7000, DBSizeInUse: 7000},
	}
	m := New(&fakeCoordinator{}, Options{SkipProcessCollectors: true, EtcdStatus: func(ctx context.Context) []EtcdMember {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the status request has no deadline")
		}
		return members
	}})
	reg := m.Registry()
	a, b, c := map[string]string{"endpoint": "http://a:2379"}, map[string]string{"endpoint": "http://b:2379"}, map[string]string{"endpoint": "http://c:2379"}
	expectValue(t, reg, 1, "quarry_etcd_up", a)
	expectValue(t, reg, 5000, "quarry_etcd_db_size_bytes", a)
	expectValue(t, reg, 3000, "quarry_etcd_db_size_in_use_bytes", a)
	expectValue(t, reg, 2<<30, "quarry_etcd_db_quota_bytes", a)
	expectValue(t, reg, 0, "quarry_etcd_up", b)
	if _, ok := gather(t, reg, "quarry_etcd_db_size_bytes", b); ok {
		t.Error("a size for an endpoint that did not answer")
	}
	expectValue(t, reg, 7000, "quarry_etcd_db_size_bytes", c)
	if _, ok := gather(t, reg, "quarry_etcd_db_quota_bytes", c); ok {
		t.Error("a quota for a member that reports none")
	}
	expectValue(t, reg, 0, "quarry_etcd_compactions_total", map[string]string{"result": "failure"})
	m.OnCompaction(nil)
	m.OnCompaction(errors.New("etcd away"))
	m.OnCompaction(nil)
	expectValue(t, reg, 2, "quarry_etcd_compactions_total", map[string]string{"result": "success"})
	expectValue(t, reg, 1, "quarry_etcd_compactions_total", map[string]string{"result": "failure"})

	plain := New(&fakeCoordinator{}, Options{SkipProcessCollectors: true})
	for _, name := range []string{"quarry_etcd_up", "quarry_etcd_compactions_total"} {
		if _, ok := gather(t, plain.Registry(), name, nil); ok {
			t.Errorf("%s without etcd", name)
		}
	}
}
