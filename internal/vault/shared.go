package vault

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
)

// Several Coordinator instances share one state when their stores are
// shared (etcd): the data store then implements SharedStore, and the
// sealed state and the key file are written together in one
// compare-and-swap on both revisions, and read together at one revision.

// SharedStore is the capability of a store shared by several instances:
// two blobs (the sealed state and the key file, in another store of the
// same backend) written and read together.
type SharedStore interface {
	SavePair(ctx context.Context, blob []byte, prev store.Revision, other store.Store, otherBlob []byte, otherPrev store.Revision) (store.Revision, error)
	LoadPair(ctx context.Context, other store.Store) ([]byte, store.Revision, []byte, store.Revision, error)
	Revisions(ctx context.Context, other store.Store) (store.Revision, store.Revision, error)
}

// HistoryStore is the capability of a shared store to tell which write
// followed a revision (etcdstore.Store.FirstWriteAfter): after a lost
// reply it decides whether this instance's write landed, even when another
// instance has written on top of it since.
type HistoryStore interface {
	FirstWriteAfter(ctx context.Context, after store.Revision) ([]byte, error)
}

// ChangeNotifier is the capability of a shared store to say when another
// instance may have changed it.
type ChangeNotifier interface {
	Changes(ctx context.Context) <-chan struct{}
}

// Shared reports whether the stores are shared with other instances.
func (v *Vault) Shared() bool { return v.shared() != nil }

// StoredRevisions reads the revisions the shared store holds now (a
// linearizable read); compare them with Revisions.
func (v *Vault) StoredRevisions(ctx context.Context) (data, key store.Revision, err error) {
	s := v.shared()
	if s == nil {
		return "", "", errors.New("the store is not shared")
	}
	return s.Revisions(ctx, v.key)
}

// Changes signals when another instance may have changed the shared
// store; ok is false when the store cannot tell.
func (v *Vault) Changes(ctx context.Context) (changes <-chan struct{}, ok bool) {
	n, ok := v.data.(ChangeNotifier)
	if !ok || v.shared() == nil {
		return nil, false
	}
	return n.Changes(ctx), true
}

func (v *Vault) shared() SharedStore {
	s, _ := v.data.(SharedStore)
	return s
}

// loadShared reads the sealed state and the key file at one revision; the
// key file is kept for KeyFor.
func (v *Vault) loadShared(ctx context.Context, s SharedStore) ([]byte, error) {
	blob, rev, key, krev, err := s.LoadPair(ctx, v.key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSharedRead, err)
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

// ErrSharedRead: the shared store cannot be read (etcd unreachable). That
// is no reason for recovery mode: the start fails, a follower keeps its
// state.
var ErrSharedRead = errors.New("the shared store cannot be read")

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
func (v *Vault) commitShared(ctx context.Context, s SharedStore, blob, keyFile, dek []byte, mode string, layout *Layout) error {
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
				return fmt.Errorf("%w: storing sealed state: %w; %w (another instance changed the state since, and the store's history does not tell: %v)", ErrUnavailable, err, ErrOutcomeUnknown, herr)
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
			return fmt.Errorf("%w: storing sealed state: %w; %w (the store cannot be read back: %v)", ErrUnavailable, err, ErrOutcomeUnknown, rerr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// landedBefore reports whether the write of the blob with binding was the
// first change of the stored state after the revision it was based on
// (the vault's dataRev), from the store's history.
func (v *Vault) landedBefore(ctx context.Context, s SharedStore, binding [32]byte) (bool, error) {
	h, ok := s.(HistoryStore)
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
