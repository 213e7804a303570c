// Package limit bounds the connections a server holds, fairly between the
// sources they come from (docs/http.md, "Connection limits"): each source
// (an IPv4 address, or an IPv6 /64) may hold at most PerSource connections,
// and all together at most Max. When the server is full, a connection from
// a source that holds fewer connections than the heaviest source takes the
// place of that source's oldest connection; a connection from a source
// that already holds as many as any other is refused. So connections from
// one address, however many, never take more than PerSource places, and
// sources holding few connections are always admitted.
//
// Refused and evicted connections are closed at once: they never wait in
// the kernel's accept queue, where they would hold back the connections
// behind them. The package logs nothing; the caller learns of each refusal
// through a callback, and Sampler rate-limits what it then logs.
package limit

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Reasons a connection was not kept, for Options.OnRefuse.
var (
	// ErrSourceFull: the connection's source already holds PerSource
	// connections.
	ErrSourceFull = errors.New("limit: the source holds its most connections")
	// ErrFull: the server holds Max connections and the source holds as
	// many as any other.
	ErrFull = errors.New("limit: the server holds its most connections")
	// ErrEvicted: the connection was closed to make room for one from a
	// source holding fewer connections.
	ErrEvicted = errors.New("limit: closed for a connection from a source holding fewer")
)

// Options configure a Listener.
type Options struct {
	// Max bounds the connections held at once (at least 1).
	Max int
	// PerSource bounds the connections of one source (at least 1; at most
	// Max).
	PerSource int
	// Key names a connection's source (SourceKey when nil).
	Key func(net.Addr) string
	// OnRefuse, if set, is called (without locks held, on the accepting
	// goroutine) for each connection refused or evicted.
	OnRefuse func(Refusal)
}

// Refusal is a connection that was not kept.
type Refusal struct {
	// Remote is the connection's remote address; Source its source key.
	Remote, Source string
	// Reason is ErrSourceFull, ErrFull or ErrEvicted.
	Reason error
}

// SourceKey names the source of a connection: its IPv4 address (also when
// mapped into IPv6), the /64 prefix of its IPv6 address (one host or site
// usually holds a whole /64), or else the address's string.
func SourceKey(a net.Addr) string {
	var ap netip.AddrPort
	switch t := a.(type) {
	case *net.TCPAddr:
		ap = t.AddrPort()
	default:
		p, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return a.String()
		}
		ap = p
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, err := ip.WithZone("").Prefix(64)
	if err != nil {
		return ip.String()
	}
	return p.String()
}

// Listener is a net.Listener that admits connections as the package
// comment describes.
type Listener struct {
	net.Listener
	opts Options

	mu      sync.Mutex
	total   int
	sources map[string]*source
}

type source struct {
	conns []*Conn // oldest first
}

// NewListener wraps ln. Max and PerSource below 1 count as 1, and a
// PerSource over Max as Max.
func NewListener(ln net.Listener, o Options) *Listener {
	o.Max = max(o.Max, 1)
	o.PerSource = min(max(o.PerSource, 1), o.Max)
	if o.Key == nil {
		o.Key = SourceKey
	}
	return &Listener{Listener: ln, opts: o, sources: map[string]*source{}}
}

// Accept returns the next connection that is admitted; refused ones are
// closed (and reported) in between. Errors are those of the wrapped
// listener.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := l.opts.Key(c.RemoteAddr())
		lc, evicted, reason := l.admit(c, key)
		if evicted != nil {
			evicted.Close()
			l.report(evicted, evicted.source, ErrEvicted)
		}
		if lc != nil {
			return lc, nil
		}
		c.Close()
		l.report(c, key, reason)
	}
}

func (l *Listener) report(c net.Conn, key string, reason error) {
	if l.opts.OnRefuse != nil {
		l.opts.OnRefuse(Refusal{Remote: c.RemoteAddr().String(), Source: key, Reason: reason})
	}
}

// admit decides about a new connection from key: the wrapped connection
// when it is kept (and the connection it replaces, if any), else why not.
func (l *Listener) admit(c net.Conn, key string) (kept, evicted *Conn, reason error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sources[key]
	n := 0
	if s != nil {
		n = len(s.conns)
	}
	if n >= l.opts.PerSource {
		return nil, nil, ErrSourceFull
	}
	if l.total >= l.opts.Max {
		// The heaviest source gives up its oldest connection, if it holds
		// more than this source will.
		var heavy *source
		for _, o := range l.sources {
			if heavy == nil || len(o.conns) > len(heavy.conns) {
				heavy = o
			}
		}
		if heavy == nil || len(heavy.conns) <= n+1 {
			return nil, nil, ErrFull
		}
		evicted = heavy.conns[0]
		l.removeLocked(evicted)
	}
	if s == nil {
		s = &source{}
		l.sources[key] = s
	}
	kept = &Conn{Conn: c, l: l, source: key, Accepted: time.Now()}
	s.conns = append(s.conns, kept)
	l.total++
	return kept, evicted, nil
}

// removeLocked forgets c (l.mu held); false when it was already gone.
func (l *Listener) removeLocked(c *Conn) bool {
	s := l.sources[c.source]
	if s == nil {
		return false
	}
	for i, o := range s.conns {
		if o == c {
			s.conns = append(s.conns[:i], s.conns[i+1:]...)
			l.total--
			if len(s.conns) == 0 {
				delete(l.sources, c.source)
			}
			return true
		}
	}
	return false
}

// Held returns the number of connections held, in all and from the source
// key.
func (l *Listener) Held(key string) (total, fromSource int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sources[key]; s != nil {
		fromSource = len(s.conns)
	}
	return l.total, fromSource
}

// Conn is an admitted connection; closing it frees its place.
type Conn struct {
	net.Conn
	l      *Listener
	source string
	// Accepted is when the connection was admitted.
	Accepted time.Time
}

// Source returns the connection's source key.
func (c *Conn) Source() string { return c.source }

// Close closes the connection and frees its place (once).
func (c *Conn) Close() error {
	c.l.mu.Lock()
	c.l.removeLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// Sampler lets through at most one event per interval and counts the
// others, for a log that an attacker must not be able to flood: the
// caller logs an event only when Allow says so, with the number of events
// left out since the last one logged.
type Sampler struct {
	// Every is the shortest time between two events let through.
	Every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed uint64
}

// Allow reports whether an event at now may be logged and, if so, how
// many events were left out before it.
func (s *Sampler) Allow(now time.Time) (ok bool, suppressed uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.last.IsZero() && now.Sub(s.last) < s.Every {
		s.suppressed++
		return false, 0
	}
	s.last = now
	suppressed, s.suppressed = s.suppressed, 0
	return true, suppressed
}
