package etcdtest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target and can
// lose traffic on purpose: a test puts it between a client and etcd to
// lose etcd in the middle of a write.
type Proxy struct {
	ln     net.Listener
	target string
	// dropRequests / dropReplies swallow the bytes of that direction.
	dropRequests, dropReplies atomic.Bool
	// dropAfter, when positive, makes the proxy drop replies (as
	// DropReplies) from the first request chunk of at least that many bytes on.
	dropAfter atomic.Int64
	// requestBytes / replyBytes count what was forwarded each way.
	requestBytes, replyBytes atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
}

// NewProxy starts a proxy to target (host:port) and stops it when the test
// ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.Cut() })
	return p
}

// Addr returns the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropRequests makes the proxy swallow what clients send (a write never
// reaches etcd).
func (p *Proxy) DropRequests(on bool) { p.dropRequests.Store(on) }

// DropReplies makes the proxy swallow what etcd answers (a write reaches
// etcd, its answer never reaches the client).
func (p *Proxy) DropReplies(on bool) { p.dropReplies.Store(on) }

// DropRepliesAfterRequestOf makes the proxy forward everything until a
// client sends a chunk of at least n bytes (a large write), which still
// reaches etcd; from then on it drops etcd's replies, as DropReplies(true):
// a test loses the answer of exactly that write while the small reads
// before it went through.
func (p *Proxy) DropRepliesAfterRequestOf(n int64) { p.dropAfter.Store(n) }

// Cut closes every open connection (clients reconnect).
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *Proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go p.pipe(out, in, &p.dropRequests, &p.requestBytes, true)
		go p.pipe(in, out, &p.dropReplies, &p.replyBytes, false)
	}
}

// Bytes returns how many bytes the proxy forwarded to etcd (requests) and
// back (replies) so far.
func (p *Proxy) Bytes() (requests, replies int64) {
	return p.requestBytes.Load(), p.replyBytes.Load()
}

func (p *Proxy) pipe(dst, src net.Conn, drop *atomic.Bool, count *atomic.Int64, requests bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if requests && n > 0 {
			if after := p.dropAfter.Load(); after > 0 && int64(n) >= after {
				p.dropAfter.Store(0)
				p.dropReplies.Store(true)
			}
		}
		if n > 0 && !drop.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			count.Add(int64(n))
		}
		if err != nil {
			return
		}
	}
}
