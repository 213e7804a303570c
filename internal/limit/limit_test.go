package limit

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// fakeListener hands out connections whose remote addresses the test
// chooses.
type fakeListener struct {
	conns chan net.Conn
}

func newFakeListener() *fakeListener { return &fakeListener{conns: make(chan net.Conn, 100)} }

func (f *fakeListener) Accept() (net.Conn, error) {
	c, ok := <-f.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (f *fakeListener) Close() error   { return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// fakeConn is one end of a pipe with a chosen remote address; closed
// reports whether it was closed.
type fakeConn struct {
	net.Conn
	remote net.Addr
	mu     sync.Mutex
	closed bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.Conn.Close()
}
func (c *fakeConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// harness feeds connections from chosen sources to a Listener, whose
// Accept runs on its own goroutine, and records the refusals.
type harness struct {
	t        *testing.T
	fake     *fakeListener
	l        *Listener
	admitted chan net.Conn
	mu       sync.Mutex
	refused  []Refusal
	port     int
}

func newHarness(t *testing.T, max, perSource int) *harness {
	h := &harness{t: t, fake: newFakeListener(), admitted: make(chan net.Conn, 100)}
	h.l = NewListener(h.fake, Options{Max: max, PerSource: perSource, OnRefuse: func(r Refusal) {
		h.mu.Lock()
		h.refused = append(h.refused, r)
		h.mu.Unlock()
	}})
	go func() {
		for {
			c, err := h.l.Accept()
			if err != nil {
				return
			}
			h.admitted <- c
		}
	}()
	t.Cleanup(func() { close(h.fake.conns) })
	return h
}

// offer offers a connection from ip and returns it and, if it was
// admitted, the listener's Conn (nil when refused: then it was closed).
func (h *harness) offer(ip string) (*fakeConn, net.Conn) {
	h.t.Helper()
	h.port++
	a, b := net.Pipe()
	h.t.Cleanup(func() { a.Close(); b.Close() })
	fc := &fakeConn{Conn: a, remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: h.port}}
	h.fake.conns <- fc
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case c := <-h.admitted:
			if c.RemoteAddr() != fc.remote {
				h.t.Fatalf("admitted %v, offered %v", c.RemoteAddr(), fc.remote)
			}
			return fc, c
		case <-time.After(5 * time.Millisecond):
			h.mu.Lock()
			refused := len(h.refused) > 0 && h.refused[len(h.refused)-1].Remote == fc.remote.String()
			h.mu.Unlock()
			if refused {
				if !fc.isClosed() {
					h.t.Fatalf("a refused connection from %s is not closed", ip)
				}
				return fc, nil
			}
		}
	}
	h.t.Fatalf("a connection from %s was neither admitted nor refused", ip)
	return nil, nil
}

func (h *harness) lastRefusal() Refusal {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.refused) == 0 {
		return Refusal{}
	}
	return h.refused[len(h.refused)-1]
}

func TestPerSourceLimit(t *testing.T) {
	h := newHarness(t, 10, 2)
	for range 2 {
		if _, c := h.offer("192.0.2.1"); c == nil {
			t.Fatal("a source under its limit was refused")
		}
	}
	fc, c := h.offer("192.0.2.1")
	if c != nil || !fc.isClosed() {
		t.Fatal("a third connection from one source was admitted")
	}
	if r := h.lastRefusal(); !errors.Is(r.Reason, ErrSourceFull) || r.Source != "192.0.2.1" {
		t.Fatalf("refusal %+v, want ErrSourceFull for 192.0.2.1", r)
	}
	// Another source is not affected.
	if _, c := h.offer("192.0.2.2"); c == nil {
		t.Fatal("another source was refused")
	}
}

func TestClosingFreesThePlace(t *testing.T) {
	h := newHarness(t, 10, 1)
	_, c := h.offer("192.0.2.1")
	if c == nil {
		t.Fatal("refused")
	}
	c.Close()
	c.Close() // twice frees once
	if total, n := h.l.Held("192.0.2.1"); total != 0 || n != 0 {
		t.Fatalf("after close: held %d (%d from the source)", total, n)
	}
	if _, c := h.offer("192.0.2.1"); c == nil {
		t.Fatal("the source was refused after its connection closed")
	}
}

