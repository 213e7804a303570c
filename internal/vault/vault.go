// Package vault stores the Coordinator's sealed state so that it survives
// any crash: the sealed blob (sealed_data) and the key file (sealed_key)
// are written in an order that leaves, at every instant, a pair that opens
// together (docs/sealing.md).
//
// # Contract
//
// Serialisation: a Vault is not safe for concurrent use. Its caller (the
// Core) serialises every call under its state lock; only PeerKey may be
// called concurrently (it has its own lock). Different processes on one
// file store are kept apart by the caller (the seal directory's lock);
// instances on a shared store are kept apart by the store's
// compare-and-swap on both revisions.
//
// What is written (two stores, the file store). The blob names its data
// key in its authenticated header (seal.HeaderKeyIDField); a key file
// entry is bound either to a key ID (it opens every blob that names that
// key and decrypts under it) or to one blob (its SHA-256: blobs that name
// no key, written before key IDs, or MarbleRun's). A commit of blob under
// data key K in seal mode m:
//
//   - when the key file holds exactly one entry, K sealed in m bound to
//     K's key ID, and both the stored blob and the new one name K: only
//     the blob is written (one atomic write);
//   - otherwise: 1. the key file is written with K (bound to its key ID
//     when the new blob names it, else to the new blob) AND, unless that
//     entry already opens the stored blob, the current data key bound to
//     the stored blob (its key ID when it names one, else the blob itself);
//     2. the blob is written (on a store that stages, store.Stager, its
//     durable write runs beside 1 and only its placing waits for 1; the
//     key file of a first state may even be staged before the blob
//     exists, StageFirstKey).
//     That is the first state, a new data key, a new seal mode, a key
//     file with a second entry (the commit after a key change drops it),
//     and a key file of format version 1 (converted by its first commit).
//
// A stored blob that was never opened (recovery, a state being replaced)
// gets no entry, and K is bound to the new blob alone when an entry bound
// to its key ID would open the stored blob: no key file opens a state the
// Coordinator did not open before its replacement is stored.
//
// What survives which crash: before or during 1 the old pair; after 1 and
// before 2 completes, the old blob with a key file that still opens it;
// after 2, the new pair; with the blob alone, the old or the new blob,
// both opened by the unchanged key file. Commit returns nil only when the
// new blob is stored with a key file that opens it. On
// an error the stores hold the old state again, or the error wraps
// ErrUnconfirmed (the new state is stored and could not be replaced: the
// caller publishes it), or ErrOutcomeUnknown (the stores could not be read
// back; the next Commit reads them back first). A write each store makes
// must itself be atomic (a rename of a synced file, an etcd transaction):
// the Vault never sees half a blob.
//
// On a shared store (SharedStore: etcd) both are written in one
// compare-and-swap at every commit (the key file as above, or with
// per-instance entries, instancekeys.go): a crash leaves the old pair or
// the new one. A lost
// swap is store.ErrConflict and changes nothing; a failure whose outcome
// the store does not tell is decided by reading back, then by the store's
// history (HistoryStore). A state kept in chunks (ChunkStore) writes its
// chunks with or before the head that references them, and deletes them
// only with a head that no longer does: every stored head finds its
// chunks.
//
// Files the Vault replaces without a state that opens them (a stray key
// file, an unrecovered state) are moved or copied aside, never deleted.
//
// The fault suite of this package (crash_test.go) crashes and fails each
// write step of Commit in turn and checks the contract above; the Core's
// suite (internal/core, fault_test.go) does the same for every use case.
package vault

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

// Vault keeps the sealed state and its key file in two stores (see the
// package comment). After a failed write it reads back what the stores
// hold and puts the old state back when the new blob landed anyway, so
// that memory, revisions and disk agree.
type Vault struct {
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
	// keyFile is what the key store holds when it is known to be one
	// entry bound to a key ID: then a commit under that key and mode of a
	// blob that names it leaves the key file alone. nil: anything else, or
	// unknown (the next commit writes the key file).
	keyFile *heldKey
	// found is the single key-ID entry KeyFor took the key from, until
	// Opened says which seal mode the state has.
	found *seal.KeyEntry
	// pairKey is the key file read together with the blob from a shared
	// store (shared.go), at pairKeyRev; pairLoaded says it was.
	pairKey    []byte
	pairKeyRev store.Revision
	pairLoaded bool

	// early is the key file of a first state staged ahead of its commit
	// (StageFirstKey), until Commit or DiscardFirstKey.
	early *earlyKey

	// Per-instance key entries (instancekeys.go): set on a shared store.
	instances
	// The state in chunks (chunks.go): on a store that keeps them.
	chunked
}

