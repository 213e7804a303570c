package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
)

// vault keeps the sealed state in two stores, the sealed blob (sealed_data)
// and the key file (sealed_key), so that at every instant, whatever fails or
// is killed between two writes, the stored pair opens together (decision
// D17, docs/sealing.md):
//
//  1. the key file is written with the new data key bound to the new blob
//     AND the current data key bound to the blob still stored;
//  2. the blob is written.
//
// A crash before 2 leaves the old blob, which the key file still opens; a
// crash after it leaves the new one. After a failed write the vault reads
// back what the stores hold and puts the old state back when the new blob
// landed anyway, so that memory, revisions and disk agree.
type vault struct {
	data, key store.Store
	sealer    seal.KeySealer
	log       *slog.Logger
	// storeTimeout bounds a shared store's write and its read-back.
	storeTimeout time.Duration
	// now is the clock (of the chunk sweep).
	now func() time.Time

	dataRev, keyRev store.Revision
	// disk is the blob the data store holds and the data key that opens it
	// (nil when nothing is stored; dek nil while it is unknown, in
	// recovery mode).
	disk *storedBlob
	// unsure is set when a failed write left the stores in a state the
	// vault could not read back; the next commit resolves it first.
	unsure bool
	// attempted is the binding of the blob of the last failed write.
	attempted *[32]byte
	// pairKey is the key file read together with the blob from a shared
	// store (follow.go), at pairKeyRev; pairLoaded says it was.
	pairKey    []byte
	pairKeyRev store.Revision
	pairLoaded bool

	// Per-instance key entries (instancekeys.go): set on a shared store.
	instances
	// The state in chunks (vaultchunks.go): on a store that keeps them.
	chunked
}

// storedBlob is a blob in the data store, the key that opens it and the
// seal mode of its state.
type storedBlob struct {
	blob    []byte
	binding [32]byte
	dek     []byte
	mode    string
	// layout is the blob's chunks when it is a head (vaultchunks.go);
	// nil for a single blob, or while the head is not opened.
	layout *stateLayout
}

// errUnconfirmed is wrapped by a commit error after which the new state IS
// stored (the store failed, and putting the old state back failed too): the
// caller publishes the new state, so memory and disk agree, and reports the
// error.
var errUnconfirmed = errors.New("the change is stored, but the store reported an error")

// stored reports whether a commit error still means the new state is the
// stored one (nil, or errUnconfirmed).
func stored(err error) bool { return err == nil || errors.Is(err, errUnconfirmed) }

// errOutcomeUnknown is wrapped by a commit error after which it cannot be
// told whether the new state was stored (the store could not be read back).
var errOutcomeUnknown = errors.New("whether it was stored is unknown")

// Outcome is what a state change that failed left in the store.
type Outcome int

const (
	// NotStored: the store holds the state from before the change.
	NotStored Outcome = iota
	// Stored: the change is stored although the request failed (the
	// store reported an error after the write landed, and the previous
	// state could not be put back).
	Stored
	// OutcomeUnknown: whether the change was stored cannot be told (the
	// store could not be read back after a failed write).
	OutcomeUnknown
)

// OutcomeOf tells what the state change whose use case failed with err
// left in the store, for answers that must say so (an abandoned request,
// say). Every use case stores its change last, and a commit error that
// cannot say "nothing was changed" wraps errUnconfirmed or
// errOutcomeUnknown: any other failure stored nothing.
func OutcomeOf(err error) Outcome {
	switch {
	case errors.Is(err, errUnconfirmed):
		return Stored
	case errors.Is(err, errOutcomeUnknown):
		return OutcomeUnknown
	}
	return NotStored
}

// loadBlob reads the sealed blob; store.ErrNotFound when there is none.
func (v *vault) loadBlob(ctx context.Context) ([]byte, error) {
	if s := v.shared(); s != nil {
		return v.loadShared(ctx, s)
	}
	blob, rev, err := v.data.Load(ctx)
	if err != nil {
		return nil, err
	}
	v.dataRev = rev
	v.disk = &storedBlob{blob: blob, binding: seal.Binding(blob)}
	return blob, nil
}

// keyProblem says why the key file does not open the stored blob; the
// Coordinator enters recovery mode.
type keyProblem struct {
	what  string
	cause error
}

