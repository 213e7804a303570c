package loadgen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// tlsServer starts an HTTPS test server on loopback; http2 enables HTTP/2.
func tlsServer(t *testing.T, h http.HandlerFunc, http2 bool) (*httptest.Server, *tls.Config) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = http2
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // dropped connections are the point of some tests
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv, &tls.Config{RootCAs: pool}
}

// eventually calls attempt with a measured window of first, doubling the
// window after every attempt that has not yet seen what the test waits for,
// and fails the test only after a generous deadline. A loaded machine may
// count nothing in a short window (a TLS handshake under the race detector
// can take longer than the whole window), so a test that needs some requests
// in a window waits for them instead of assuming how many fit into a fixed
// time: tests assert what the runner counts, never how fast it goes. What
// must hold for any window, attempt checks every time.
func eventually(t *testing.T, first time.Duration, attempt func(window time.Duration) (seen bool)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for window := first; !attempt(window); window *= 2 {
		if time.Now().After(deadline) {
			t.Fatalf("not seen in windows of up to %v (see the log of each attempt)", window)
		}
	}
}

func TestRunCountsRequests(t *testing.T) {
	for _, http2 := range []bool{false, true} {
		eventually(t, 300*time.Millisecond, func(window time.Duration) bool {
			// A server per attempt: its count belongs to this run alone.
			var served atomic.Int64
			srv, cfg := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
				served.Add(1)
				w.Write([]byte(`{"status":"success"}`))
			}, http2)
			const conns = 4
			res, err := Run(context.Background(), RunConfig{Connections: conns, Duration: window, TLS: cfg, HTTP2: http2},
				Request{Method: http.MethodGet, URL: srv.URL + "/status"})
			if err != nil {
				t.Fatal(err)
			}
			// Every counted response was served; the server may have served
			// up to one request per connection more, cut off at the end.
			n := served.Load()
			if res.Requests > n || res.Requests < n-conns {
				t.Errorf("http2=%v: counted %d requests, the server answered %d", http2, res.Requests, n)
			}
			if res.Non2xx != 0 || res.Errors != 0 || res.FirstError != "" {
				t.Errorf("http2=%v: errors in %+v", http2, res)
			}
			if res.Elapsed != window {
				t.Errorf("elapsed %v, want %v", res.Elapsed, window)
			}
			if res.Requests == 0 {
				t.Logf("http2=%v: no response within %v; again with a longer window", http2, window)
				return false
			}
			if res.Connections != conns {
				t.Errorf("http2=%v: %d connections, want %d", http2, res.Connections, conns)
			}
			if want := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[http2]; res.Protocol != want {
				t.Errorf("protocol %q, want %q", res.Protocol, want)
			}
			if res.Bytes != res.Requests*int64(len(`{"status":"success"}`)) {
				t.Errorf("%d body bytes for %d requests", res.Bytes, res.Requests)
			}
			if l := res.Latency; l.P50 <= 0 || l.P50 > l.P90 || l.P90 > l.P99 || l.P99 > l.Max {
				t.Errorf("latency %+v", l)
			}
			return true
		})
	}
}

func TestRunCountsNon2xx(t *testing.T) {
	eventually(t, 200*time.Millisecond, func(window time.Duration) bool {
		var served atomic.Int64
		srv, cfg := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
			if served.Add(1)%2 == 0 {
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(`{"status":"error","message":"not now"}`))
				return
			}
			w.Write([]byte("ok"))
		}, false)
		res, err := Run(context.Background(), RunConfig{Connections: 1, Duration: window, TLS: cfg},
			Request{Method: http.MethodGet, URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		// One connection, strictly alternating answers.
		if d := res.Requests - 2*res.Non2xx; d < -1 || d > 1 {
			t.Errorf("%d requests, %d non-2xx: want every second one", res.Requests, res.Non2xx)
		}
		if res.Errors != 0 {
			t.Errorf("%d transport errors", res.Errors)
		}
		if res.Non2xx == 0 {
			t.Logf("%d requests within %v, none of them a second one; again with a longer window", res.Requests, window)
			return false
		}
		if want := `HTTP 503: {"status":"error","message":"not now"}`; res.FirstError != want {
			t.Errorf("first error %q, want %q", res.FirstError, want)
		}
		return true
	})
}

