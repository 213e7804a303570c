package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
)

// Peers that fail at the connection level, on loopback.

// closedAddr returns an address on which nothing listens: dialling it is
// refused.
func closedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// deadListener returns the address of a listener that never accepts: the
// kernel completes the TCP handshake, the TLS handshake then times out (a
// stopped or hung process).
func deadListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// resetter accepts connections and closes them at once, before the TLS
// handshake completes (a peer dying as it is reached). It counts them.
type resetter struct {
	l        net.Listener
	accepted atomic.Int32
}

func newResetter(t *testing.T) *resetter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &resetter{l: l}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			c.Close()
		}
	})
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return r
}

func (r *resetter) addr() string { return r.l.Addr().String() }

// list joins endpoints with commas.
func list(endpoints ...string) string { return strings.Join(endpoints, ",") }

// liveFake is a fake answering status and manifest uploads.
func liveFake(t testing.TB, p *pki) *fake {
	t.Helper()
	f := newFakeWithTLSCert(t, p, nil)
	f.handle("GET "+v2.PathStatus, success(v2.StatusResponse{Code: 2, Status: 2, Message: "ready"}))
	f.handle("POST "+v2.PathManifest, success(v2.ManifestSetResponse{}))
	return f
}

// TestFailoverOnConnectionErrors: a refused dial, a listener that never
// answers the TLS handshake and a peer that resets the connection during it
// are skipped, for reads and writes alike (nothing was sent); the endpoint
// that answered is used first afterwards.
func TestFailoverOnConnectionErrors(t *testing.T) {
	p := newPKI(t)
	live := liveFake(t, p)
	reset := newResetter(t)
	endpoints := list(closedAddr(t), deadListener(t), reset.addr(), live.endpoint())
	c, err := client.New(endpoints, client.WithRootCertificate(p.root), client.WithConnectTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("Status over %s: %v", endpoints, err)
	}
	if got, want := c.Endpoint(), "https://"+live.endpoint(); got != want {
		t.Fatalf("Endpoint() after failing over = %q, want %q", got, want)
	}
	if reset.accepted.Load() == 0 {
		t.Fatal("the resetting peer was never tried")
	}
	tried := reset.accepted.Load()
	// The endpoint that answered is tried first from now on.
	if _, err := c.SetManifest(ctx, []byte(`{}`)); err != nil {
		t.Fatalf("SetManifest: %v", err)
	}
	if got := reset.accepted.Load(); got != tried {
		t.Fatalf("the resetting peer was tried again (%d connections, %d before)", got, tried)
	}
	if g, p := live.count(http.MethodGet), live.count(http.MethodPost); g != 1 || p != 1 {
		t.Fatalf("the live endpoint got %d GET and %d POST, want 1 each", g, p)
	}

	// A write fails over too when nothing was sent: a fresh client starts
	// at the refused and resetting endpoints again.
	c2, err := client.New(list(closedAddr(t), reset.addr(), live.endpoint()), client.WithRootCertificate(p.root))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.SetManifest(ctx, []byte(`{}`)); err != nil {
		t.Fatalf("SetManifest on a fresh client: %v", err)
	}
	if got := live.count(http.MethodPost); got != 2 {
		t.Fatalf("the live endpoint got %d POST, want 2", got)
	}
}

// TestNoFailoverOnAnswer: any HTTP answer is final, 4xx, 5xx or not JSend:
// the next endpoint never sees the request, for reads and writes.
func TestNoFailoverOnAnswer(t *testing.T) {
	p := newPKI(t)
	for _, status := range []int{400, 401, 403, 404, 409, 413, 500, 502, 503} {
		for _, jsendAnswer := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d/jsend=%v", status, jsendAnswer), func(t *testing.T) {
				answering := newFakeWithTLSCert(t, p, nil)
				h := failure(status, "refused by the first instance", nil)
				if !jsendAnswer {
					h = func(w http.ResponseWriter, r *http.Request) { http.Error(w, "proxy says no", status) }
				}
				answering.handle("GET "+v2.PathStatus, h)
				answering.handle("POST "+v2.PathManifest, h)
				next := liveFake(t, p)
				c, err := client.New(list(closedAddr(t), answering.endpoint(), next.endpoint()), client.WithRootCertificate(p.root))
				if err != nil {
					t.Fatal(err)
				}
				_, getErr := c.Status(context.Background())
				_, postErr := c.SetManifest(context.Background(), []byte(`{}`))
				for _, err := range []error{getErr, postErr} {
					e, ok := client.AsError(err)
					if !ok || e.HTTPStatus != status {
						t.Fatalf("got %v, want the first instance's HTTP %d answer", err, status)
					}
					if errors.Is(err, client.ErrUnreachable) {
						t.Fatalf("an answer reported as unreachable: %v", err)
					}
				}
				if n := next.total(); n != 0 {
					t.Fatalf("the next endpoint got %d requests after an HTTP %d answer", n, status)
				}
				if answering.count(http.MethodGet) != 1 || answering.count(http.MethodPost) != 1 {
					t.Fatal("the answering endpoint did not get each request once")
				}
			})
		}
	}
}