// Options are a Vault's stores and helpers.
type Options struct {
	// Data holds the sealed blob (sealed_data), Key the key file
	// (sealed_key). A Data store that implements SharedStore writes both
	// in one compare-and-swap.
	Data, Key store.Store
	// Sealer seals the data key into the key file.
	Sealer seal.KeySealer
	// Log receives what the caller cannot be told otherwise (a file
	// moved aside, a write that landed after all).
	Log *slog.Logger
	// StoreTimeout bounds a shared store's write and its read-back.
	StoreTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Instance, with a shared store, names this instance's entry in the
	// key file (instancekeys.go); nil writes the single-instance key file.
	Instance *seal.InstanceID
	// Source, if set, is asked for the data key when no entry of the key
	// file opens here.
	Source KeySource
}

// New returns a Vault over o's stores; nothing is read until LoadBlob.
func New(o Options) *Vault {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	v := &Vault{data: o.Data, key: o.Key, sealer: o.Sealer, log: o.Log, storeTimeout: o.StoreTimeout, now: o.Now}
	v.instance, v.source = o.Instance, o.Source
	return v
}

// DataStore and KeyStore are the stores (for copies aside and a key file
// read in another format, MarbleRun's).
func (v *Vault) DataStore() store.Store { return v.data }

// KeyStore: see DataStore.
func (v *Vault) KeyStore() store.Store { return v.key }

// KeyRead records the revision of a key file the caller read from
// KeyStore itself.
func (v *Vault) KeyRead(rev store.Revision) { v.keyRev, v.keyFile = rev, nil }

// Revisions are the revisions of the blob and the key file the Vault
// last read or wrote.
func (v *Vault) Revisions() (data, key store.Revision) { return v.dataRev, v.keyRev }

// Unsure reports whether a failed write left the stores in a state the
// Vault could not read back (the next Commit, or a reload, resolves it).
func (v *Vault) Unsure() bool { return v.unsure }

// Forget drops what the Vault knows of the stored pair, before it is
// loaded again (a reload); undo puts it back, marked unsure, when that
// load fails.
func (v *Vault) Forget() (undo func()) {
	prevDisk, prevData, prevKey := v.disk, v.dataRev, v.keyRev
	v.disk, v.unsure, v.attempted, v.keyFile, v.found = nil, false, nil, nil, nil
	return func() {
		v.disk, v.dataRev, v.keyRev, v.unsure = prevDisk, prevData, prevKey, true
	}
}

// KeepChunks records that the stored blob, when it is blob, is a head
// with chunks layout (opened by recovery): a commit keeps those chunks.
func (v *Vault) KeepChunks(blob []byte, layout *Layout) {
	if d := v.disk; d != nil && layout != nil && bytes.Equal(d.blob, blob) {
		d.layout = layout
	}
}

// storedBlob is a blob in the data store, the key that opens it and the
// seal mode of its state.
type storedBlob struct {
	blob    []byte
	binding [32]byte
	dek     []byte
	mode    string
	// layout is the blob's chunks when it is a head (chunks.go);
	// nil for a single blob, or while the head is not opened.
	layout *Layout
}

// heldKey is a key file of one entry: the data key with key ID id, bound
// to that key ID and sealed in seal mode mode.
type heldKey struct {
	id   [32]byte
	mode string
}

// names reports whether blob names the key ID id in its header.
func names(blob []byte, id [32]byte) bool {
	got, ok := seal.BlobKeyID(blob)
	return ok && got == id
}

// ErrUnconfirmed is wrapped by a commit error after which the new state IS
// stored (the store failed, and putting the old state back failed too): the
// caller publishes the new state, so memory and disk agree, and reports the
// error.
var ErrUnconfirmed = errors.New("the change is stored, but the store reported an error")

