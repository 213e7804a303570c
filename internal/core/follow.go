package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
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

// sharedStore is the capability of a store shared by several instances:
// two blobs (the sealed state and the key file, in another store of the
// same backend) written and read together.
type sharedStore interface {
	SavePair(ctx context.Context, blob []byte, prev store.Revision, other store.Store, otherBlob []byte, otherPrev store.Revision) (store.Revision, error)
	LoadPair(ctx context.Context, other store.Store) ([]byte, store.Revision, []byte, store.Revision, error)
	Revisions(ctx context.Context, other store.Store) (store.Revision, store.Revision, error)
}

// historyStore is the capability of a shared store to tell which write
// followed a revision (etcdstore.Store.FirstWriteAfter): after a lost
// reply it decides whether this instance's write landed, even when another
// instance has written on top of it since.
type historyStore interface {
	FirstWriteAfter(ctx context.Context, after store.Revision) ([]byte, error)
}

// changeNotifier is the capability of a shared store to say when another
// instance may have changed it.
type changeNotifier interface {
	Changes(ctx context.Context) <-chan struct{}
}

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
func (c *Core) Shared() bool { return c.vault.shared() != nil }

func (v *vault) shared() sharedStore {
	s, _ := v.data.(sharedStore)
	return s
}

// loadShared reads the sealed state and the key file at one revision; the
// key file is kept for keyFor.
func (v *vault) loadShared(ctx context.Context, s sharedStore) ([]byte, error) {
	blob, rev, key, krev, err := s.LoadPair(ctx, v.key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSharedRead, err)
	}
	v.pairKey, v.pairKeyRev, v.pairLoaded = key, krev, true
	v.keyRev = krev
	if blob == nil {
		v.dataRev, v.disk = "", nil
		return nil, store.ErrNotFound
	}
	v.dataRev = rev
	v.disk = &storedBlob{blob: blob, binding: seal.Binding(blob)}
	return blob, nil
}

// errSharedRead: the shared store cannot be read (etcd unreachable). That
// is no reason for recovery mode: the start fails, a follower keeps its
// state.
var errSharedRead = errors.New("the shared store cannot be read")

