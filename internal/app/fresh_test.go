package app

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/server/marbleapi"
)

// countingSyncer is a store sync that takes as long as the test says and
// numbers its runs.
type countingSyncer struct {
	mu      sync.Mutex
	started []time.Time
	release chan struct{} // each run waits for one value (or is closed)
	err     error
}

func (s *countingSyncer) Sync(ctx context.Context) error {
	s.mu.Lock()
	s.started = append(s.started, time.Now())
	s.mu.Unlock()
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.err
}

func (s *countingSyncer) runs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.started)
}

// TestFreshnessWaitsForASyncStartedAfterArrival: a handshake that arrives
// while a sync runs does not take that sync's result (it may have read the
// store before the change the handshake must see); it waits for the next.
func TestFreshnessWaitsForASyncStartedAfterArrival(t *testing.T) {
	s := &countingSyncer{release: make(chan struct{})}
	f := &freshness{s: s}
	first := make(chan error, 1)
	go func() { first <- f.sync(context.Background()) }()
	waitFor(t, func() bool { return s.runs() == 1 })

	arrived := time.Now()
	second := make(chan error, 1)
	go func() { second <- f.sync(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	s.release <- struct{}{} // the first sync ends
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-second:
		t.Fatalf("the second handshake returned (%v) with the sync that started before it arrived", err)
	case <-time.After(50 * time.Millisecond):
	}
	waitFor(t, func() bool { return s.runs() == 2 })
	s.release <- struct{}{}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started[1].After(arrived) {
		t.Fatal("the sync the second handshake waited for started before it arrived")
	}
}

// TestFreshnessCoalesces: however many handshakes arrive while one sync
// runs, they share one next sync (anonymous connections cannot multiply
// the reads sent to etcd).
func TestFreshnessCoalesces(t *testing.T) {
	s := &countingSyncer{release: make(chan struct{})}
	f := &freshness{s: s}
	var wg sync.WaitGroup
	wg.Go(func() { f.sync(context.Background()) })
	waitFor(t, func() bool { return s.runs() == 1 })
	var ok atomic.Int32
	for range 200 {
		wg.Go(func() {
			if f.sync(context.Background()) == nil {
				ok.Add(1)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(s.release) // every run ends at once from now on
	wg.Wait()
	if n := s.runs(); n != 2 {
		t.Fatalf("%d syncs for 201 handshakes, want 2", n)
	}
	if ok.Load() != 200 {
		t.Fatalf("%d of 200 handshakes saw success", ok.Load())
	}
}

// TestFreshnessErrorsAndDeadline: the store's error reaches the waiter,
// and a waiter's own deadline bounds its wait.
func TestFreshnessErrorsAndDeadline(t *testing.T) {
	boom := errors.New("etcd away")
	s := &countingSyncer{release: make(chan struct{}), err: boom}
	close(s.release)
	f := &freshness{s: s}
	if err := f.sync(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the store's", err)
	}

	blocked := &countingSyncer{release: make(chan struct{})}
	f = &freshness{s: blocked}
	go f.sync(context.Background())
	waitFor(t, func() bool { return blocked.runs() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := f.sync(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the waiter's deadline", err)
	}
	close(blocked.release)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFreshnessRemembersAFailureBriefly: after a failed sync the store is
// taken to be away for half the store timeout (at most 1 s), so requests
// and handshakes are refused without waiting again; a success clears it.
func TestFreshnessRemembersAFailureBriefly(t *testing.T) {
	s := &countingSyncer{release: make(chan struct{}), err: errors.New("etcd away")}
	close(s.release)
	f := &freshness{s: s, timeout: 2 * time.Second}
	now := time.Now()
	if f.failedRecently(now) {
		t.Fatal("failed recently before any sync")
	}
	f.sync(context.Background())
	if !f.failedRecently(time.Now()) {
		t.Fatal("a sync that just failed is not remembered")
	}
	if f.failedRecently(time.Now().Add(1100 * time.Millisecond)) {
		t.Fatal("a failure is remembered for more than 1 s")
	}
	f.note(nil, time.Now())
	if f.failedRecently(time.Now()) {
		t.Fatal("a success did not clear the failure")
	}
	short := &freshness{s: s, timeout: 400 * time.Millisecond}
	short.note(errors.New("x"), now)
	if short.failedRecently(now.Add(250 * time.Millisecond)) {
		t.Fatal("with a 400 ms store timeout a failure is remembered past 200 ms")
	}
	var none *freshness // the file store: no freshness
	if none.failedRecently(now) {
		t.Fatal("nil freshness reports a failure")
	}
	none.note(errors.New("x"), now)
}

// TestFreshnessFailurePassesToTheWaitingRound: handshakes that arrived
// while a sync was running get that sync's failure as soon as it ends,
// without a second wait for the store.
func TestFreshnessFailurePassesToTheWaitingRound(t *testing.T) {
	boom := errors.New("etcd away")
	s := &countingSyncer{release: make(chan struct{}), err: boom}
	f := &freshness{s: s}
	go f.sync(context.Background())
	waitFor(t, func() bool { return s.runs() == 1 })
	second := make(chan error, 1)
	go func() { second <- f.sync(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	s.release <- struct{}{} // the first sync fails
	select {
	case err := <-second:
		if !errors.Is(err, boom) {
			t.Fatalf("the waiting handshake got %v, want the failure", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the waiting handshake waited for a second sync after a failure")
	}
	if n := s.runs(); n != 1 {
		t.Fatalf("%d syncs, want 1", n)
	}
}

// TestHandshakeGoesOnDuringASlowReload: a handshake waits for a sync (a
// reload of a large state) at most handshakeSyncWait, which is below both
// APIs' handshake timeouts, and then presents the certificate it has,
// instead of holding the handshake until the server closes the connection.
func TestHandshakeGoesOnDuringASlowReload(t *testing.T) {
	if handshakeSyncWait >= clientHeaderTimeout || handshakeSyncWait >= marbleapi.DefaultHandshakeTimeout {
		t.Fatalf("a handshake waits up to %v for its sync, not below the handshake timeouts (%v, %v)", handshakeSyncWait, clientHeaderTimeout, marbleapi.DefaultHandshakeTimeout)
	}
	saved := handshakeSyncWait
	handshakeSyncWait = 50 * time.Millisecond
	defer func() { handshakeSyncWait = saved }()
	blocked := &countingSyncer{release: make(chan struct{})}
	defer close(blocked.release)
	cert := &tls.Certificate{Certificate: [][]byte{{1}}}
	get := freshCertificate(&freshness{s: blocked}, func() *tls.Certificate { return cert })
	done := make(chan *tls.Certificate, 1)
	go func() { done <- get() }()
	select {
	case got := <-done:
		if got != cert {
			t.Fatal("the handshake got another certificate")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handshake still waits for the reload")
	}
	if blocked.runs() != 1 {
		t.Fatalf("%d syncs, want the one the handshake started", blocked.runs())
	}
}