// Stored reports whether a commit error still means the new state is the
// stored one (nil, or ErrUnconfirmed).
func Stored(err error) bool { return err == nil || errors.Is(err, ErrUnconfirmed) }

// ErrOutcomeUnknown is wrapped by a commit error after which it cannot be
// told whether the new state was stored (the store could not be read back).
var ErrOutcomeUnknown = errors.New("whether it was stored is unknown")

// LoadBlob reads the sealed blob; store.ErrNotFound when there is none.
func (v *Vault) LoadBlob(ctx context.Context) ([]byte, error) {
	v.DiscardFirstKey()
	if s := v.shared(); s != nil {
		return v.loadShared(ctx, s)
	}
	blob, rev, err := v.data.Load(ctx)
	if err != nil {
		return nil, err
	}
	v.dataRev = rev
	v.disk = &storedBlob{blob: blob, binding: seal.Binding(blob)}
	v.keyFile, v.found = nil, nil
	return blob, nil
}

// KeyProblem says why the key file does not open the stored blob; the
// Coordinator enters recovery mode.
type KeyProblem struct {
	What  string // for the operator
	Cause error
}

// KeyFor reads the key file and unseals the data key bound to blob, or
// says why it cannot.
func (v *Vault) KeyFor(ctx context.Context, blob []byte) ([]byte, *KeyProblem) {
	v.fetched, v.found, v.keyFile = nil, nil, nil
	raw, rev, err := v.loadKey(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &KeyProblem{What: "the sealed data key is missing", Cause: err}
	}
	if err != nil {
		return nil, &KeyProblem{What: "the sealed data key cannot be read", Cause: err}
	}
	v.keyRev = rev
	if seal.IsInstanceKeyFile(raw) {
		return v.instanceKeyFor(ctx, raw, blob)
	}
	entries, err := seal.DecodeKeyFile(raw)
	if err != nil {
		return nil, &KeyProblem{What: "the sealed data key is corrupt", Cause: err}
	}
	e, ok := seal.Find(entries, blob)
	if !ok {
		return nil, &KeyProblem{What: "the sealed data key belongs to another sealed_data (an older or newer sealed_key)", Cause: errors.New("no key file entry is bound to the stored sealed_data")}
	}
	var binding []byte
	if !e.Legacy {
		binding = e.Binding[:]
	} else if seal.ProtectsKey(v.sealer) {
		// The legacy form is the raw data key: in an enclave that is a
		// key the host wrote, whatever the sealer would make of it
		// (docs/threat-model.md).
		return nil, &KeyProblem{What: "sealed_key holds a raw data key (the legacy 32-byte form), which a Coordinator in an enclave never takes from the host's disk", Cause: errRawKeyInEnclave}
	}
	dek, err := v.sealer.UnsealKey(e.Sealed, binding)
	if err != nil {
		return nil, unsealProblem(err)
	}
	if inClear(v.sealer, e.Sealed, dek) {
		return nil, &KeyProblem{What: "sealed_key holds the data key in clear, which a Coordinator in an enclave never takes from the host's disk", Cause: errRawKeyInEnclave}
	}
	if !e.Holds(dek) {
		return nil, &KeyProblem{What: "the sealed data key is not the key its entry of sealed_key names (the key file was changed)", Cause: errOtherKeyID}
	}
	if e.ByKeyID && len(entries) == 1 {
		v.found = &e
	}
	return dek, nil
}

// errOtherKeyID: an entry bound to a key ID unsealed to a key with
// another key ID.
var errOtherKeyID = errors.New("the unsealed data key has another key ID than its key file entry")

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
func unsealProblem(err error) *KeyProblem {
	switch {
	case errors.Is(err, seal.ErrSealedElsewhere):
		return &KeyProblem{What: "the data key was sealed by another enclave (another MRENCLAVE for UniqueKey, another MRSIGNER for ProductKey)", Cause: err}
	case errors.Is(err, seal.ErrOtherSealer):
		return &KeyProblem{What: "the data key was sealed another way (without an enclave?) and is not opened by this Coordinator's sealer", Cause: err}
	}
	return &KeyProblem{What: "the data key cannot be unsealed", Cause: err}
}

