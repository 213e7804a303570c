package rest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"
)

type ctxKey struct{}

// requestID returns the request's ID ("" outside a request).
func requestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

func newRequestID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// statusRecorder remembers the status code written.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// withRequestLog gives every request an ID (X-Request-Id), recovers panics
// into a 500 error, and logs method, path, status and duration — never
// bodies or query values. Successful reads are logged at debug level so that
// health probes and polling do not flood the log.
func withRequestLog(log *slog.Logger, onPanic func(http.ResponseWriter, *http.Request)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			id := newRequestID()
			r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, id))
			w.Header().Set("X-Request-Id", id)
			rec := &statusRecorder{ResponseWriter: w}
			defer func() {
				if p := recover(); p != nil {
					if p == http.ErrAbortHandler {
						panic(p)
					}
					log.Error("handler panicked", "requestID", id, "panic", p, "stack", string(debug.Stack()))
					if rec.status == 0 {
						onPanic(rec, r)
					}
				}
				level := slog.LevelInfo
				if rec.status < 400 && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
					level = slog.LevelDebug
				}
				if log.Enabled(r.Context(), level) {
					log.LogAttrs(r.Context(), level, "request",
						slog.String("requestID", id),
						slog.String("method", r.Method),
						slog.String("path", r.URL.Path),
						slog.Int("status", rec.status),
						slog.Duration("duration", time.Since(start)),
						slog.String("remote", r.RemoteAddr))
				}
			}()
			next.ServeHTTP(rec, r)
		})
	}
}