func TestRunCountsTransportErrors(t *testing.T) {
	srv, cfg := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		// Drop the connection without an answer.
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}, false)
	eventually(t, 200*time.Millisecond, func(window time.Duration) bool {
		res, err := Run(context.Background(), RunConfig{Connections: 2, Duration: window, TLS: cfg},
			Request{Method: http.MethodGet, URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 0 || res.Non2xx != 0 {
			t.Errorf("%d requests, %d non-2xx, %d errors: want only transport errors", res.Requests, res.Non2xx, res.Errors)
		}
		if res.Errors > 0 && res.FirstError == "" {
			t.Error("no example error")
		}
		// Each dropped connection must be reopened: more dials than
		// connections once a drop has been seen with time left.
		if res.Errors == 0 || res.Connections <= 2 {
			t.Logf("%d errors, %d connections within %v; again with a longer window", res.Errors, res.Connections, window)
			return false
		}
		return true
	})

	// Nothing listening: every attempt fails to connect.
	srv.Close()
	eventually(t, 100*time.Millisecond, func(window time.Duration) bool {
		res, err := Run(context.Background(), RunConfig{Connections: 1, Duration: window, TLS: cfg},
			Request{Method: http.MethodGet, URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 0 {
			t.Errorf("closed server: %d requests", res.Requests)
		}
		if res.Errors == 0 {
			t.Logf("closed server: no error within %v; again with a longer window", window)
			return false
		}
		if !strings.Contains(res.FirstError, "refused") {
			t.Errorf("closed server: %d errors, %q", res.Errors, res.FirstError)
		}
		return true
	})
}

func TestRunExcludesWarmup(t *testing.T) {
	eventually(t, 400*time.Millisecond, func(warmup time.Duration) bool {
		start := time.Now()
		var early atomic.Int64
		srv, cfg := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
			// Fail in the first half of the warm-up: these must not be
			// counted.
			if time.Since(start) < warmup/2 {
				early.Add(1)
				w.WriteHeader(http.StatusInternalServerError)
			}
		}, false)
		const duration = 200 * time.Millisecond
		res, err := Run(context.Background(), RunConfig{Connections: 2, Warmup: warmup, Duration: duration, TLS: cfg},
			Request{Method: http.MethodGet, URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < warmup+duration {
			t.Errorf("run took %v, less than warm-up plus duration", took)
		}
		// A loaded machine may send nothing in the first half of the
		// warm-up, or deliver an early failure only after the warm-up:
		// then again with a longer warm-up. A runner that counted warm-up
		// answers would never get here.
		if early.Load() == 0 || res.Requests == 0 || res.Non2xx != 0 {
			t.Logf("warm-up %v: %d early failures, %d requests with %d non-2xx counted; again with a longer warm-up",
				warmup, early.Load(), res.Requests, res.Non2xx)
			return false
		}
		return true
	})
}

func TestRunRespectsDuration(t *testing.T) {
	// A server that never answers: the run still ends on time, and the
	// cut-off requests are neither requests nor errors.
	release := make(chan struct{})
	defer close(release)
	for _, http2 := range []bool{false, true} {
		srv, cfg := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}, http2)
		start := time.Now()
		res, err := Run(context.Background(), RunConfig{Connections: 3, Duration: 300 * time.Millisecond, TLS: cfg, HTTP2: http2},
			Request{Method: http.MethodGet, URL: srv.URL})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if took < 300*time.Millisecond || took > 2*time.Second {
			t.Errorf("http2=%v: a 300ms run took %v", http2, took)
		}
		if res.Requests != 0 || res.Errors != 0 {
			t.Errorf("http2=%v: %d requests, %d errors from requests cut off by the end", http2, res.Requests, res.Errors)
		}
	}
}

func TestRunTimeout(t *testing.T) {
	release := make(chan struct{})
	srv, cfg := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}, false)
	defer close(release)
	eventually(t, 500*time.Millisecond, func(window time.Duration) bool {
		res, err := Run(context.Background(), RunConfig{Connections: 1, Duration: window, Timeout: 50 * time.Millisecond, TLS: cfg},
			Request{Method: http.MethodGet, URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 0 || (res.Errors > 0 && !strings.Contains(res.FirstError, "timeout")) {
			t.Errorf("%d errors (%q), %d requests: want only timeouts", res.Errors, res.FirstError, res.Requests)
		}
		if res.Errors < 3 {
			t.Logf("%d timeouts within %v; again with a longer window", res.Errors, window)
			return false
		}
		return true
	})
}

func TestRunCancelled(t *testing.T) {
	srv, cfg := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {}, false)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, RunConfig{Connections: 2, Duration: time.Minute, TLS: cfg}, Request{Method: http.MethodGet, URL: srv.URL})
	if err == nil {
		t.Fatal("a cancelled run returned no error")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("cancelled run took %v", took)
	}
}

func TestRunSendsClientCertificate(t *testing.T) {
	cert, _, err := NewUserCertificate("reader")
	if err != nil {
		t.Fatal(err)
	}
	var without atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != "reader" {
			without.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	defer srv.Close()
	cfg := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}
	// Every request carries the certificate, however many fit into the
	// window; the run is repeated until at least one was counted (the two
	// TLS handshakes with a client certificate alone may outlast a short
	// window on a loaded machine).
	eventually(t, 100*time.Millisecond, func(window time.Duration) bool {
		res, err := Run(context.Background(), RunConfig{Connections: 2, Duration: window, TLS: cfg},
			Request{Method: http.MethodGet, URL: srv.URL + "/api/v2/secrets?s=a"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Non2xx != 0 || without.Load() != 0 {
			t.Errorf("%d requests, %d non-2xx, %d without the certificate", res.Requests, res.Non2xx, without.Load())
		}
		if res.Requests == 0 {
			t.Logf("no response within %v; again with a longer window", window)
			return false
		}
		return true
	})
}

func TestRunRejectsBadConfig(t *testing.T) {
	bad := []struct {
		cfg RunConfig
		url string
	}{
		{RunConfig{Connections: 0, Duration: time.Second}, "https://127.0.0.1:1"},
		{RunConfig{Connections: 1, Duration: 0}, "https://127.0.0.1:1"},
		{RunConfig{Connections: 1, Duration: time.Second, Warmup: -1}, "https://127.0.0.1:1"},
		{RunConfig{Connections: 1, Duration: time.Second}, "http://127.0.0.1:1"},
		{RunConfig{Connections: 1, Duration: time.Second}, "https://[::1"},
	}
	for _, b := range bad {
		if _, err := Run(context.Background(), b.cfg, Request{Method: http.MethodGet, URL: b.url}); err == nil {
			t.Errorf("Run(%+v, %s) accepted", b.cfg, b.url)
		}
	}
}
