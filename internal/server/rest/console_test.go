package rest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// TestConsoleMount checks that Options.Console serves everything under
// ConsolePath (and /console redirects there) and that without it those
// paths are unknown like any other.
func TestConsoleMount(t *testing.T) {
	console := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "console:"+r.URL.Path)
	})
	on := New(newMetricsTestCore(t), Options{Console: console})
	for _, p := range []string{"/console/", "/console/history", "/console/static/console.css"} {
		rec := httptest.NewRecorder()
		on.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		if rec.Code != http.StatusOK || rec.Body.String() != "console:"+p {
			t.Errorf("GET %s: %d %q", p, rec.Code, rec.Body)
		}
	}
	rec := httptest.NewRecorder()
	on.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/console", nil))
	if rec.Code/100 != 3 || rec.Header().Get("Location") != ConsolePath {
		t.Errorf("GET /console: %d Location %q", rec.Code, rec.Header().Get("Location"))
	}
	// The API is unchanged beside it.
	rec = httptest.NewRecorder()
	on.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v2/status", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"status":"success"`) {
		t.Errorf("GET /api/v2/status beside the console: %d %s", rec.Code, rec.Body)
	}

	off := New(newMetricsTestCore(t), Options{})
	for _, p := range []string{"/console/", "/console/history"} {
		rec := httptest.NewRecorder()
		off.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "unknown") && !strings.Contains(rec.Body.String(), "not found") {
			t.Errorf("GET %s without a console: %d %s", p, rec.Code, rec.Body)
		}
	}
}

// TestConsoleIsNotAnAPIRoute keeps the console out of the route table (the
// API's description lists the route table; the console is in NotAPIPaths).
func TestConsoleIsNotAnAPIRoute(t *testing.T) {
	s := &server{}
	for _, rt := range s.allRoutes() {
		if strings.HasPrefix(rt.path, ConsolePath) {
			t.Errorf("the route table has %s", rt.path)
		}
	}
	if !slices.Contains(NotAPIPaths, ConsolePath) {
		t.Errorf("NotAPIPaths lacks %s", ConsolePath)
	}
}