// TestNoResendAfterBrokenConnection: a peer that reads the whole request and
// breaks the connection without answering (HTTP/1.1: closed; HTTP/2: stream
// reset) may have applied a write: the POST is not sent to another
// endpoint and the error says the outcome is unknown. A GET, which changes
// nothing, fails over.
func TestNoResendAfterBrokenConnection(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			p := newPKI(t)
			breaker := newFakeServer(t, p, nil, h2)
			abort := func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) }
			breaker.handle("POST "+v2.PathManifest, abort)
			breaker.handle("POST "+v2.PathSecrets, abort)
			breaker.handle("GET "+v2.PathStatus, abort)
			live := liveFake(t, p)
			live.handle("POST "+v2.PathSecrets, success(nil))
			c, err := client.New(list(breaker.endpoint(), live.endpoint()), client.WithRootCertificate(p.root))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			_, err = c.SetManifest(ctx, []byte(`{"Packages":{}}`))
			if !errors.Is(err, client.ErrOutcomeUnknown) || errors.Is(err, client.ErrUnreachable) {
				t.Fatalf("SetManifest through a broken connection: %v, want ErrOutcomeUnknown", err)
			}
			err = c.SetSecrets(ctx, map[string]v2.UserSecret{"s": {Key: []byte("k")}})
			if !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Fatalf("SetSecrets through a broken connection: %v, want ErrOutcomeUnknown", err)
			}
			if got := breaker.count(http.MethodPost); got != 2 {
				t.Fatalf("the breaking endpoint received %d POST, want 2 (the requests were delivered)", got)
			}
			if got := live.count(http.MethodPost); got != 0 {
				t.Fatalf("a POST whose connection broke was sent again to the next endpoint (%d times)", got)
			}
			if _, err := c.Status(ctx); err != nil {
				t.Fatalf("a GET did not fail over from a broken connection: %v", err)
			}
			if breaker.count(http.MethodGet) != 1 || live.count(http.MethodGet) != 1 {
				t.Fatalf("GET: the breaking endpoint got %d, the live one %d; want 1 and 1", breaker.count(http.MethodGet), live.count(http.MethodGet))
			}
		})
	}
}

// TestFailoverRefusesAnotherRoot: the endpoints are one deployment with one
// root; an endpoint presenting another root is an error, not skipped.
func TestFailoverRefusesAnotherRoot(t *testing.T) {
	p := newPKI(t)
	live := liveFake(t, p)
	foreign := liveFake(t, newPKI(t))
	c, err := client.New(list(closedAddr(t), foreign.endpoint(), live.endpoint()), client.WithRootCertificate(p.root))
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range []func() error{
		func() error { _, err := c.Status(context.Background()); return err },
		func() error { _, err := c.SetManifest(context.Background(), []byte(`{}`)); return err },
	} {
		err := call()
		if !errors.Is(err, client.ErrRootMismatch) || !errors.Is(err, client.ErrVerification) {
			t.Fatalf("another root on the second endpoint: %v, want ErrRootMismatch", err)
		}
		if errors.Is(err, client.ErrOutcomeUnknown) || errors.Is(err, client.ErrUnreachable) {
			t.Fatalf("a root mismatch reported as a connection failure: %v", err)
		}
	}
	if foreign.total() != 0 || live.total() != 0 {
		t.Fatalf("requests reached the servers (foreign %d, live %d)", foreign.total(), live.total())
	}

	// VerifyCoordinator fails over to the first endpoint that answers and
	// returns its root; the Client pinned to it refuses the foreign one.
	live.handle("GET "+v2.PathQuote, quoteHandler(live, certPEM(live.inter, live.root), nil))
	foreign.handle("GET "+v2.PathQuote, quoteHandler(foreign, certPEM(foreign.inter, foreign.root), nil))
	att, err := client.VerifyCoordinator(context.Background(), list(closedAddr(t), live.endpoint(), foreign.endpoint()), client.VerifyOptions{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if !att.Root.Equal(p.root) {
		t.Fatal("VerifyCoordinator did not return the first answering endpoint's root")
	}
}

// TestAllEndpointsUnreachable: when every endpoint fails, the error names
// each and wraps ErrUnreachable and the causes; a write that reached no
// endpoint is not of unknown outcome.
func TestAllEndpointsUnreachable(t *testing.T) {
	a, b := closedAddr(t), closedAddr(t)
	p := newPKI(t)
	c, err := client.New(list(a, b), client.WithRootCertificate(p.root))
	if err != nil {
		t.Fatal(err)
	}
	_, getErr := c.Status(context.Background())
	_, postErr := c.SetManifest(context.Background(), []byte(`{}`))
	for _, err := range []error{getErr, postErr} {
		if !errors.Is(err, client.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("all endpoints refused: %v, want ErrUnreachable and ECONNREFUSED", err)
		}
		if errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("a request that was never sent reported as of unknown outcome: %v", err)
		}
		if !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), b) {
			t.Fatalf("the error does not name both endpoints: %v", err)
		}
	}
	// One endpoint: the error reads as before, and wraps ErrUnreachable.
	one, err := client.New(a, client.WithRootCertificate(p.root))
	if err != nil {
		t.Fatal(err)
	}
	_, err = one.Status(context.Background())
	if !errors.Is(err, client.ErrUnreachable) || !strings.HasPrefix(err.Error(), "GET https://"+a+v2.PathStatus+": ") {
		t.Fatalf("one endpoint refused: %v", err)
	}
}

