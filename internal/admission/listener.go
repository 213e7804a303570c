package admission

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Limits are the bounds of a Listener.
type Limits struct {
	// MaxConns bounds the connections open at once, from all sources
	// (0: no bound).
	MaxConns int
	// MaxPerSource bounds the connections open at once from one source
	// (0: no bound).
	MaxPerSource int
}

// Bounds of the pause after accept failed for lack of file descriptors:
// the accept is retried after it, so the loop never spins.
const (
	noFilesPauseMin = 5 * time.Millisecond
	noFilesPauseMax = 250 * time.Millisecond
)

// Stats counts what a Listener did since it was made.
type Stats struct {
	// Open is the number of connections open now.
	Open int
	// Refused counts connections closed at once because their source was
	// at its limit, or all connections were taken and none could give way.
	Refused uint64
	// Evicted counts idle connections closed to admit a newcomer (or to
	// free a file descriptor, see NoFiles).
	Evicted uint64
	// NoFiles counts accepts that failed with EMFILE or ENFILE.
	NoFiles uint64
}

// Listener wraps a TCP listener and admits its connections by source
// (see the package comment). Accept closes the connections it refuses
// itself and returns only admitted ones; when accept fails for lack of
// file descriptors it closes an idle connection of the largest source, if
// there is one, pauses and tries again instead of failing. ConnState must
// be installed as the http.Server's ConnState hook, so that connections in
// the middle of a request are never evicted.
type Listener struct {
	net.Listener
	lim  Limits
	done chan struct{}
	stop sync.Once

	mu      sync.Mutex
	open    int
	sources map[string][]*Conn // connections of each source, oldest first

	refused, evicted, noFiles atomic.Uint64
}

// NewListener admits the connections of ln within lim.
func NewListener(ln net.Listener, lim Limits) *Listener {
	return &Listener{Listener: ln, lim: lim, done: make(chan struct{}), sources: map[string][]*Conn{}}
}

// Limits returns the listener's bounds.
func (l *Listener) Limits() Limits { return l.lim }

// Stats returns the counters.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	open := l.open
	l.mu.Unlock()
	return Stats{Open: open, Refused: l.refused.Load(), Evicted: l.evicted.Load(), NoFiles: l.noFiles.Load()}
}

// Close closes the listener (connections already admitted stay open).
func (l *Listener) Close() error {
	l.stop.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Accept returns the next admitted connection (a *Conn).
func (l *Listener) Accept() (net.Conn, error) {
	pause := noFilesPauseMin
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !NoFiles(err) {
				return nil, err
			}
			l.noFiles.Add(1)
			if v := l.evict(-1); v != nil {
				v.Conn.Close()
			}
			select {
			case <-l.done:
				return nil, err
			case <-time.After(pause):
			}
			pause = min(2*pause, noFilesPauseMax)
			continue
		}
		pause = noFilesPauseMin
		if ac := l.admit(c); ac != nil {
			return ac, nil
		}
	}
}

// NoFiles reports whether err says that the process or the system has
// no file descriptor left (EMFILE, ENFILE).
func NoFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// admit registers c, or closes it and returns nil when it is refused.
func (l *Listener) admit(c net.Conn) *Conn {
	src := Source(c.RemoteAddr())
	l.mu.Lock()
	n := len(l.sources[src])
	if l.lim.MaxPerSource > 0 && n >= l.lim.MaxPerSource {
		l.mu.Unlock()
		l.refused.Add(1)
		c.Close()
		return nil
	}
	var victim *Conn
	if l.lim.MaxConns > 0 && l.open >= l.lim.MaxConns {
		if victim = l.evictLocked(n); victim == nil {
			l.mu.Unlock()
			l.refused.Add(1)
			c.Close()
			return nil
		}
	}
	ac := &Conn{Conn: c, l: l, src: src}
	l.sources[src] = append(l.sources[src], ac)
	l.open++
	l.mu.Unlock()
	if victim != nil {
		victim.Conn.Close()
	}
	return ac
}

// evict unregisters and returns an idle connection of the source holding
// the most, if that source holds at least two more than have (-1: any
// source with at least one); the caller closes it.
func (l *Listener) evict(have int) *Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.evictLocked(have)
}

func (l *Listener) evictLocked(have int) *Conn {
	var best *Conn
	bestLen := have + 1
	for _, conns := range l.sources {
		if len(conns) <= bestLen {
			continue
		}
		for _, c := range conns {
			if !c.active.Load() {
				best, bestLen = c, len(conns)
				break
			}
		}
	}
	if best != nil {
		l.releaseLocked(best)
		l.evicted.Add(1)
	}
	return best
}

// release unregisters c once.
func (l *Listener) release(c *Conn) {
	l.mu.Lock()
	l.releaseLocked(c)
	l.mu.Unlock()
}

func (l *Listener) releaseLocked(c *Conn) {
	if c.released {
		return
	}
	c.released = true
	l.open--
	conns := l.sources[c.src]
	for i, o := range conns {
		if o == c {
			conns = append(conns[:i:i], conns[i+1:]...)
			break
		}
	}
	if len(conns) == 0 {
		delete(l.sources, c.src)
	} else {
		l.sources[c.src] = conns
	}
}

// ConnState is the http.Server hook that tells the listener which
// connections are in a request (never evicted) and which are new or idle.
func (l *Listener) ConnState(c net.Conn, st http.ConnState) {
	if ac := connOf(c); ac != nil {
		ac.active.Store(st == http.StateActive || st == http.StateHijacked)
	}
}

// connOf finds the admitted connection under c (TLS and other wrappers
// that expose it through NetConn).
func connOf(c net.Conn) *Conn {
	for range 8 {
		switch v := c.(type) {
		case *Conn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// Conn is an admitted connection; closing it frees its place.
type Conn struct {
	net.Conn
	l        *Listener
	src      string
	active   atomic.Bool
	released bool // under l.mu
}

// Source is the key of the connection's source address.
func (c *Conn) Source() string { return c.src }

// Close frees the connection's place and closes it.
func (c *Conn) Close() error {
	c.l.release(c)
	return c.Conn.Close()
}