// Opened records that dek opens the stored blob, whose state has seal
// mode mode (and, for a head, whose chunks are layout).
func (v *Vault) Opened(dek []byte, mode string, layout *Layout) {
	v.disk.dek, v.disk.mode, v.disk.layout = dek, mode, layout
	if f := v.found; f != nil && f.Binding == seal.KeyID(dek) && names(v.disk.blob, f.Binding) && seal.SealedIn(v.sealer, f.Sealed, mode) {
		v.keyFile = &heldKey{id: f.Binding, mode: mode}
	}
	v.found = nil
	if layout != nil {
		v.cache = layout
	}
	v.remember(dek, mode)
}

// SetStrayKeyAside handles a key file without a blob (left by a crash
// during the first write, or by a lost sealed_data): it opens nothing, so
// it is moved aside (never deleted) and the first commit starts clean.
func (v *Vault) SetStrayKeyAside(ctx context.Context, suffix string) error {
	v.DiscardFirstKey()
	_, rev, err := v.key.Load(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err == nil {
		v.keyRev = rev
	}
	v.keyFile = nil
	where, merr := store.MoveAside(ctx, v.key, suffix)
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
func (v *Vault) Recovered(ctx context.Context, suffix string) error {
	v.DiscardFirstKey()
	v.keyFile = nil
	where, err := store.MoveAside(ctx, v.key, suffix)
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

// ReplaceUnrecovered prepares a new state that replaces an unrecovered one
// (a manifest set in recovery mode): the key file is moved aside and the
// old blob copied aside, both never deleted. The blob itself stays in place
// until the new one overwrites it, so a crash in between still finds the
// old, recoverable state.
func (v *Vault) ReplaceUnrecovered(ctx context.Context, suffix string) ([]string, error) {
	v.DiscardFirstKey()
	var moved []string
	v.keyFile = nil
	where, err := store.MoveAside(ctx, v.key, suffix)
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
		where, err := store.MoveAside(ctx, v.data, suffix)
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

// earlyKey is the key file of a first state staged ahead of its commit
// (StageFirstKey).
type earlyKey struct {
	dek    []byte
	mode   string
	staged store.Staged
}

// StageFirstKey starts writing the key file of a first state (nothing is
// stored yet) under data key dek in seal mode mode ahead of its commit:
// dek sealed in mode and bound to its key ID, the key file Commit writes
// for a first blob that names that key ID. It is staged (store.Stager):
// written and synced in the background while the caller builds the
// state, and invisible until the Commit of such a blob puts it in place
// — then the blob, as always. A caller that gives up before its commit
// calls DiscardFirstKey. Without a key store that stages, on a shared
// store, with a blob stored, or after a write whose outcome is unknown it
// does nothing: Commit writes the key file itself.
func (v *Vault) StageFirstKey(ctx context.Context, dek []byte, mode string) error {
	v.DiscardFirstKey()
	st, ok := v.key.(store.Stager)
	if !ok || v.shared() != nil || v.instance != nil || v.disk != nil || v.unsure {
		return nil
	}
	id := seal.KeyID(dek)
	entry := seal.KeyEntry{Binding: id, ByKeyID: true}
	var err error
	if entry.Sealed, err = v.sealer.SealKey(dek, id[:], mode); err != nil {
		return fmt.Errorf("sealing data key: %w", err)
	}
	keyFile, err := seal.EncodeKeyFile([]seal.KeyEntry{entry})
	if err != nil {
		return err
	}
	v.early = &earlyKey{dek: dek, mode: mode, staged: st.Stage(ctx, keyFile)}
	return nil
}

// fits reports whether the staged key file opens blob, a first state
// under dek in mode: the blob is under its key, in its mode, and names its
// key ID.
func (e *earlyKey) fits(blob, dek []byte, mode string) bool {
	return bytes.Equal(e.dek, dek) && seal.CanonicalMode(e.mode) == seal.CanonicalMode(mode) && names(blob, seal.KeyID(dek))
}

// DiscardFirstKey drops a key file StageFirstKey staged and no Commit used.
func (v *Vault) DiscardFirstKey() {
	if e := v.early; e != nil {
		v.early = nil
		e.staged.Discard()
	}
}

// Commit durably stores blob, sealed under dek. The key file is written
// first when it does not already hold dek, in mode, bound to the key ID
// that blob names (keyFileFor: the new key, plus the current key while it
// changes); then the blob. When the key file already holds it, only the
// blob is written. It returns nil only when the new state is stored with
// a key file that opens it. On an error the stores hold the old state
// again (or, when that fails as well, an error wrapping ErrUnconfirmed
// says that the new state is stored). On a store that keeps chunks, blob
// is a head and layout its chunks.
func (v *Vault) Commit(ctx context.Context, blob, dek []byte, mode string, layout *Layout) error {
	early := v.early
	v.early = nil
	if early != nil && !(v.disk == nil && !v.unsure && early.fits(blob, dek, mode)) {
		early.staged.Discard()
		early = nil
	}
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
	if s := v.shared(); s != nil {
		// One compare-and-swap writes both: the key file goes with it.
		keyFile, _, err := v.keyFileFor(blob, dek, mode)
		if err != nil {
			return err
		}
		return v.commitShared(ctx, s, blob, keyFile, dek, mode, layout)
	}
	var staged store.Staged
	if early != nil || !v.keyFileHolds(blob, dek, mode) {
		var keyFile []byte
		var keyStaged store.Staged
		var held *heldKey
		if early != nil {
			keyStaged, held = early.staged, &heldKey{id: seal.KeyID(dek), mode: mode}
		} else {
			var err error
			if keyFile, held, err = v.keyFileFor(blob, dek, mode); err != nil {
				return err
			}
		}
		// The blob's durable write runs beside the key file's; it is put
		// in place only after the key file is (the order the contract
		// needs is that of the renames, not of the writes).
		if st, ok := v.data.(store.Stager); ok {
			staged = st.Stage(ctx, blob)
		}
		rev, err := put(ctx, v.key, keyStaged, keyFile, v.keyRev)
		if err != nil {
			if staged != nil {
				staged.Discard()
			}
			// Both the old and the new key file open the stored blob:
			// only the revision needs to be read back.
			v.keyFile = nil
			v.reloadKeyRev(ctx)
			return fmt.Errorf("storing sealed data key: %w", err)
		}
		v.keyRev, v.keyFile = rev, held
	}
	rev, err := put(ctx, v.data, staged, blob, v.dataRev)
	if err != nil {
		return v.afterFailedWrite(ctx, blob, dek, mode, err)
	}
	v.dataRev = rev
	v.disk = &storedBlob{blob: blob, binding: binding, dek: dek, mode: mode}
	return nil
}

// put stores blob in s over revision prev: the staged write of blob when
// there is one, else a Save.
func put(ctx context.Context, s store.Store, staged store.Staged, blob []byte, prev store.Revision) (store.Revision, error) {
	if staged != nil {
		return staged.Save(ctx, prev)
	}
	return s.Save(ctx, blob, prev)
}

// keyFileHolds reports whether the stored key file already opens both
// the stored blob and blob, with dek sealed in mode: it is one entry bound
// to dek's key ID, which both blobs name, and the stored blob is under dek.
func (v *Vault) keyFileHolds(blob, dek []byte, mode string) bool {
	k, d := v.keyFile, v.disk
	if k == nil || d == nil || d.dek == nil || !bytes.Equal(d.dek, dek) || seal.CanonicalMode(k.mode) != seal.CanonicalMode(mode) {
		return false
	}
	id := seal.KeyID(dek)
	return k.id == id && names(blob, id) && names(d.blob, id)
}

// keyFileFor builds the key file of a commit of blob under dek: dek bound
// to its key ID when blob names it, else to blob itself; and, when that
// entry does not open the blob still stored, the current key bound to the
// stored blob's key ID (when the stored blob names it) or to the stored
// blob. A stored blob that was never opened (recovery, a state being
// replaced) gets no entry, and the new key is bound to blob alone if an
// entry bound to its key ID would open the stored blob: the key file must
// not open a state the Coordinator did not open before the new state is
// stored. held is the key file when it is the single entry bound to dek's
// key ID.
func (v *Vault) keyFileFor(blob, dek []byte, mode string) (keyFile []byte, held *heldKey, err error) {
	id := seal.KeyID(dek)
	d := v.disk
	newEntry := seal.KeyEntry{Binding: seal.Binding(blob)}
	if names(blob, id) && (d == nil || d.dek != nil || !names(d.blob, id)) {
		newEntry = seal.KeyEntry{Binding: id, ByKeyID: true}
	}
	if newEntry.Sealed, err = v.sealer.SealKey(dek, newEntry.Binding[:], mode); err != nil {
		return nil, nil, fmt.Errorf("sealing data key: %w", err)
	}
	entries := []seal.KeyEntry{newEntry}
	if d != nil && d.dek != nil && !opens(newEntry, dek, d) {
		cur := seal.KeyEntry{Binding: d.binding}
		if curID := seal.KeyID(d.dek); names(d.blob, curID) {
			cur = seal.KeyEntry{Binding: curID, ByKeyID: true}
		}
		if cur.Sealed, err = v.sealer.SealKey(d.dek, cur.Binding[:], d.mode); err != nil {
			return nil, nil, fmt.Errorf("sealing data key: %w", err)
		}
		entries = append(entries, cur)
	}
	if keyFile, err = seal.EncodeKeyFile(entries); err != nil {
		return nil, nil, err
	}
	if len(entries) == 1 && newEntry.ByKeyID {
		held = &heldKey{id: id, mode: mode}
	}
	return keyFile, held, nil
}

// opens reports whether entry e, of key dek, opens the stored blob d.
func opens(e seal.KeyEntry, dek []byte, d *storedBlob) bool {
	if e.ByKeyID {
		return bytes.Equal(d.dek, dek) && names(d.blob, e.Binding)
	}
	return e.Binding == d.binding
}

// loadKey reads the key file: the one read with the blob from a shared
// store, else from the key store.
func (v *Vault) loadKey(ctx context.Context) ([]byte, store.Revision, error) {
	if v.pairLoaded {
		v.pairLoaded = false
		if v.pairKey == nil {
			return nil, "", store.ErrNotFound
		}
		return v.pairKey, v.pairKeyRev, nil
	}
	return v.key.Load(ctx)
}

func (v *Vault) reloadKeyRev(ctx context.Context) {
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
func (v *Vault) afterFailedWrite(ctx context.Context, blob, dek []byte, mode string, cause error) error {
	ctx = context.WithoutCancel(ctx)
	binding := seal.Binding(blob)
	v.attempted = &binding
	v.unsure = true
	if err := v.resolve(ctx); err != nil {
		if errors.Is(err, errNewBlobStays) {
			// The new state is what is stored: adopt it.
			v.disk = &storedBlob{blob: blob, binding: binding, dek: dek, mode: mode}
			v.unsure, v.attempted = false, nil
			return fmt.Errorf("%w (%v), and the previous state could not be put back: %v", ErrUnconfirmed, cause, err)
		}
		return fmt.Errorf("storing sealed state: %w; %w (reading it back: %v)", cause, ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("storing sealed state: %w (nothing was changed)", cause)
}

// errNewBlobStays: the blob of a failed write landed and could not be
// replaced by the previous one.
var errNewBlobStays = errors.New("the new sealed state stays in place")

// resolve reads back the stored blob after a failed write and makes the
// vault agree with it: the old blob (nothing to do), or the blob of the
// failed write (the old one is put back).
func (v *Vault) resolve(ctx context.Context) error {
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
func (v *Vault) putBack(ctx context.Context) error {
	if v.disk == nil {
		if _, err := store.MoveAside(ctx, v.data, "failed-write"); err != nil {
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

// ErrUnavailable is wrapped by a shared store's commit that failed
// because the store cannot be reached (or gave no answer in time);
// nothing was changed unless the error also wraps ErrOutcomeUnknown.
var ErrUnavailable = errors.New("the shared state store is unavailable")

// ErrTooLarge is wrapped by a commit refused because the state, or a
// part of it, exceeds what one write to the store may carry; nothing was
// changed.
var ErrTooLarge = errors.New("the change exceeds a limit of the state")

// limitError is an ErrTooLarge whose message is its cause's alone.
type limitError struct{ err error }

func (e limitError) Error() string   { return e.err.Error() }
func (e limitError) Unwrap() []error { return []error{ErrTooLarge, e.err} }

func tooLarge(err error) error { return limitError{err} }
