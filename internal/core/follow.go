package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/store"
)

// Several Coordinator instances share one state when their stores are
// shared (etcd): the data store then implements sharedStore, the sealed
// state and the key file are written together in one compare-and-swap on
// both revisions, and read together at one revision. An instance whose
// swap loses reloads the newer state and runs the request again against it
// (as if it had arrived after the other instance's), and every instance
// follows the others' changes (Follow) and checks before a request that it
// serves the newest state (Sync).

// maxConflictRetries bounds how often one request runs again after losing
// a compare-and-swap to another instance.
const maxConflictRetries = 16

// reloadTimeout bounds a reload of a newer state that Sync found (reading
// and opening it while the store answers).
const reloadTimeout = 30 * time.Second

// DefaultStoreTimeout is Options.StoreTimeout's default: how long one step
// with a shared store may take before the request is answered 503.
const DefaultStoreTimeout = 2 * time.Second

// Shared reports whether the state is shared with other instances.
func (c *Core) Shared() bool { return c.vault.Shared() }

// Sync makes sure that the state served is the newest stored one: with a
// shared store it compares the stored revisions (a linearizable read) with
// the ones this instance knows and reloads on a difference. Without a
// shared store it does nothing. An error means the store cannot be reached
// (the request should be refused as unavailable).
func (c *Core) Sync(ctx context.Context) error {
	if !c.vault.Shared() {
		return nil
	}
	// The store timeout bounds the check and the wait for the lock: with
	// the store away the answer comes within it. A reload that follows
	// reads and opens the newer state with the caller's deadline (at
	// most reloadTimeout): a large state may take longer than the store
	// timeout to read while the store answers.
	bctx, cancel := context.WithTimeout(ctx, c.opts.StoreTimeout)
	defer cancel()
	drev, krev, err := c.vault.StoredRevisions(bctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !c.mu.TryLock() {
		// A change of this instance is under way. If the store still
		// holds the state this instance last confirmed it serves, that
		// state is the newest: no need to wait for the change.
		if cl := c.clean.Load(); cl != nil && cl[0] == drev && cl[1] == krev {
			return nil
		}
		// Otherwise wait for it. Behind a reload of a newer state (it
		// brings what this caller needs, and it runs only while the
		// store answers) with the caller's deadline; behind a write no
		// longer than the store timeout: the write itself is bounded,
		// but a request must not stall on it.
		wctx := bctx
		if c.reloading.Load() {
			wctx = ctx
		}
		if err := c.mu.LockContext(wctx); err != nil {
			return fmt.Errorf("%w: another change of this instance is still being stored: %w", ErrUnavailable, err)
		}
	}
	defer c.mu.Unlock()
	if vd, vk := c.vault.Revisions(); !c.vault.Unsure() && drev == vd && krev == vk {
		c.clean.Store(&[2]store.Revision{drev, krev})
		return nil
	}
	c.clean.Store(nil)
	rctx, rcancel := context.WithTimeout(ctx, reloadTimeout)
	defer rcancel()
	c.reloading.Store(true)
	err = c.reload(rctx)
	c.reloading.Store(false)
	if err != nil {
		return err
	}
	if !c.vault.Unsure() {
		vd, vk := c.vault.Revisions()
		c.clean.Store(&[2]store.Revision{vd, vk})
	}
	return nil
}

// refresh reloads the stored state (after a lost compare-and-swap).
func (c *Core) refresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reload(ctx)
}

// reload reads the stored state again and publishes it, as a start would
// (a state this instance cannot open puts it in recovery mode, touching
// nothing). The quote is kept while the root certificate stays. Callers
// hold mu.
func (c *Core) reload(ctx context.Context) error {
	old := c.snap.Load()
	undo := c.vault.Forget()
	prevUnreadable := c.unreadable
	c.unreadable = nil
	snap, err := c.load(ctx)
	if err != nil {
		undo()
		c.unreadable = prevUnreadable
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if snap.state != StateRecovery {
		c.rec.stop()
	}
	if old.ca != nil && snap.ca != nil && old.ca.Root.Equal(snap.ca.Root) {
		snap.quote = old.quote
	} else if q, qerr := c.issueQuote(ctx, snap.ca, nil); qerr == nil {
		snap.quote = q
	} else {
		c.log.Error("no quote for the followed state's root certificate", "error", qerr.Error())
	}
	c.snap.Store(snap)
	if old.state != snap.state || old.fingerprint != snap.fingerprint {
		c.log.Info("followed a state change made by another instance", "state", int(snap.state), "manifestFingerprint", snap.fingerprint)
	}
	return nil
}

// Follow reloads the state whenever the shared store signals a change,
// until ctx ends. Without a shared store that can signal it returns at
// once.
func (c *Core) Follow(ctx context.Context) {
	changes, ok := c.vault.Changes(ctx)
	if !ok {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			sctx, cancel := context.WithTimeout(ctx, reloadTimeout)
			if err := c.Sync(sctx); err != nil && ctx.Err() == nil {
				c.log.Warn("following the shared state failed; the next request tries again", "error", err.Error())
			}
			cancel()
		}
	}
}

// retry runs op (one attempt of a state-changing use case: the public
// SetManifest, Update, ... wrap their try* function in it), and after a compare-and-swap lost to another instance
// reloads the newer state and runs op again: op re-checks the request
// against it, so the answer is the one it would have had after the other
// instance's change.
func retry[T any](c *Core, ctx context.Context, op func() (T, error)) (T, error) {
	// Start from the newest state: a request that arrives after another
	// instance acknowledged a change sees it.
	if err := c.Sync(ctx); err != nil {
		var zero T
		return zero, err
	}
	for attempt := 1; ; attempt++ {
		v, err := op()
		if err == nil || !errors.Is(err, store.ErrConflict) || !c.vault.Shared() {
			return v, err
		}
		if attempt >= maxConflictRetries {
			return v, fmt.Errorf("%w: %d compare-and-swaps in a row lost to other instances: %w", ErrUnavailable, attempt, err)
		}
		c.log.Info("another instance changed the state first; running the request again against the newer state", "attempt", attempt)
		if rerr := c.refresh(ctx); rerr != nil {
			return v, rerr
		}
	}
}
