package rest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/metrics"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// recordedRequest is one Finished call.
type recordedRequest struct {
	route, method string
	code          int
	reqBytes      int64
	respBytes     int64
}

// requestRecorder is a RequestMetrics that keeps every call.
type requestRecorder struct {
	mu       sync.Mutex
	started  []string
	finished []recordedRequest
}

func (r *requestRecorder) Started(route string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started = append(r.started, route)
}

func (r *requestRecorder) Finished(route, method string, code int, reqBytes, respBytes int64, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finished = append(r.finished, recordedRequest{route, method, code, reqBytes, respBytes})
}

// fixedReadiness answers Ready with err.
type fixedReadiness struct{ err error }

func (f fixedReadiness) Ready(context.Context) (core.State, error) {
	return core.StateAcceptingManifest, f.err
}

func newMetricsTestCore(t testing.TB) *core.Core {
	t.Helper()
	c, err := core.New(context.Background(), core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRequestMetricsRoutes(t *testing.T) {
	rec := &requestRecorder{}
	ready := &fixedReadiness{}
	h := New(newMetricsTestCore(t), Options{Metrics: rec, Readiness: ready})
	for _, tc := range []struct {
		method, target string
		route          string
		code           int
	}{
		{"GET", "/api/v2/status", "/api/v2/status", 200},
		{"GET", "/status", "/status", 200},
		{"GET", "/api/v2/healthz", "/api/v2/healthz", 200},
		{"GET", "/api/v2/readyz", "/api/v2/readyz", 200},
		{"DELETE", "/api/v2/manifest", "/api/v2/manifest", 405},
		{"GET", "/api/v2/st%61tus", "/api/v2/status", 200},
		{"GET", "/api/v2%2Fstatus", UnknownRoute, 404},
		{"GET", "/no/such/path", UnknownRoute, 404},
		{"GET", "/api/v2/status/../status", UnknownRoute, 404},
		{"BREW", "/" + strings.Repeat("x", 300), UnknownRoute, 404},
	} {
		rec.started, rec.finished = nil, nil
		w := httptest.NewRecorder()
		r := httptest.NewRequest(tc.method, "http://coordinator"+tc.target, nil)
		h.ServeHTTP(w, r)
		if w.Code != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.target, w.Code, tc.code)
		}
		want := recordedRequest{route: tc.route, method: tc.method, code: tc.code, reqBytes: int64(headerSize(r)), respBytes: int64(w.Body.Len())}
		if len(rec.started) != 1 || rec.started[0] != tc.route || len(rec.finished) != 1 || rec.finished[0] != want {
			t.Errorf("%s %s: started %v, finished %+v; want %+v", tc.method, tc.target, rec.started, rec.finished, want)
		}
	}
}

func TestReadyzAnswers(t *testing.T) {
	ready := &fixedReadiness{}
	h := New(newMetricsTestCore(t), Options{Readiness: ready})
	get := func(path string) (int, map[string]any) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		var body map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v: %s", path, err, w.Body)
		}
		return w.Code, body
	}
	if code, body := get(PathReadyz); code != 200 || body["status"] != "success" {
		t.Errorf("ready: %d %v", code, body)
	}
	ready.err = &metrics.NotReadyError{Reason: "the Coordinator is in recovery mode", Err: errors.New("secret cause")}
	code, body := get(PathReadyz)
	if code != http.StatusServiceUnavailable || body["status"] != "error" || body["message"] != "not ready: the Coordinator is in recovery mode" {
		t.Errorf("not ready: %d %v", code, body)
	}
	ready.err = errors.New("an error without a reason")
	if code, body := get(PathReadyz); code != http.StatusServiceUnavailable || body["message"] != "not ready" {
		t.Errorf("not ready without a reason: %d %v", code, body)
	}
	if code, body := get(PathHealthz); code != 200 || body["status"] != "success" {
		t.Errorf("healthz: %d %v", code, body)
	}
}

// FuzzRouteOf checks that no request path becomes a label value outside the
// route table.
func FuzzRouteOf(f *testing.F) {
	for _, s := range []string{"/api/v2/status", "/api/v2%2Fstatus", "/api/v2/st%61tus", "/%zz", "//x", "/status"} {
		f.Add(s)
	}
	known := map[string]bool{"/api/v2/status": true, "/status": true}
	f.Fuzz(func(t *testing.T, p string) {
		u, err := url.ParseRequestURI(p)
		if err != nil {
			return
		}
		got := routeOf(&http.Request{URL: u}, known)
		if got != UnknownRoute && !known[got] {
			t.Fatalf("routeOf(%q) = %q", p, got)
		}
	})
}

// BenchmarkRequestMetrics measures the request-metrics middleware: the same
// cheap request (GET /api/v2/healthz through the whole handler) without
// and with Prometheus request metrics.
func BenchmarkRequestMetrics(b *testing.B) {
	c := newMetricsTestCore(b)
	reg := metrics.New(c, metrics.Options{SkipProcessCollectors: true})
	for _, bc := range []struct {
		name string
		m    RequestMetrics
	}{{"without", nil}, {"with", reg.Requests()}} {
		h := New(c, Options{Metrics: bc.m})
		b.Run(bc.name, func(b *testing.B) {
			r := httptest.NewRequest("GET", PathHealthz, nil)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
			}
		})
	}
}
