package core

import (
	"context"
	"sync"
	"time"
)

// stateLock serialises state transactions like a sync.Mutex (its zero
// value is unlocked), and can also be waited for with a deadline
// (LockContext): a request must not wait past its own deadline behind one
// slow write.
type stateLock struct{ mu sync.Mutex }

// Lock takes the lock, waiting as long as it takes.
func (l *stateLock) Lock() { l.mu.Lock() }

// TryLock takes the lock if it is free and reports whether it did.
func (l *stateLock) TryLock() bool { return l.mu.TryLock() }

// Unlock releases it.
func (l *stateLock) Unlock() { l.mu.Unlock() }

// LockContext takes the lock, or returns ctx's error when ctx ends first.
// It polls (from 1 ms up to 20 ms apart): it is for the rare wait behind a
// slow change, where a millisecond does not matter.
func (l *stateLock) LockContext(ctx context.Context) error {
	wait := time.Millisecond
	for !l.mu.TryLock() {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
	return nil
}
