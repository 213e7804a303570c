package rest

import (
	"net/http"
	"strings"
	"time"
)

// UnknownRoute is the route reported for requests to paths outside the
// route table.
const UnknownRoute = "unknown"

// RequestMetrics records Client API requests by route (internal/metrics
// implements it). Route is a path of the route table or UnknownRoute — a
// bounded set, never the raw request path.
type RequestMetrics interface {
	// Started is called when a request begins.
	Started(route string)
	// Finished is called when a Started request has been answered:
	// requestBytes approximates the request (line, headers, declared
	// body), responseBytes counts the body written.
	Finished(route, method string, code int, requestBytes, responseBytes int64, elapsed time.Duration)
}

// withRequestMetrics records every request with the route its path belongs
// to (known is the set of route-table paths).
func withRequestMetrics(m RequestMetrics, known map[string]bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			route := routeOf(r, known)
			m.Started(route)
			rec := &sizeRecorder{ResponseWriter: w}
			defer func() {
				// Also when the handler panics (http.ErrAbortHandler):
				// the request is over either way.
				code := rec.status
				if code == 0 {
					code = http.StatusOK
				}
				m.Finished(route, r.Method, code, int64(headerSize(r))+max(r.ContentLength, 0), rec.written, time.Since(start))
			}()
			next.ServeHTTP(rec, r)
		})
	}
}

// routeOf returns the route-table path of r, or UnknownRoute. Like
// http.ServeMux, an escaped slash (%2F) does not separate path elements.
func routeOf(r *http.Request, known map[string]bool) string {
	p := r.URL.EscapedPath()
	if known[p] {
		return p
	}
	if p != r.URL.Path && !strings.Contains(strings.ToLower(p), "%2f") && known[r.URL.Path] {
		return r.URL.Path
	}
	return UnknownRoute
}

// sizeRecorder remembers the status code and counts the body bytes
// written.
type sizeRecorder struct {
	http.ResponseWriter
	status  int
	written int64
}

func (s *sizeRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *sizeRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.written += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the server's writer.
func (s *sizeRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
