package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
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

// TestUnavailable: a request refused before the handlers because the
// shared state cannot be read gets the handlers' own answer to
// core.ErrUnavailable in both generations: 503, Retry-After, the JSend
// error with what to do, the headers of every answer; the cause (etcd's
// error) is logged, never shown.
func TestUnavailable(t *testing.T) {
	const cause = "etcdserver: request timed out (endpoint 10.0.0.7:2379)"
	for _, c := range []struct {
		path, statusKey, messageKey string
		err                         error
	}{
		{"/api/v2/status", "status", "message", errors.New(cause)},
		{"/status", "Status", "Message", errors.New(cause)},
		{"/api/v2/secrets", "status", "message", fmt.Errorf("%w: %s", core.ErrUnavailable, cause)},
	} {
		var logs bytes.Buffer
		rec := httptest.NewRecorder()
		Unavailable(rec, httptest.NewRequest(http.MethodGet, c.path, nil), slog.New(slog.NewTextHandler(&logs, nil)), c.err)
		var got map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%s: body %q: %v", c.path, rec.Body, err)
		}
		if rec.Code != http.StatusServiceUnavailable || got[c.statusKey] != "error" || got[c.messageKey] != msgStoreUnavailable {
			t.Errorf("%s: %d %v", c.path, rec.Code, got)
		}
		h := rec.Header()
		if h.Get("Retry-After") != "1" || h.Get("Content-Type") != "application/json" || h.Get("X-Content-Type-Options") != "nosniff" ||
			h.Get("Cache-Control") != "no-store" || h.Get("Content-Length") != strconv.Itoa(rec.Body.Len()) {
			t.Errorf("%s: headers %v", c.path, h)
		}
		if strings.Contains(rec.Body.String(), "10.0.0.7") {
			t.Errorf("%s: the cause is shown: %s", c.path, rec.Body)
		}
		if !strings.Contains(logs.String(), "10.0.0.7") {
			t.Errorf("%s: the cause is not logged: %s", c.path, logs.String())
		}
	}
}
