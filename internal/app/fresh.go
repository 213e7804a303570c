package app

import (
	"context"
	"crypto/tls"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
)

// syncer brings an instance up to the newest stored state (core.Core.Sync).
type syncer interface {
	Sync(ctx context.Context) error
}

// handshakeReloadWait bounds one sync started for handshakes: the sync
// itself gives up within the store timeout when the store is away, but
// reloading a newer, large state while the store answers may take longer.
const handshakeReloadWait = 30 * time.Second

// handshakeSyncWait bounds how long a handshake waits for that sync. It is
// below both APIs' handshake timeouts (10 s: the Client API's header
// timeout, which net/http applies to the handshake, and the Marble API's
// handshake timeout), so that a reload slower than that does not end in a
// connection closed without an answer: the handshake then presents the
// certificate the instance has, and every request over it waits for the
// reload (syncing) or is refused with 503.
var handshakeSyncWait = 8 * time.Second

// clientHeaderTimeout bounds a Client API request's headers; net/http
// applies it to the TLS handshake too.
const clientHeaderTimeout = 10 * time.Second

// freshness coalesces the syncs of concurrent TLS handshakes: a handshake
// waits for a sync that STARTED after it arrived (so that it sees every
// change acknowledged before it began), and all handshakes that arrive
// while one sync runs share the next one. However many handshakes come in,
// at most two syncs are under way (one running, one waiting to start), so
// anonymous connections cannot multiply the reads sent to etcd.
type freshness struct {
	s syncer
	// timeout is the store timeout (0: core.DefaultStoreTimeout): how
	// long a failed sync is remembered depends on it (failedRecently).
	timeout time.Duration

	// failedAt is when the last sync failed (Unix nanoseconds; 0 when the
	// last one succeeded): see failedRecently.
	failedAt atomic.Int64

	mu sync.Mutex // protects running and pending
	// running is the sync under way; pending the one that starts when
	// it ends, which new arrivals join.
	running, pending *syncRound
}

type syncRound struct {
	done chan struct{}
	err  error
}

// sync returns after a sync that started after the call (or when ctx
// ends, with its error).
func (f *freshness) sync(ctx context.Context) error {
	f.mu.Lock()
	switch {
	case f.pending != nil:
		r := f.pending
		f.mu.Unlock()
		return wait(ctx, r)
	case f.running != nil:
		r := &syncRound{done: make(chan struct{})}
		f.pending = r
		prev := f.running
		f.mu.Unlock()
		// The next round starts when the running one ends (each has its
		// own deadline, so this goroutine ends within two of them).
		go func() {
			<-prev.done
			f.mu.Lock()
			f.running, f.pending = r, nil
			f.mu.Unlock()
			if prev.err != nil {
				// The store failed just now: this round's waiters get
				// that failure at once instead of a second wait for the
				// store (a failure only ever refuses, never serves a
				// state, so it need not have started after them).
				r.err = prev.err
				f.finish(r)
				return
			}
			f.run(r)
		}()
		return wait(ctx, r)
	default:
		r := &syncRound{done: make(chan struct{})}
		f.running = r
		f.mu.Unlock()
		// In its own goroutine with its own deadline, so that this
		// caller, like those who join, waits no longer than its ctx.
		go f.run(r)
		return wait(ctx, r)
	}
}

// run performs one sync with its own deadline (not a handshake's, which
// others share) and publishes its result. The sync answers within the
// store timeout when the store is away; only a reload of a newer state,
// while the store answers, may take longer (core.Core.Sync).
func (f *freshness) run(r *syncRound) {
	ctx, cancel := context.WithTimeout(context.Background(), handshakeReloadWait)
	r.err = f.s.Sync(ctx)
	cancel()
	f.note(r.err, time.Now())
	f.finish(r)
}

// finish publishes the outcome of round r.
func (f *freshness) finish(r *syncRound) {
	f.mu.Lock()
	if f.running == r {
		f.running = nil
	}
	f.mu.Unlock()
	close(r.done)
}

func wait(ctx context.Context, r *syncRound) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// note records the outcome of a sync finished at now.
func (f *freshness) note(err error, now time.Time) {
	if f == nil {
		return
	}
	if err != nil {
		f.failedAt.Store(now.UnixNano())
	} else {
		f.failedAt.Store(0)
	}
}

// failedRecently reports whether a sync failed less than a moment before
// now (half the store timeout, at most 1 s): the store is then taken to be
// still away, and a request is refused without waiting for it again.
// Only refusals are answered this way, never a state, so a store that came
// back a moment ago costs at most that moment of 503s.
func (f *freshness) failedRecently(now time.Time) bool {
	if f == nil {
		return false
	}
	t := f.failedAt.Load()
	return t != 0 && now.Sub(time.Unix(0, t)) < min(time.Second, f.wait()/2)
}

func (f *freshness) wait() time.Duration {
	if f.timeout <= 0 {
		return core.DefaultStoreTimeout
	}
	return f.timeout
}

// freshCertificate wraps cert so that, with a shared store, every TLS
// handshake first brings this instance up to the stored state: a handshake
// that starts after a change was acknowledged by any instance presents the
// certificates of that state or a newer one (docs/ha.md). When the store
// does not answer within the store timeout, or reloading a newer state
// takes longer than handshakeSyncWait, the certificate this instance has
// is presented; every request over the connection is then checked again
// (syncing): it waits for the reload, or is refused with 503 while the
// store is away.
func freshCertificate(f *freshness, cert func() *tls.Certificate) func() *tls.Certificate {
	if f == nil {
		return cert
	}
	return func() *tls.Certificate {
		if f.failedRecently(time.Now()) {
			// The store was away a moment ago: do not wait for it again;
			// every request over this connection is refused (syncing)
			// until it answers.
			return cert()
		}
		ctx, cancel := context.WithTimeout(context.Background(), handshakeSyncWait)
		defer cancel()
		f.sync(ctx) // an error: the store is away, or a reload takes longer; see above
		return cert()
	}
}