// commitShared writes the key file and blob in one compare-and-swap on
// both revisions. A lost swap is store.ErrConflict and changes nothing.
// When the store fails otherwise, the outcome is read back (by the blob's
// binding): landed → nil, as if nothing had failed; not landed → an
// error, nothing changed; unknown → an error, and the next request reloads
// whatever is stored (a repeated swap on the old revisions conflicts when
// the write landed, so nothing is applied twice). When another instance
// has written since, what is stored now says nothing about this write: the
// store's history decides (the first write after the revision this one
// was based on is either this one, which then landed, or another, which
// made this swap fail). Every failure wraps ErrUnavailable (503, Retry-After).
func (v *vault) commitShared(ctx context.Context, s sharedStore, blob, keyFile, dek []byte, mode string, layout *stateLayout) error {
	binding := seal.Binding(blob)
	rev, err := v.saveShared(ctx, s, blob, keyFile, layout)
	if err == nil {
		v.dataRev, v.keyRev = rev, rev
		v.disk = &storedBlob{blob: blob, binding: binding, dek: dek, mode: mode, layout: layout}
		v.committed(keyFile, dek, mode)
		v.committedChunks(layout, rev)
		return nil
	}
	if errors.Is(err, ErrTooLarge) {
		return err
	}
	if errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("storing sealed state: %w", err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.storeTimeout)
	defer cancel()
	for {
		got, grev, _, krev, rerr := s.LoadPair(rctx, v.key)
		if rerr == nil {
			if got != nil && seal.Binding(got) == binding {
				v.dataRev, v.keyRev = grev, krev
				v.disk = &storedBlob{blob: blob, binding: binding, dek: dek, mode: mode, layout: layout}
				v.committed(keyFile, dek, mode)
				v.committedChunks(layout, grev)
				v.log.Warn("the store reported an error, but reading back shows the change was stored", "error", err.Error())
				return nil
			}
			if grev == v.dataRev && krev == v.keyRev {
				return fmt.Errorf("%w: storing sealed state: %w (nothing was changed)", ErrUnavailable, err)
			}
			// Another instance wrote since: the next request follows
			// the newer state whatever happened to this write.
			v.unsure = true
			landed, herr := v.landedBefore(rctx, s, binding)
			switch {
			case herr != nil:
				return fmt.Errorf("%w: storing sealed state: %w; %w (another instance changed the state since, and the store's history does not tell: %v)", ErrUnavailable, err, errOutcomeUnknown, herr)
			case landed:
				// Stored, and another instance built on it: the answer
				// is success; the next request reloads the newer state.
				v.disk = &storedBlob{blob: blob, binding: binding, dek: dek, mode: mode, layout: layout}
				v.committed(keyFile, dek, mode)
				v.committedChunks(layout, "")
				v.log.Warn("the store reported an error, but its history shows the change was stored (another instance has changed the state since)", "error", err.Error())
				return nil
			}
			return fmt.Errorf("%w: storing sealed state: %w (nothing was changed; another instance changed the state first)", ErrUnavailable, err)
		}
		select {
		case <-rctx.Done():
			v.unsure = true
			return fmt.Errorf("%w: storing sealed state: %w; %w (the store cannot be read back: %v)", ErrUnavailable, err, errOutcomeUnknown, rerr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// landedBefore reports whether the write of the blob with binding was the
// first change of the stored state after the revision it was based on
// (the vault's dataRev), from the store's history.
func (v *vault) landedBefore(ctx context.Context, s sharedStore, binding [32]byte) (bool, error) {
	h, ok := s.(historyStore)
	if !ok {
		return false, errors.New("the store keeps no history")
	}
	if v.dataRev == "" {
		return false, errors.New("the write was the first one (no revision to look after)")
	}
	first, err := h.FirstWriteAfter(ctx, v.dataRev)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil // the state did not change since (only the key file did)
	}
	if err != nil {
		return false, err
	}
	return first != nil && seal.Binding(first) == binding, nil
}

// Sync makes sure that the state served is the newest stored one: with a
// shared store it compares the stored revisions (a linearizable read) with
// the ones this instance knows and reloads on a difference. Without a
// shared store it does nothing. An error means the store cannot be reached
// (the request should be refused as unavailable).
func (c *Core) Sync(ctx context.Context) error {
	s := c.vault.shared()
	if s == nil {
		return nil
	}
	// The store timeout bounds the check and the wait for the lock: with
	// the store away the answer comes within it. A reload that follows
	// reads and opens the newer state with the caller's deadline (at
	// most reloadTimeout): a large state may take longer than the store
	// timeout to read while the store answers.
	bctx, cancel := context.WithTimeout(ctx, c.opts.StoreTimeout)
	defer cancel()
	drev, krev, err := s.Revisions(bctx, c.vault.key)
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
	if !c.vault.unsure && drev == c.vault.dataRev && krev == c.vault.keyRev {
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
	if !c.vault.unsure {
		c.clean.Store(&[2]store.Revision{c.vault.dataRev, c.vault.keyRev})
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
	v := &c.vault
	prevDisk, prevData, prevKey := v.disk, v.dataRev, v.keyRev
	v.disk, v.unsure, v.attempted = nil, false, nil
	prevUnreadable := c.unreadable
	c.unreadable = nil
	snap, err := c.load(ctx)
	if err != nil {
		v.disk, v.dataRev, v.keyRev, v.unsure = prevDisk, prevData, prevKey, true
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
	n, ok := c.vault.data.(changeNotifier)
	if !ok || c.vault.shared() == nil {
		return
	}
	changes := n.Changes(ctx)
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
		if err == nil || !errors.Is(err, store.ErrConflict) || c.vault.shared() == nil {
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