// keyFor reads the key file and unseals the data key bound to blob, or
// says why it cannot.
func (v *vault) keyFor(ctx context.Context, blob []byte) ([]byte, *keyProblem) {
	v.fetched = nil
	raw, rev, err := v.loadKey(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &keyProblem{"the sealed data key is missing", err}
	}
	if err != nil {
		return nil, &keyProblem{"the sealed data key cannot be read", err}
	}
	v.keyRev = rev
	if seal.IsInstanceKeyFile(raw) {
		return v.instanceKeyFor(ctx, raw, blob)
	}
	entries, err := seal.DecodeKeyFile(raw)
	if err != nil {
		return nil, &keyProblem{"the sealed data key is corrupt", err}
	}
	e, ok := seal.Find(entries, blob)
	if !ok {
		return nil, &keyProblem{"the sealed data key belongs to another sealed_data (an older or newer sealed_key)", errors.New("no key file entry is bound to the stored sealed_data")}
	}
	var binding []byte
	if !e.Legacy {
		binding = e.Binding[:]
	} else if seal.ProtectsKey(v.sealer) {
		// The legacy form is the raw data key: in an enclave that is a
		// key the host wrote, whatever the sealer would make of it
		// (docs/threat-model.md).
		return nil, &keyProblem{"sealed_key holds a raw data key (the legacy 32-byte form), which a Coordinator in an enclave never takes from the host's disk", errRawKeyInEnclave}
	}
	dek, err := v.sealer.UnsealKey(e.Sealed, binding)
	if err != nil {
		return nil, unsealProblem(err)
	}
	if inClear(v.sealer, e.Sealed, dek) {
		return nil, &keyProblem{"sealed_key holds the data key in clear, which a Coordinator in an enclave never takes from the host's disk", errRawKeyInEnclave}
	}
	return dek, nil
}

// inClear reports whether a sealer that protects the data key returned
// the stored bytes themselves: a key in clear, whatever the sealer made of
// it.
func inClear(sealer seal.KeySealer, sealed, dek []byte) bool {
	return seal.ProtectsKey(sealer) && bytes.Equal(sealed, dek)
}

// errRawKeyInEnclave: a key sealer that protects the data key found it in
// clear in the key file.
var errRawKeyInEnclave = errors.New("a data key stored in clear is not taken under an enclave sealer")

// unsealProblem says why a sealed data key does not unseal.
func unsealProblem(err error) *keyProblem {
	switch {
	case errors.Is(err, seal.ErrSealedElsewhere):
		return &keyProblem{"the data key was sealed by another enclave (another MRENCLAVE for UniqueKey, another MRSIGNER for ProductKey)", err}
	case errors.Is(err, seal.ErrOtherSealer):
		return &keyProblem{"the data key was sealed another way (without an enclave?) and is not opened by this Coordinator's sealer", err}
	}
	return &keyProblem{"the data key cannot be unsealed", err}
}

// opened records that dek opens the stored blob, whose state has seal
// mode mode (and, for a head, whose chunks are layout).
func (v *vault) opened(dek []byte, mode string, layout *stateLayout) {
	v.disk.dek, v.disk.mode, v.disk.layout = dek, mode, layout
	if layout != nil {
		v.cache = layout
	}
	v.remember(dek, mode)
}

