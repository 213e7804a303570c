package rest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/admission"
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

// MaxHeaderBytes is the documented limit of a request's line and headers;
// larger ones get a JSend 431. The server's own limit (http.Server's
// MaxHeaderBytes) must be set well above it, so that net/http's plain-text
// 431 is left for requests far over the limit.
const MaxHeaderBytes = 64 << 10

// headerSize is the size of the request line and header fields as sent
// over HTTP/1.1 (for HTTP/2, of their decoded form).
func headerSize(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// withRequestChecks refuses, before routing, requests whose headers exceed
// MaxHeaderBytes (431) and paths that are not clean (404, where
// http.ServeMux would redirect with an HTML body: a client of this API
// never needs //, /./ or /../ in a path).
func withRequestChecks(refuse func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n := headerSize(r); n > MaxHeaderBytes {
				refuse(w, r, &headerError{size: n})
				return
			}
			if p := r.URL.EscapedPath(); r.Method != http.MethodConnect && cleanPath(p) != p {
				refuse(w, r, fmt.Errorf("%w: %s (not a clean path)", errUnknownPath, p))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// headerError is a request whose headers are too large (431).
type headerError struct{ size int }

func (e *headerError) Error() string {
	return fmt.Sprintf("request header fields too large: %d bytes; the limit is %d bytes", e.size, MaxHeaderBytes)
}

// cleanPath is the path http.ServeMux would redirect p to: rooted, without
// empty, . or .. elements, keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if strings.HasSuffix(p, "/") && np != "/" {
		np += "/"
	}
	return np
}

// withSourceGate refuses a request with 429 while its source address has
// as many requests in progress as gate allows (admission.Gate): one
// address, also over HTTP/2 with many streams per connection, cannot take
// all the Coordinator's request handling.
func withSourceGate(gate *admission.Gate, refuse func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			src := admission.SourceOf(r.RemoteAddr)
			if !gate.Enter(src) {
				refuse(w, r, errTooManyRequests)
				return
			}
			defer gate.Leave(src)
			next.ServeHTTP(w, r)
		})
	}
}