// TestFailoverStopsWithTheContext: the caller's deadline ends the request;
// it is not carried on to the next endpoint.
func TestFailoverStopsWithTheContext(t *testing.T) {
	p := newPKI(t)
	live := liveFake(t, p)
	c, err := client.New(list(deadListener(t), live.endpoint()), client.WithRootCertificate(p.root), client.WithConnectTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = c.Status(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("deadline during the first endpoint's handshake: %v, want DeadlineExceeded", err)
	}
	if live.total() != 0 {
		t.Fatal("the request went on to the next endpoint after the deadline")
	}
}

// TestFailoverConcurrent: concurrent requests over a list with a dead first
// endpoint all succeed (run with -race).
func TestFailoverConcurrent(t *testing.T) {
	p := newPKI(t)
	live := liveFake(t, p)
	c, err := client.New(list(closedAddr(t), live.endpoint()), client.WithRootCertificate(p.root))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			_, err := c.Status(context.Background())
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := live.count(http.MethodGet); got != 16 {
		t.Fatalf("the live endpoint got %d requests, want 16", got)
	}
}

func TestParseEndpoints(t *testing.T) {
	got, err := client.ParseEndpoints(" a , b:99,https://[::1]:7")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"https://a:4433", "https://b:99", "https://[::1]:7"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("ParseEndpoints = %q, want %q", got, want)
	}
	c, err := client.New(" a , b:99,https://[::1]:7", client.WithInsecureSkipVerify())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Endpoints(), " ") != strings.Join(want, " ") || c.Endpoint() != want[0] {
		t.Fatalf("Endpoints() = %q, Endpoint() = %q", c.Endpoints(), c.Endpoint())
	}
	for _, bad := range []string{"", " ", ",", "a,", ",a", "a,,b", "a,a:4433", "a,http://b", "a,https://b/path"} {
		if _, err := client.ParseEndpoints(bad); err == nil {
			t.Errorf("ParseEndpoints(%q) succeeded", bad)
		}
		if _, err := client.New(bad, client.WithInsecureSkipVerify()); err == nil {
			t.Errorf("New(%q) succeeded", bad)
		}
	}
	if _, err := client.New("a", client.WithInsecureSkipVerify(), client.WithConnectTimeout(0)); err == nil {
		t.Error("WithConnectTimeout(0) accepted")
	}
}

// FuzzParseEndpoints: any input is refused or yields one normalised base
// URL per comma-separated element, which parse again to themselves.
func FuzzParseEndpoints(f *testing.F) {
	for _, s := range []string{"a", "a:1,b:2", "https://[::1]:7, b", "a,,b", "a,a:4433", "http://x", "https://u@h", ",", "[::1", "a:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := client.ParseEndpoints(in)
		if err != nil {
			return
		}
		if len(got) != strings.Count(in, ",")+1 {
			t.Fatalf("ParseEndpoints(%q) = %d endpoints for %d elements", in, len(got), strings.Count(in, ",")+1)
		}
		again, err := client.ParseEndpoints(strings.Join(got, ","))
		if err != nil || strings.Join(again, ",") != strings.Join(got, ",") {
			t.Fatalf("ParseEndpoints(%q) = %q, which parses to %q, %v", in, got, again, err)
		}
	})
}

// BenchmarkFailover measures a GET with one endpoint, with a refused
// endpoint first on a client that has already failed over once (it starts
// at the endpoint that answered), and on a fresh client each time (dial
// refused, then a new TLS connection).
func BenchmarkFailover(b *testing.B) {
	p := newPKI(b)
	live := liveFake(b, p)
	closed := closedAddr(b)
	ctx := context.Background()
	run := func(b *testing.B, c *client.Client) {
		if _, err := c.Status(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("one-endpoint", func(b *testing.B) {
		c, _ := client.New(live.endpoint(), client.WithRootCertificate(p.root))
		for b.Loop() {
			run(b, c)
		}
	})
	b.Run("refused-first-warm", func(b *testing.B) {
		c, _ := client.New(list(closed, live.endpoint()), client.WithRootCertificate(p.root))
		for b.Loop() {
			run(b, c)
		}
	})
	b.Run("refused-first-fresh-client", func(b *testing.B) {
		for b.Loop() {
			c, _ := client.New(list(closed, live.endpoint()), client.WithRootCertificate(p.root))
			run(b, c)
		}
	})
	b.Run("one-endpoint-fresh-client", func(b *testing.B) {
		for b.Loop() {
			c, _ := client.New(live.endpoint(), client.WithRootCertificate(p.root))
			run(b, c)
		}
	})
}
