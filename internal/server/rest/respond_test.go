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
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/manifest"
)

// classified mimics how core wraps its errors: its own message, and both the
// class and the cause in the chain.
type classified struct{ class, err error }

func (e classified) Error() string   { return e.err.Error() }
func (e classified) Unwrap() []error { return []error{e.class, e.err} }

func TestStatusOf(t *testing.T) {
	_, parseErr := manifest.Parse([]byte("{"))
	for _, tc := range []struct {
		err    error
		status int
		class  class
	}{
		{&bodyError{msg: "x"}, http.StatusBadRequest, classClient},
		{&bodyError{msg: "x", tooLarge: true}, http.StatusRequestEntityTooLarge, classClient},
		{parseErr, http.StatusBadRequest, classClient},
		{&manifest.ValidationError{Message: "m"}, http.StatusBadRequest, classClient},
		{classified{core.ErrInvalidRequest, errors.New("x")}, http.StatusBadRequest, classClient},
		{classified{core.ErrUnauthenticated, errors.New("x")}, http.StatusUnauthorized, classClient},
		{classified{core.ErrForbidden, errors.New("x")}, http.StatusForbidden, classClient},
		{classified{core.ErrNotFound, errors.New("x")}, http.StatusNotFound, classClient},
		{fmt.Errorf("%w: /x", errUnknownPath), http.StatusNotFound, classClient},
		{fmt.Errorf("%w: POST /x", errBadMethod), http.StatusMethodNotAllowed, classClient},
		{&core.WrongStateError{State: core.StateAcceptingManifest, Op: "x"}, http.StatusConflict, classClient},
		{classified{core.ErrConflict, errors.New("x")}, http.StatusConflict, classClient},
		{errors.New("disk on fire"), http.StatusInternalServerError, classInternal},
		{errPanic, http.StatusInternalServerError, classInternal},
		{&disabledError{msg: "off"}, http.StatusForbidden, classClient},
		{errBusy, http.StatusServiceUnavailable, classUnavailable},
		{&unavailableError{msg: "late", err: context.DeadlineExceeded}, http.StatusServiceUnavailable, classUnavailable},
		{context.DeadlineExceeded, http.StatusInternalServerError, classInternal},
		{&bodyError{msg: "slow", timeout: true}, http.StatusRequestTimeout, classClient},
		{errSourceBusy, http.StatusTooManyRequests, classClient},
		{errTooManyRequests, http.StatusTooManyRequests, classClient},
		{fmt.Errorf("commit: %w", &os.PathError{Op: "open", Path: "sealed_key", Err: syscall.EMFILE}), http.StatusServiceUnavailable, classUnavailable},
		{&os.PathError{Op: "open", Path: "sealed_data.tmp", Err: syscall.ENFILE}, http.StatusServiceUnavailable, classUnavailable},
	} {
		status, class := statusOf(tc.err)
		if status != tc.status || class != tc.class {
			t.Errorf("statusOf(%v) = %d, %v; want %d, %v", tc.err, status, class, tc.status, tc.class)
		}
	}
}

