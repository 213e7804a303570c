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

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

func TestMemoryBudget(t *testing.T) {
	b := &memoryBudget{size: 10}
	if !b.tryReserve(6) || !b.tryReserve(4) {
		t.Fatal("reservations within the budget refused")
	}
	if b.tryReserve(1) {
		t.Fatal("reservation beyond the budget accepted")
	}
	b.release(4)
	if !b.tryReserve(3) || b.tryReserve(2) {
		t.Fatal("released memory not reusable exactly")
	}
}

// bodyServer serves the Client API over a real core (state 2) on plain
// HTTP with the smallest body budget: one request of the largest size at a
// time.
func bodyServer(t *testing.T) (*httptest.Server, *server) {
	t.Helper()
	c, err := core.New(context.Background(), core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	h, s := newServer(c, Options{MaxManifestBytes: 4096, BodyMemory: 1})
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
			s.budget.mu.Lock()
			used := s.budget.used
			s.budget.mu.Unlock()
			if used != 0 {
				t.Fatalf("%d bytes of the body budget still reserved after the answer", used)
			}
		})
	}
}

// TestBudgetFullAnswers503: while one request of the largest size is being
// read, a second is refused with 503 and Retry-After; a small one that
// still fits is not.
func TestBudgetFullAnswers503(t *testing.T) {
	srv, s := bodyServer(t)
	s.budget.mu.Lock()
	size := s.budget.size
	s.budget.mu.Unlock()
	if !s.budget.tryReserve(size - decodeCost(600)) {
		t.Fatal("cannot take the budget")
	}
	status, body := rawExchange(t, srv, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n{}")
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "busy") || !strings.Contains(body, `"status":"error"`) {
		t.Fatalf("answer %d %s", status, body)
	}
	status, body = rawExchange(t, srv, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n{x}")
	if status != http.StatusBadRequest {
		t.Fatalf("a small body that fits: answer %d %s", status, body)
	}
	s.budget.release(size - decodeCost(600))
}