// setStrayKeyAside handles a key file without a blob (left by a crash
// during the first write, or by a lost sealed_data): it opens nothing, so
// it is moved aside (never deleted) and the first commit starts clean.
func (v *vault) setStrayKeyAside(ctx context.Context, suffix string) error {
	_, rev, err := v.key.Load(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err == nil {
		v.keyRev = rev
	}
	where, merr := moveAside(ctx, v.key, suffix)
	if merr != nil {
		if err == nil {
			// Readable: the first commit replaces it in place.
			v.log.Warn("sealed_key exists without sealed_data; it opens nothing and will be replaced by the first manifest", "moveAsideError", merr.Error())
			return nil
		}
		return fmt.Errorf("sealed_key exists without sealed_data and can neither be read nor moved aside: %w", merr)
	}
	v.keyRev = ""
	v.log.Warn("sealed_key exists without sealed_data (an interrupted first write, or a lost sealed_data); it opens nothing and was moved aside", "movedTo", where)
	return nil
}

// recovered moves the key file that could not open the stored blob aside,
// so that the commit of the recovered state writes a new one. The key that
// recovery found is deliberately not bound to the stored blob: until the
// recovered state is stored, a restart is in recovery mode as before.
func (v *vault) recovered(ctx context.Context, suffix string) error {
	where, err := moveAside(ctx, v.key, suffix)
	if errors.Is(err, store.ErrNotFound) {
		v.keyRev = ""
		return nil
	}
	if err != nil {
		return fmt.Errorf("moving the unusable sealed_key aside: %w", err)
	}
	v.keyRev = ""
	v.log.Warn("the sealed_key that could not open the state was moved aside", "movedTo", where)
	return nil
}

// replaceUnrecovered prepares a new state that replaces an unrecovered one
// (a manifest set in recovery mode): the key file is moved aside and the
// old blob copied aside, both never deleted. The blob itself stays in place
// until the new one overwrites it, so a crash in between still finds the
// old, recoverable state.
func (v *vault) replaceUnrecovered(ctx context.Context, suffix string) ([]string, error) {
	var moved []string
	where, err := moveAside(ctx, v.key, suffix)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("moving the old sealed data key aside: %w", err)
	default:
		moved = append(moved, where)
	}
	v.keyRev = ""
	if v.disk == nil {
		// The blob could not even be read: move whatever is there aside.
		where, err := moveAside(ctx, v.data, suffix)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return moved, fmt.Errorf("moving the old sealed state aside: %w", err)
		default:
			moved = append(moved, where)
		}
		v.dataRev = ""
		return moved, nil
	}
	copier, ok := v.data.(store.Copier)
	if !ok {
		return moved, errors.New("the store of the sealed state cannot keep a copy of the old state; refusing to overwrite it")
	}
	where, err = copier.CopyAside(ctx, suffix)
	if err != nil {
		return moved, fmt.Errorf("copying the old sealed state aside: %w", err)
	}
	moved = append(moved, where)
	// The copy is kept; the blob in place is overwritten by the new state,
	// and no key opens it any more.
	v.disk.dek = nil
	return moved, nil
}

func moveAside(ctx context.Context, s store.Store, suffix string) (string, error) {
	mover, ok := s.(store.Mover)
	if !ok {
		return "", errors.New("the store cannot move a blob aside")
	}
	return mover.MoveAside(ctx, suffix)
}

// commit durably stores blob, sealed under dek: the key file first (new
// key bound to blob, plus the current key bound to the stored blob), then
// the blob. It returns nil only when both are stored. On an error the
// stores hold the old state again (or, when that fails as well, an error
// wrapping errUnconfirmed says that the new state is stored). On a store
// that keeps chunks, blob is a head and layout its chunks.
func (v *vault) commit(ctx context.Context, blob, dek []byte, mode string, layout *stateLayout) error {
	if v.unsure && v.shared() == nil {
		if err := v.resolve(ctx); err != nil {
			return err
		}
	}
	binding := seal.Binding(blob)
	if s := v.shared(); s != nil && v.instance != nil {
		keyFile, err := v.instanceKeyFile(dek, binding, mode)
		if err != nil {
			return err
		}
		return v.commitShared(ctx, s, blob, keyFile, dek, mode, layout)
	}
	newKey, err := v.sealer.SealKey(dek, binding[:], mode)
	if err != nil {
		return fmt.Errorf("sealing data key: %w", err)
	}
	entries := []seal.KeyEntry{{Binding: binding, Sealed: newKey}}
	if d := v.disk; d != nil && d.dek != nil && d.binding != binding {
		cur, err := v.sealer.SealKey(d.dek, d.binding[:], d.mode)
		if err != nil {
			return fmt.Errorf("sealing data key: %w", err)
		}
		entries = append(entries, seal.KeyEntry{Binding: d.binding, Sealed: cur})
	}
	keyFile, err := seal.EncodeKeyFile(entries)
	if err != nil {
		return err
	}
	if s := v.shared(); s != nil {
		return v.commitShared(ctx, s, blob, keyFile, dek, mode, layout)
	}
	rev, err := v.key.Save(ctx, keyFile, v.keyRev)
	if err != nil {
		// Both the old and the new key file open the stored blob: only
		// the revision needs to be read back.
		v.reloadKeyRev(ctx)
		return fmt.Errorf("storing sealed data key: %w", err)
	}
	v.keyRev = rev
	rev, err = v.data.Save(ctx, blob, v.dataRev)
	if err != nil {
		return v.afterFailedWrite(ctx, blob, dek, mode, err)
	}
	v.dataRev = rev
	v.disk = &storedBlob{blob: blob, binding: binding, dek: dek, mode: mode}
	return nil
}