func TestRendererEnvelopes(t *testing.T) {
	var logs bytes.Buffer
	r := renderer{log: slog.New(slog.NewJSONHandler(&logs, nil))}
	v1 := renderer{log: r.log, v1: true}
	for _, tc := range []struct {
		name   string
		r      renderer
		data   any
		err    error
		status int
		body   string
	}{
		{"v2 success", r, map[string]int{"a": 1}, nil, 200, `{"status":"success","data":{"a":1}}`},
		{"v2 null data", r, nil, nil, 200, `{"status":"success","data":null}`},
		{"v2 encoded", r, encoded(`{"b":2}`), nil, 200, `{"status":"success","data":{"b":2}}`},
		{"v2 fail", r, nil, &bodyError{msg: "bad"}, 400, `{"status":"fail","data":null,"message":"bad"}`},
		{"v2 fail with data", r, nil, &manifest.ValidationError{Section: "Packages", Name: "p", Field: "SignerID", Message: "m"}, 400,
			`{"status":"fail","data":{"section":"Packages","name":"p","field":"SignerID"},"message":"m"}`},
		{"v1 success", v1, "text", nil, 200, `{"Status":"success","Data":"text"}`},
		{"v1 encoded", v1, encoded(`[1]`), nil, 200, `{"Status":"success","Data":[1]}`},
		{"v1 client error", v1, nil, &bodyError{msg: "bad"}, 400, `{"Status":"error","Data":null,"Message":"bad"}`},
		{"v2 busy", r, nil, errBusy, 503, `{"status":"error","data":null,"message":"` + errBusy.msg + `"}`},
		{"v1 busy", v1, nil, errBusy, 503, `{"Status":"error","Data":null,"Message":"` + errBusy.msg + `"}`},
		{"v2 disabled", r, nil, &disabledError{msg: "off"}, 403, `{"status":"fail","data":null,"message":"off"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			tc.r.write(w, httptest.NewRequest(http.MethodGet, "/x", nil), tc.data, tc.err)
			if w.Code != tc.status || w.Body.String() != tc.body+"\n" {
				t.Fatalf("got %d %q, want %d %q", w.Code, w.Body.String(), tc.status, tc.body+"\n")
			}
			if w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Content-Length") != fmt.Sprint(len(tc.body)+1) {
				t.Fatalf("headers %v", w.Header())
			}
			if (tc.status == 503) != (w.Header().Get("Retry-After") == "1") {
				t.Fatalf("Retry-After %q with status %d", w.Header().Get("Retry-After"), tc.status)
			}
			if !json.Valid(w.Body.Bytes()) {
				t.Fatal("body is not JSON")
			}
		})
	}
	// A service failure hides the cause from the client and logs it with
	// the request ID.
	w := httptest.NewRecorder()
	r.write(w, httptest.NewRequest(http.MethodGet, "/x", nil), nil, errors.New("secret internal detail"))
	if w.Code != 500 || strings.Contains(w.Body.String(), "secret internal detail") || !strings.Contains(w.Body.String(), `"status":"error"`) {
		t.Fatalf("500 answer %q", w.Body.String())
	}
	if !strings.Contains(logs.String(), "secret internal detail") {
		t.Fatalf("the cause is not logged: %s", logs.String())
	}
}

func TestDecodeBodyAndQueries(t *testing.T) {
	for _, tc := range []struct {
		body     string
		limit    int64
		ok       bool
		tooLarge bool
	}{
		{`{"manifest":"e30="}`, 100, true, false},
		{`{"manifest":"e30="}  `, 100, true, false},
		{``, 100, false, false},
		{`{`, 100, false, false},
		{`{} {}`, 100, false, false},
		{`{"manifest":"` + strings.Repeat("A", 200) + `"}`, 100, false, true},
	} {
		var v struct{ Manifest []byte }
		err := decodeBody(httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(tc.body)), tc.limit, &v)
		var be *bodyError
		if tc.ok != (err == nil) || (err != nil && (!errors.As(err, &be) || be.tooLarge != tc.tooLarge)) {
			t.Errorf("decodeBody(%q) = %v", tc.body, err)
		}
	}
	for _, tc := range []struct {
		in  string
		out string
		ok  bool
	}{
		{"bm9uY2U=", "nonce", true},
		{"bm9uY2U", "nonce", true},
		{"-_8=", "\xfb\xff", true},
		{"***", "", false},
		{strings.Repeat("A", 2000), "", false},
	} {
		got, err := decodeNonce(tc.in)
		if tc.ok != (err == nil) || string(got) != tc.out {
			t.Errorf("decodeNonce(%q) = %q, %v", tc.in, got, err)
		}
	}
	for _, tc := range []struct {
		query string
		names []string
	}{
		{"s=a&s=b", []string{"a", "b"}},
		{"", nil},
		{"s=", nil},
		{"s=a&s=", nil},
	} {
		got, err := secretNames(httptest.NewRequest(http.MethodGet, "/x?"+tc.query, nil))
		if fmt.Sprint(got) != fmt.Sprint(tc.names) || (tc.names == nil) != (err != nil) {
			t.Errorf("secretNames(%q) = %v, %v", tc.query, got, err)
		}
	}
}

// TestEveryCoreClassIsMapped sends every error class of the core (both as
// the sentinel and wrapped the way the core wraps it) through the one
// error→status map and the renderer of both generations: none may become a
// 500, and an unavailable store is 503 with Retry-After and a message that
// names no etcd detail.
func TestEveryCoreClassIsMapped(t *testing.T) {
	want := map[error]int{
		core.ErrWrongState:      http.StatusConflict,
		core.ErrInvalidRequest:  http.StatusBadRequest,
		core.ErrUnauthenticated: http.StatusUnauthorized,
		core.ErrForbidden:       http.StatusForbidden,
		core.ErrNotFound:        http.StatusNotFound,
		core.ErrConflict:        http.StatusConflict,
		core.ErrUnavailable:     http.StatusServiceUnavailable,
		core.ErrTooLarge:        http.StatusRequestEntityTooLarge,
	}
	for _, class := range core.ErrorClasses() {
		status, ok := want[class]
		if !ok {
			t.Errorf("core class %q has no expected status in this test: decide its status, map it in statusOf and add it here", class)
			continue
		}
		for _, err := range []error{class, fmt.Errorf("%w: context deadline exceeded (etcd endpoints 10.0.0.7:2379)", class)} {
			if got, cl := statusOf(err); got != status || cl == classInternal {
				t.Errorf("statusOf(%q) = %d (class %v), want %d", err, got, cl, status)
			}
			for _, v1 := range []bool{false, true} {
				var logs bytes.Buffer
				w := httptest.NewRecorder()
				renderer{log: slog.New(slog.NewJSONHandler(&logs, nil)), v1: v1}.write(w, httptest.NewRequest(http.MethodPost, "/x", nil), nil, err)
				if w.Code != status {
					t.Errorf("v1=%v %q answered %d, want %d", v1, err, w.Code, status)
				}
				if status != http.StatusServiceUnavailable {
					continue
				}
				if w.Header().Get("Retry-After") != "1" {
					t.Errorf("v1=%v %q: Retry-After %q, want 1", v1, err, w.Header().Get("Retry-After"))
				}
				if strings.Contains(w.Body.String(), "10.0.0.7") || !strings.Contains(w.Body.String(), "state store") {
					t.Errorf("v1=%v 503 body %q: want the safe message without the store's details", v1, w.Body.String())
				}
				if strings.Contains(err.Error(), "10.0.0.7") && !strings.Contains(logs.String(), "10.0.0.7") {
					t.Errorf("the cause is not logged: %s", logs.String())
				}
			}
		}
	}
}
