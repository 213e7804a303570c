package rest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// slowCore is a Coordinator whose update log waits for its context to end.
type slowCore struct{ Coordinator }

func (slowCore) UpdateLog(ctx context.Context) ([]string, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestRequestDeadline: a use case still running at the request's deadline
// is answered 503 with Retry-After, in the request's generation, and its
// cause is logged, not shown.
func TestRequestDeadline(t *testing.T) {
	h := New(slowCore{}, Options{MaxManifestBytes: 4096, RequestTimeout: time.Millisecond})
	for _, tc := range []struct{ path, prefix string }{
		{"/api/v2/update", `{"status":"error",`},
		{"/update", `{"Status":"error",`},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, tc.path, nil))
		body := w.Body.String()
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.HasPrefix(body, tc.prefix) ||
			!json.Valid([]byte(body)) || !strings.Contains(body, "did not finish within") || strings.Contains(body, "deadline exceeded") {
			t.Errorf("%s: answer %d Retry-After %q: %s", tc.path, w.Code, w.Header().Get("Retry-After"), body)
		}
	}
}