// TestFullEvictsTheHeaviest: with the server full, a connection from a
// source that holds fewer connections takes the oldest place of the
// heaviest source; one from a source holding as many as any other is
// refused.
func TestFullEvictsTheHeaviest(t *testing.T) {
	h := newHarness(t, 4, 3)
	var hostile []*fakeConn
	for range 3 {
		fc, c := h.offer("192.0.2.1")
		if c == nil {
			t.Fatal("refused under the limits")
		}
		hostile = append(hostile, fc)
	}
	if _, c := h.offer("192.0.2.1"); c != nil {
		t.Fatal("a source got more than PerSource places")
	}
	if _, c := h.offer("192.0.2.9"); c == nil { // the fourth place
		t.Fatal("a new source was refused under the limits")
	}
	// Full. A source holding 1 takes the oldest place of the one holding 3.
	if _, c := h.offer("192.0.2.9"); c == nil {
		t.Fatal("a lighter source was refused while the server is full")
	}
	if !hostile[0].isClosed() || hostile[1].isClosed() || hostile[2].isClosed() {
		t.Fatal("not the oldest connection of the heaviest source was evicted")
	}
	if r := h.lastRefusal(); !errors.Is(r.Reason, ErrEvicted) || r.Source != "192.0.2.1" {
		t.Fatalf("refusal %+v, want ErrEvicted for 192.0.2.1", r)
	}
	if total, n := h.l.Held("192.0.2.1"); total != 4 || n != 2 {
		t.Fatalf("held %d, %d from the heavy source; want 4 and 2", total, n)
	}
	// 2 and 2: neither source takes a place from the other.
	if _, c := h.offer("192.0.2.1"); c != nil {
		t.Fatal("a source took a place from one holding as many")
	}
	if r := h.lastRefusal(); !errors.Is(r.Reason, ErrFull) {
		t.Fatalf("refusal %+v, want ErrFull", r)
	}
	// A third source still gets in.
	if _, c := h.offer("192.0.2.10"); c == nil {
		t.Fatal("a new source was refused")
	}
	if total, _ := h.l.Held(""); total != 4 {
		t.Fatalf("held %d, want 4", total)
	}
	// Holding 1 against 2 and 1: taking a place would leave it at 2,
	// as many as the source it takes from: refused.
	if _, c := h.offer("192.0.2.10"); c != nil {
		t.Fatal("a source took a place from one that would then hold no more than itself")
	}
}

func TestSourceKey(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 5}, "127.0.0.2"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 5}, "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 5}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::1"), Port: 6}, "2001:db8:1:2::/64"},
		{&net.UnixAddr{Name: "/tmp/x", Net: "unix"}, "/tmp/x"},
	} {
		if got := SourceKey(tc.addr); got != tc.want {
			t.Errorf("SourceKey(%v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// TestOverTCP: over real loopback TCP, distinct loopback addresses are
// distinct sources; a refused connection is closed by the server at once
// (the client reads EOF), it does not wait in the accept queue.
func TestOverTCP(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(inner, Options{Max: 100, PerSource: 2})
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial("127.0.0.2")
	dial("127.0.0.2")
	third := dial("127.0.0.2")
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the third connection from one address was not closed by the server: %v", err)
	}
	other := dial("127.0.0.3")
	other.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := other.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("a connection from another address was closed: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestSampler(t *testing.T) {
	s := Sampler{Every: time.Second}
	t0 := time.Unix(1000, 0)
	if ok, n := s.Allow(t0); !ok || n != 0 {
		t.Fatalf("first event: %v %d", ok, n)
	}
	for i := range 5 {
		if ok, _ := s.Allow(t0.Add(time.Duration(i) * 100 * time.Millisecond)); ok {
			t.Fatal("an event within the interval was let through")
		}
	}
	if ok, n := s.Allow(t0.Add(time.Second)); !ok || n != 5 {
		t.Fatalf("after the interval: %v, %d left out, want 5", ok, n)
	}
	if ok, n := s.Allow(t0.Add(3 * time.Second)); !ok || n != 0 {
		t.Fatalf("later: %v %d", ok, n)
	}
}
