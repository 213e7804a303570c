package admission

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestSource(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7:443":              "192.0.2.7",
		"[::ffff:192.0.2.7]:443":     "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ff::1]:1":     "2001:db8:1:2::/64",
		"[fe80::1%eth0]:1":           "fe80::/64",
		"not an address":             "not an address",
	} {
		if got := SourceOf(in); got != want {
			t.Errorf("SourceOf(%q) = %q, want %q", in, got, want)
		}
	}
	a := &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 1}
	b := &net.TCPAddr{IP: net.ParseIP("2001:db8::2:3"), Port: 2}
	if Source(a) != Source(b) || Source(a) == Source(&net.TCPAddr{IP: net.ParseIP("2001:db8:0:1::1")}) {
		t.Error("IPv6 addresses are not keyed by their /64")
	}
}

// loopback listens on 127.0.0.1 behind a Listener and accepts in the
// background; admitted connections arrive on the returned channel.
func loopback(t *testing.T, lim Limits) (*Listener, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(ln, lim)
	got := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			got <- c
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l, got
}

// dialFrom connects to l from the loopback address src (127.0.0.0/8
// routes to the loopback interface on Linux).
func dialFrom(t *testing.T, l net.Listener, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c within 250 ms (an
// admitted connection is left open; a refused one is closed at once).
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// accepted waits for the next admitted connection.
func accepted(t *testing.T, got <-chan net.Conn) *Conn {
	t.Helper()
	select {
	case c := <-got:
		return c.(*Conn)
	case <-time.After(5 * time.Second):
		t.Fatal("no connection admitted")
	}
	return nil
}

func TestPerSourceLimit(t *testing.T) {
	l, got := loopback(t, Limits{MaxPerSource: 3})
	var own []net.Conn
	var first *Conn
	for i := range 3 {
		own = append(own, dialFrom(t, l, "127.0.0.1"))
		if c := accepted(t, got); i == 0 {
			first = c
		}
	}
	extra := dialFrom(t, l, "127.0.0.1")
	if !closedByServer(extra) {
		t.Fatal("a fourth connection from the same address was kept")
	}
	other := dialFrom(t, l, "127.0.0.2")
	if c := accepted(t, got); c.Source() != "127.0.0.2" {
		t.Fatalf("admitted %s, want the other address", c.Source())
	}
	if closedByServer(other) {
		t.Fatal("the other address was refused")
	}
	if st := l.Stats(); st.Open != 4 || st.Refused != 1 {
		t.Fatalf("stats %+v", st)
	}
	// A closed connection frees its place.
	first.Close()
	if !closedByServer(own[0]) {
		t.Fatal("closing the server side did not close the connection")
	}
	dialFrom(t, l, "127.0.0.1")
	if c := accepted(t, got); c.Source() != "127.0.0.1" {
		t.Fatalf("admitted %s", c.Source())
	}
}

// TestFairEviction: with all places taken, a newcomer takes the place of
// an idle connection of the address that holds the most; connections in a
// request are never evicted, and an address that already holds the most
// is refused instead of evicting another's.
func TestFairEviction(t *testing.T) {
	l, got := loopback(t, Limits{MaxConns: 4})
	var hog []net.Conn
	var hogSrv []*Conn
	for range 4 {
		hog = append(hog, dialFrom(t, l, "127.0.0.1"))
		hogSrv = append(hogSrv, accepted(t, got))
	}
	// The oldest is in a request: not evictable.
	l.ConnState(hogSrv[0], http.StateActive)
	dialFrom(t, l, "127.0.0.2")
	c := accepted(t, got)
	if c.Source() != "127.0.0.2" {
		t.Fatalf("admitted %s", c.Source())
	}
	l.ConnState(c, http.StateActive)
	if closedByServer(hog[0]) {
		t.Fatal("a connection in a request was evicted")
	}
	if !closedByServer(hog[1]) {
		t.Fatal("the oldest idle connection of the largest source was not evicted")
	}
	// 127.0.0.1 now holds 3, 127.0.0.2 holds 1: a newcomer of
	// 127.0.0.2 (1 → 2) still evicts one of 127.0.0.1's.
	dialFrom(t, l, "127.0.0.2")
	l.ConnState(accepted(t, got), http.StateActive)
	if !closedByServer(hog[2]) {
		t.Fatal("second eviction missing")
	}
	// 2 and 2: a third of 127.0.0.2 would make it the largest: refused.
	if !closedByServer(dialFrom(t, l, "127.0.0.2")) {
		t.Fatal("an address was let evict a smaller one's connection")
	}
	// A new address (0 against 2) evicts again; only hog[3] is idle
	// (127.0.0.2's are in requests).
	dialFrom(t, l, "127.0.0.3")
	accepted(t, got)
	if !closedByServer(hog[3]) {
		t.Fatal("third eviction missing")
	}
	// Now 127.0.0.1 holds one, 127.0.0.2 two in requests: nobody can give
	// way to a newcomer, which is refused.
	l.ConnState(hogSrv[0], http.StateIdle)
	if !closedByServer(dialFrom(t, l, "127.0.0.4")) {
		t.Fatal("admitted beyond the cap without a fair victim")
	}
	if st := l.Stats(); st.Open != 4 || st.Evicted != 3 || st.Refused != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// fakeListener fails with EMFILE a number of times, then blocks.
type fakeListener struct {
	fails   atomic.Int64
	calls   atomic.Int64
	closed  chan struct{}
	closeMu sync.Once
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.calls.Add(1)
	if f.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	<-f.closed
	return nil, net.ErrClosed
}
func (f *fakeListener) Close() error   { f.closeMu.Do(func() { close(f.closed) }); return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{} }

// TestNoFilesPausesAndEvicts: accept failing with EMFILE is retried after
// a growing pause (no spinning), an idle connection of the largest source
// is closed to free a descriptor, and Accept never returns the error.
func TestNoFilesPausesAndEvicts(t *testing.T) {
	f := &fakeListener{closed: make(chan struct{})}
	f.fails.Store(1 << 30)
	l := NewListener(f, Limits{})
	server, client := net.Pipe()
	defer client.Close()
	idle := l.admit(server)
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		errc <- err
	}()
	time.Sleep(600 * time.Millisecond)
	calls := f.calls.Load()
	// 5, 10, 20, ... 250 ms pauses: about 6 calls in 600 ms; a spinning
	// loop would make millions.
	if calls < 2 || calls > 12 {
		t.Fatalf("%d accept calls in 600 ms", calls)
	}
	client.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("the idle connection was not closed to free a descriptor: %v", err)
	}
	if st := l.Stats(); st.NoFiles < 2 || st.Evicted != 1 || st.Open != 0 || !idle.released {
		t.Fatalf("stats %+v", st)
	}
	l.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Accept returned no error after Close")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
}

func TestGate(t *testing.T) {
	g := NewGate(2)
	if first, second, third := g.Enter("a"), g.Enter("a"), g.Enter("a"); !first || !second || third {
		t.Fatal("per-source bound not kept")
	}
	if !g.Enter("b") {
		t.Fatal("another source refused")
	}
	g.Leave("a")
	if !g.Enter("a") || g.InProgress("a") != 2 {
		t.Fatal("a left request does not free a place")
	}
	g.Leave("a")
	g.Leave("a")
	g.Leave("b")
	if len(g.n) != 0 {
		t.Fatalf("sources kept after their last request: %v", g.n)
	}
	u := NewGate(0)
	for range 3 {
		if !u.Enter("x") {
			t.Fatal("no bound refused")
		}
	}
}
