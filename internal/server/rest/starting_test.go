package rest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/core"
)

// waitingForStore is the readiness of a Coordinator that waits for its
// store.
type waitingForStore struct{}

func (waitingForStore) Ready(context.Context) (core.State, error) {
	return core.StateUninitialized, notReadyReason("waiting for etcd: no answer; attempt 3, next in 2s")
}

type notReadyReason string

func (r notReadyReason) Error() string          { return "not ready: " + string(r) + ": the cause" }
func (r notReadyReason) NotReadyReason() string { return string(r) }

// TestStarting: before the state is loaded the health endpoints answer,
// readiness says why the Coordinator is not ready, and every other
// request of both generations — status, quote, manifest, secrets, a
// manifest upload, an unknown path — is a 503 error with Retry-After that
// says the Coordinator is starting and why.
func TestStarting(t *testing.T) {
	h := Starting(waitingForStore{}, nil)
	serve := func(method, path string) (*httptest.ResponseRecorder, map[string]any) {
		t.Helper()
		var body *strings.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"Packages":{}}`)
		} else {
			body = strings.NewReader("")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, body))
		var got map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%s %s: body %q is not JSON: %v", method, path, rec.Body, err)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", method, path, ct)
		}
		return rec, got
	}

	rec, got := serve(http.MethodGet, PathHealthz)
	if rec.Code != http.StatusOK || got["status"] != "success" || got["data"].(map[string]any)["status"] != "alive" {
		t.Errorf("healthz: %d %v", rec.Code, got)
	}
	rec, got = serve(http.MethodGet, PathReadyz)
	if rec.Code != http.StatusServiceUnavailable || got["status"] != "error" || rec.Header().Get("Retry-After") == "" ||
		got["message"] != "not ready: waiting for etcd: no answer; attempt 3, next in 2s" {
		t.Errorf("readyz: %d %v (Retry-After %q)", rec.Code, got, rec.Header().Get("Retry-After"))
	}

	for _, req := range []struct{ method, path, statusKey, messageKey string }{
		{http.MethodGet, "/api/v2/status", "status", "message"},
		{http.MethodGet, "/api/v2/quote", "status", "message"},
		{http.MethodGet, "/api/v2/manifest", "status", "message"},
		{http.MethodPost, "/api/v2/manifest", "status", "message"},
		{http.MethodGet, "/api/v2/secrets?s=a", "status", "message"},
		{http.MethodGet, "/api/v2/nowhere", "status", "message"},
		{http.MethodPost, PathHealthz, "status", "message"},
		{http.MethodGet, "/status", "Status", "Message"},
		{http.MethodGet, "/quote", "Status", "Message"},
		{http.MethodGet, "/manifest", "Status", "Message"},
	} {
		rec, got := serve(req.method, req.path)
		msg, _ := got[req.messageKey].(string)
		if rec.Code != http.StatusServiceUnavailable || got[req.statusKey] != "error" || rec.Header().Get("Retry-After") != "1" ||
			!strings.HasPrefix(msg, "the Coordinator is starting") || !strings.Contains(msg, "waiting for etcd: no answer") {
			t.Errorf("%s %s: %d %v (Retry-After %q)", req.method, req.path, rec.Code, got, rec.Header().Get("Retry-After"))
		}
		if strings.Contains(msg, "the cause") {
			t.Errorf("%s %s: the message shows the cause behind the reason: %q", req.method, req.path, msg)
		}
		if d, ok := got["data"]; ok && d != nil {
			t.Errorf("%s %s: data %v while starting", req.method, req.path, d)
		}
	}

	// Without a readiness: not ready, never a panic.
	rec = httptest.NewRecorder()
	Starting(nil, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, PathReadyz, nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "not loaded") {
		t.Errorf("readyz without a readiness: %d %s", rec.Code, rec.Body)
	}
}
