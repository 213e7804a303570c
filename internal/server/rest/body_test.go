package rest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// TestMemoryBudget: the budget fits two requests of the largest size; one
// source holds at most a quarter of it (or one largest request); a
// reservation over either bound is refused with its own error, and what
// is released is reusable exactly.
func TestMemoryBudget(t *testing.T) {
	b := newMemoryBudget(100, 10)
	if b.size != 100 || b.share != 25 {
		t.Fatalf("size %d share %d", b.size, b.share)
	}
	if err := b.tryReserve("a", 20); err != nil {
		t.Fatal(err)
	}
	if err := b.tryReserve("a", 6); err != errSourceBusy {
		t.Fatalf("over the source's share: %v", err)
	}
	for _, src := range []string{"b", "c", "d"} {
		if err := b.tryReserve(src, 25); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.tryReserve("e", 6); err != errBusy {
		t.Fatalf("over the budget: %v", err)
	}
	b.release("b", 25)
	if b.tryReserve("e", 25) != nil || b.tryReserve("f", 6) != errBusy || b.tryReserve("f", 5) != nil {
		t.Fatal("released memory not reusable exactly")
	}
	for _, src := range []string{"a", "c", "d", "e", "f"} {
		_, n := b.inUse(src)
		b.release(src, n)
	}
	if used, _ := b.inUse(""); used != 0 || len(b.bySource) != 0 {
		t.Fatalf("after every release: %d used, sources %v", used, b.bySource)
	}
	// A small budget grows to fit two of the largest requests, and then
	// one source may take one of them, never all.
	small := newMemoryBudget(1, 40)
	if small.size != 80 || small.share != 40 {
		t.Fatalf("size %d share %d", small.size, small.share)
	}
}

// bodyServer serves the Client API over a real core (state 2) on plain
// HTTP with the smallest body budget (two requests of the largest size)
// and the options given.
func bodyServer(t *testing.T, opts ...func(*Options)) (*httptest.Server, *server) {
	t.Helper()
	c, err := core.New(context.Background(), core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{MaxManifestBytes: 4096, BodyMemory: 1}
	for _, f := range opts {
		f(&o)
	}
	h, s := newServer(c, o)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, s
}

// rawExchange sends a raw HTTP/1.1 request, half-closes the connection
// (the client sends nothing more) and returns the status and body of the
// answer.
func rawExchange(t *testing.T, srv *httptest.Server, request string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") != "application/json" || !json.Valid(raw) {
		t.Fatalf("answer %d %q is not JSend: %q", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	return resp.StatusCode, string(raw)
}

// TestBodyFailuresAreJSendAndReleaseMemory: a malformed chunked body, a body
// cut short, one over the limit, a malformed one and a well-formed one each
// get a JSend answer; every one releases the memory it reserved, and the
// client has its answer only once it is released.
func TestBodyFailuresAreJSendAndReleaseMemory(t *testing.T) {
	srv, s := bodyServer(t)
	head := "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\n"
	big := strings.Repeat("A", 20000)
	for _, tc := range []struct {
		name    string
		request string
		status  int
		want    string
	}{
		{"malformed chunked", head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400, "reading the body"},
		{"cut short", head + "Content-Length: 5000\r\n\r\n" + `{"manifest":"AAAA`, 400, "reading the body"},
		{"chunked cut short", head + "Transfer-Encoding: chunked\r\n\r\n10\r\n" + `{"manifest":"AAA`, 400, "reading the body"},
		{"over the limit", head + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(big)+15) + `{"manifest":"` + big + `"}`, 413, "too large"},
		{"over the limit, chunked", head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n", len(big)+13) + `{"manifest":"` + big + "\r\n0\r\n\r\n", 413, "too large"},
		{"malformed JSON", head + "Content-Length: 3\r\n\r\n{x}", 400, "malformed JSON"},
		{"not a manifest", head + "Content-Length: 19\r\n\r\n" + `{"manifest":"e30="}`, 400, "no allowed packages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := rawExchange(t, srv, tc.request)
			if status != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("answer %d %s; want %d with %q", status, body, tc.status, tc.want)
			}
			if used, _ := s.budget.inUse(""); used != 0 {
				t.Fatalf("%d bytes of the body budget still reserved after the answer", used)
			}
		})
	}
}

// TestBudgetFullAnswers503: while the budget is taken by other sources, a
// body whose bytes do not fit is refused with 503 and Retry-After; a small
// one that still fits is not.
func TestBudgetFullAnswers503(t *testing.T) {
	srv, s := bodyServer(t)
	hold := func(n int64) func() {
		var srcs []string
		for i := 0; n > 0; i++ {
			src := fmt.Sprintf("other %d", i)
			part := min(n, s.budget.share)
			if err := s.budget.tryReserve(src, part); err != nil {
				t.Fatal(err)
			}
			srcs = append(srcs, src)
			n -= part
		}
		return func() {
			for _, src := range srcs {
				_, n := s.budget.inUse(src)
				s.budget.release(src, n)
			}
		}
	}
	free := hold(s.budget.size - decodeCost(600))
	defer free()
	big := `{"manifest":"` + strings.Repeat("A", 4000) + `"}`
	status, body := rawExchange(t, srv, fmt.Sprintf("POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(big), big))
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "busy") || !strings.Contains(body, `"status":"error"`) {
		t.Fatalf("answer %d %s", status, body)
	}
	status, body = rawExchange(t, srv, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n{x}")
	if status != http.StatusBadRequest {
		t.Fatalf("a small body that fits: answer %d %s", status, body)
	}
}

// TestSourceShareAnswers429: a source that holds its share of the budget
// gets 429 with Retry-After for a body that does not fit its share, while
// the budget itself still has room for others.
func TestSourceShareAnswers429(t *testing.T) {
	srv, s := bodyServer(t)
	if err := s.budget.tryReserve("127.0.0.1", s.budget.share-decodeCost(600)); err != nil {
		t.Fatal(err)
	}
	big := `{"manifest":"` + strings.Repeat("A", 4000) + `"}`
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(big), big)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(raw), "your address") {
		t.Fatalf("answer %d Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), raw)
	}
	if used, _ := s.budget.inUse(""); used != s.budget.share-decodeCost(600) {
		t.Fatalf("%d bytes reserved after the refusal", used)
	}
}

// TestMemoryReservedAsBytesArrive: a request declaring a large body and
// sending a few bytes reserves memory for those bytes only, not for its
// Content-Length; the reservation ends with the request.
func TestMemoryReservedAsBytesArrive(t *testing.T) {
	srv, s := bodyServer(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const declared = 9000 // within the manifest body limit
	fmt.Fprintf(conn, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", declared, `{"manifest":"`)
	want := decodeCost(int64(len(`{"manifest":"`)))
	deadline := time.Now().Add(5 * time.Second)
	for {
		used, _ := s.budget.inUse("")
		if used >= decodeCost(declared) {
			t.Fatalf("%d bytes reserved for a body of which %d bytes arrived: reserved by the declared length", used, len(`{"manifest":"`))
		}
		if used == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes reserved, want %d", used, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	conn.Close()
	for used, _ := s.budget.inUse(""); used != 0; used, _ = s.budget.inUse("") {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still reserved after the client went away", used)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSlowBodyCut: after the grace period a body that arrives more slowly
// than the minimum rate is cut with 408 and a message naming the rate; a
// body that keeps the rate passes, however long it takes; a request whose
// body is complete is not cut while its use case runs.
func TestSlowBodyCut(t *testing.T) {
	srv, _ := bodyServer(t, func(o *Options) {
		o.MinBodyRate, o.BodyGrace, o.BodyTimeout = 2000, 300*time.Millisecond, time.Minute
	})
	dial := func() net.Conn {
		conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		return conn
	}
	t.Run("stalled", func(t *testing.T) {
		conn := dial()
		start := time.Now()
		fmt.Fprintf(conn, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		took := time.Since(start)
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(raw), "2000 bytes per second") || !strings.Contains(string(raw), `"status":"fail"`) {
			t.Fatalf("answer %d: %s", resp.StatusCode, raw)
		}
		if took < 300*time.Millisecond || took > 3*time.Second {
			t.Fatalf("cut after %s; the grace is 300ms and the first byte buys 0.5ms", took)
		}
	})
	t.Run("trickle below the rate", func(t *testing.T) {
		conn := dial()
		fmt.Fprintf(conn, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
		done := make(chan struct{})
		go func() { // 100 bytes every 100 ms: 1000 bytes/s
			defer close(done)
			for range 30 {
				if _, err := conn.Write([]byte(strings.Repeat(" ", 100))); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("answer %d: %s", resp.StatusCode, raw)
		}
		conn.Close()
		<-done
	})
	t.Run("steady above the rate", func(t *testing.T) {
		conn := dial()
		body := `{"manifest":"` + strings.Repeat("A", 3000) + `"}`
		fmt.Fprintf(conn, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", len(body))
		go func() { // 250 bytes every 50 ms: 5000 bytes/s, about 0.7 s in all
			for rest := body; rest != ""; {
				n := min(250, len(rest))
				if _, err := io.WriteString(conn, rest[:n]); err != nil {
					return
				}
				rest = rest[n:]
				time.Sleep(50 * time.Millisecond)
			}
		}()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "manifest") { // read whole: not a manifest
			t.Fatalf("answer %d: %s", resp.StatusCode, raw)
		}
	})
}

// slowSetCore is a Coordinator whose manifest set takes a while and fails
// if its request's context ends meanwhile.
type slowSetCore struct{ Coordinator }

func (slowSetCore) CheckSetManifest() error { return nil }

func (slowSetCore) SetManifest(ctx context.Context, _ []byte) (map[string][]byte, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(600 * time.Millisecond):
		return nil, nil
	}
}

// TestCompleteBodyNotCutWhileHandled: once the whole body has arrived, the
// minimum rate's read deadline no longer applies: net/http's background
// read of the connection must not time out (and cancel the request)
// while the use case runs past it.
func TestCompleteBodyNotCutWhileHandled(t *testing.T) {
	srv := httptest.NewServer(New(slowSetCore{}, Options{MaxManifestBytes: 4096, MinBodyRate: 1000, BodyGrace: 50 * time.Millisecond, BodyTimeout: time.Minute}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/api/v2/manifest", "application/json", strings.NewReader(`{"manifest":"e30="}`))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("answer %d: %s", resp.StatusCode, raw)
	}
}

// TestSlowBodyCutHTTP2: over HTTP/2 the minimum rate applies to each
// stream: a stalled body is answered 408 while the connection stays
// usable for the next request.
func TestSlowBodyCutHTTP2(t *testing.T) {
	c, err := core.New(context.Background(), core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(New(c, Options{MaxManifestBytes: 4096, MinBodyRate: 2000, BodyGrace: 300 * time.Millisecond, BodyTimeout: time.Minute}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	hc := srv.Client()
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte("{"))
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v2/manifest", pr)
	req.ContentLength = 5000
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(raw), "too slow") {
		t.Fatalf("%s %d after %s: %s", resp.Proto, resp.StatusCode, time.Since(start), raw)
	}
	resp, err = hc.Get(srv.URL + "/api/v2/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the next request: %d", resp.StatusCode)
	}
}