// loadKey reads the key file: the one read with the blob from a shared
// store, else from the key store.
func (v *vault) loadKey(ctx context.Context) ([]byte, store.Revision, error) {
	if v.pairLoaded {
		v.pairLoaded = false
		if v.pairKey == nil {
			return nil, "", store.ErrNotFound
		}
		return v.pairKey, v.pairKeyRev, nil
	}
	return v.key.Load(ctx)
}

func (v *vault) reloadKeyRev(ctx context.Context) {
	_, rev, err := v.key.Load(context.WithoutCancel(ctx))
	switch {
	case errors.Is(err, store.ErrNotFound):
		v.keyRev = ""
	case err != nil:
		v.unsure = true
	default:
		v.keyRev = rev
	}
}

// afterFailedWrite finds out whether the failed write of blob landed and,
// if it did, puts the old blob back.
func (v *vault) afterFailedWrite(ctx context.Context, blob, dek []byte, mode string, cause error) error {
	ctx = context.WithoutCancel(ctx)
	binding := seal.Binding(blob)
	v.attempted = &binding
	v.unsure = true
	if err := v.resolve(ctx); err != nil {
		if errors.Is(err, errNewBlobStays) {
			// The new state is what is stored: adopt it.
			v.disk = &storedBlob{blob: blob, binding: binding, dek: dek, mode: mode}
			v.unsure, v.attempted = false, nil
			return fmt.Errorf("%w (%v), and the previous state could not be put back: %v", errUnconfirmed, cause, err)
		}
		return fmt.Errorf("storing sealed state: %w; %w (reading it back: %v)", cause, errOutcomeUnknown, err)
	}
	return fmt.Errorf("storing sealed state: %w (nothing was changed)", cause)
}

// errNewBlobStays: the blob of a failed write landed and could not be
// replaced by the previous one.
var errNewBlobStays = errors.New("the new sealed state stays in place")

// resolve reads back the stored blob after a failed write and makes the
// vault agree with it: the old blob (nothing to do), or the blob of the
// failed write (the old one is put back).
func (v *vault) resolve(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	blob, rev, err := v.data.Load(ctx)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("the sealed state cannot be read back: %w", err)
	}
	var binding *[32]byte
	if err == nil {
		b := seal.Binding(blob)
		binding = &b
	}
	switch {
	case binding == nil && v.disk == nil, binding != nil && v.disk != nil && *binding == v.disk.binding:
		v.dataRev = rev
	case binding != nil && v.attempted != nil && *binding == *v.attempted:
		v.dataRev = rev
		if err := v.putBack(ctx); err != nil {
			return fmt.Errorf("%w: %v", errNewBlobStays, err)
		}
	default:
		return errors.New("the stored sealed state was changed by someone else")
	}
	_, krev, err := v.key.Load(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
		v.keyRev = ""
	case err != nil:
		return fmt.Errorf("the sealed data key cannot be read back: %w", err)
	default:
		v.keyRev = krev
	}
	v.unsure, v.attempted = false, nil
	return nil
}

// putBack stores the previous blob again over the blob of a failed write
// (the key file still holds the previous key bound to it).
func (v *vault) putBack(ctx context.Context) error {
	if v.disk == nil {
		if _, err := moveAside(ctx, v.data, "failed-write"); err != nil {
			return err
		}
		v.dataRev = ""
		return nil
	}
	rev, err := v.data.Save(ctx, v.disk.blob, v.dataRev)
	if err != nil {
		return err
	}
	v.dataRev = rev
	return nil
}
