package vault

// The key file binds a data key to its key ID, which every blob sealed
// under the key names in its header: a commit that keeps the key writes
// the blob alone (docs/sealing.md, "The commit").

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
)

// saveLog records the Saves of the stores it wraps, in order.
type saveLog struct {
	mu    sync.Mutex
	saves []string // the name of the store of each Save
}

func (l *saveLog) wrap(name string, s store.Store) store.Store {
	return &loggedStore{Store: s, name: name, log: l}
}

// take returns the Saves since the last take.
func (l *saveLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.saves
	l.saves = nil
	return out
}

type loggedStore struct {
	store.Store
	name string
	log  *saveLog
}

func (s *loggedStore) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	s.log.mu.Lock()
	s.log.saves = append(s.log.saves, s.name)
	s.log.mu.Unlock()
	return s.Store.Save(ctx, blob, prev)
}

// Stage stages on the wrapped store (a file store); the log records the
// staged blob when it is put in place.
func (s *loggedStore) Stage(ctx context.Context, blob []byte) store.Staged {
	return &loggedStaged{Staged: s.Store.(store.Stager).Stage(ctx, blob), s: s}
}

type loggedStaged struct {
	store.Staged
	s *loggedStore
}

func (l *loggedStaged) Save(ctx context.Context, prev store.Revision) (store.Revision, error) {
	l.s.log.mu.Lock()
	l.s.log.saves = append(l.s.log.saves, l.s.name)
	l.s.log.mu.Unlock()
	return l.Staged.Save(ctx, prev)
}

func (s *loggedStore) MoveAside(ctx context.Context, suffix string) (string, error) {
	return store.MoveAside(ctx, s.Store, suffix)
}

// loggedVault is a Vault on the files in dir whose Saves go to log.
func loggedVault(t *testing.T, dir string, sealer seal.KeySealer, log *saveLog) *Vault {
	t.Helper()
	d, k := fileStores(t, dir)
	return New(Options{Data: log.wrap("data", d), Key: log.wrap("key", k), Sealer: sealer})
}

// openAs opens the stored state as a restart does, with seal mode mode.
func openAs(t *testing.T, v *Vault, mode string) (blob, dek []byte) {
	t.Helper()
	blob, dek = open(t, v)
	if blob != nil {
		v.Opened(dek, mode, nil)
	}
	return blob, dek
}

func keyEntries(t *testing.T, dir string) []seal.KeyEntry {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "sealed_key"))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := seal.DecodeKeyFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

func sameSaves(got []string, want ...string) bool {
	return fmt.Sprint(got) == fmt.Sprint(want)
}

// A commit under the data key the key file already holds, bound to its key
// ID, saves the data store alone, in the process that wrote the key file
// and after a restart; a new key or a new seal mode writes the key file
// first. (Before key IDs every commit saved the key file, then the data.)
func TestUnchangedKeyWritesOnlyTheBlob(t *testing.T) {
	for sname, sealer := range map[string]seal.KeySealer{"simulation": seal.SimulationKeySealer{}, "gramine": gramineSealer(t)} {
		t.Run(sname, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			log := &saveLog{}
			k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
			v := loggedVault(t, dir, sealer, log)
			openAs(t, v, "")
			steps := []struct {
				v       version
				restart bool
				want    []string
			}{
				{version{sealed(t, k1, "first state", true), k1, ""}, false, []string{"key", "data"}},
				{version{sealed(t, k1, "same key", true), k1, ""}, false, []string{"data"}},
				{version{sealed(t, k1, "same key again", true), k1, ""}, false, []string{"data"}},
				{version{sealed(t, k1, "same key after a restart", true), k1, ""}, true, []string{"data"}},
				{version{sealed(t, k1, "same key, ProductKey named", true), k1, "ProductKey"}, false, []string{"data"}},
				{version{sealed(t, k2, "new key", true), k2, ""}, false, []string{"key", "data"}},
				{version{sealed(t, k2, "drops the old key's entry", true), k2, ""}, false, []string{"key", "data"}},
				{version{sealed(t, k2, "same new key", true), k2, ""}, false, []string{"data"}},
				{version{sealed(t, k2, "new seal mode", true), k2, "UniqueKey"}, false, []string{"key", "data"}},
				{version{sealed(t, k2, "same mode", true), k2, "UniqueKey"}, false, []string{"data"}},
				{version{sealed(t, k2, "same mode after a restart", true), k2, "UniqueKey"}, true, []string{"data"}},
			}
			mode := ""
			for _, s := range steps {
				if s.restart {
					v = loggedVault(t, dir, sealer, log)
					openAs(t, v, mode)
				}
				log.take()
				if err := v.Commit(ctx, s.v.blob, s.v.dek, s.v.mode, nil); err != nil {
					t.Fatalf("%s: %v", s.v.blob, err)
				}
				if got := log.take(); !sameSaves(got, s.want...) {
					t.Errorf("commit %q saves %v, want %v", plaintextOf(t, s.v), got, s.want)
				}
				mode = s.v.mode
				if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, s.v.blob) || !bytes.Equal(dek, s.v.dek) {
					t.Fatalf("after %q a restart opens another state", plaintextOf(t, s.v))
				}
			}
		})
	}
}

func plaintextOf(t *testing.T, v version) string {
	t.Helper()
	_, pt, err := seal.Open(v.dek, v.blob)
	if err != nil {
		t.Fatal(err)
	}
	return string(pt)
}

// A key change writes the key file first, with the new key bound to its
// key ID and the current key bound to the key ID the stored blob names.
func TestKeyChangeWritesTheKeyFileFirst(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	log := &saveLog{}
	sealer := gramineSealer(t)
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	v := loggedVault(t, dir, sealer, log)
	openAs(t, v, "")
	if err := v.Commit(ctx, sealed(t, k1, "one", true), k1, "", nil); err != nil {
		t.Fatal(err)
	}
	log.take()
	if err := v.Commit(ctx, sealed(t, k2, "two", true), k2, "UniqueKey", nil); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !sameSaves(got, "key", "data") {
		t.Fatalf("a key change saves %v, want the key file, then the data", got)
	}
	entries := keyEntries(t, dir)
	if len(entries) != 2 || !entries[0].ByKeyID || entries[0].Binding != seal.KeyID(k2) || !entries[1].ByKeyID || entries[1].Binding != seal.KeyID(k1) {
		t.Fatalf("key file after a key change: %+v", entries)
	}
	modes := []string{"UniqueKey", "ProductKey"}
	for i, e := range entries {
		if !seal.SealedIn(sealer, e.Sealed, modes[i]) {
			t.Errorf("entry %d is not sealed in %s", i, modes[i])
		}
	}
}

// A key file of format version 1 (bound to the blob) with a blob that
// names no key, as written before key IDs, opens; the first commit writes
// a key file of version 3 with the key bound to its key ID and to the old
// blob (so a crash before the blob is written still opens the old blob:
// every crash point is in TestCommitSurvivesEveryFault, sequence "named"),
// the next drops the old blob's entry, and the one after writes the blob
// alone.
func TestBlobBoundKeyFileIsConverted(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sealer := gramineSealer(t)
	k := bytes.Repeat([]byte{7}, 32)
	old := sealed(t, k, "written before key IDs", false)
	b := seal.Binding(old)
	sk, err := sealer.SealKey(k, b[:], "")
	if err != nil {
		t.Fatal(err)
	}
	v1, err := seal.EncodeKeyFile([]seal.KeyEntry{{Binding: b, Sealed: sk}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sealed_data"), old, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sealed_key"), v1, 0o600); err != nil {
		t.Fatal(err)
	}
	log := &saveLog{}
	v := loggedVault(t, dir, sealer, log)
	if _, dek := openAs(t, v, ""); !bytes.Equal(dek, k) {
		t.Fatal("the old pair does not open")
	}
	next := sealed(t, k, "first commit with key IDs", true)
	if err := v.Commit(ctx, next, k, "", nil); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !sameSaves(got, "key", "data") {
		t.Fatalf("the converting commit saves %v", got)
	}
	entries := keyEntries(t, dir)
	if len(entries) != 2 || !entries[0].ByKeyID || entries[0].Binding != seal.KeyID(k) || entries[1].ByKeyID || entries[1].Binding != b {
		t.Fatalf("converted key file: %+v", entries)
	}
	for _, blob := range [][]byte{old, next} {
		if e, ok := seal.Find(entries, blob); !ok {
			t.Fatal("the converted key file does not open both blobs")
		} else if dek, err := sealer.UnsealKey(e.Sealed, e.Binding[:]); err != nil || !bytes.Equal(dek, k) {
			t.Fatalf("the converted key file's entry does not unseal: %v", err)
		}
	}
	for i, want := range [][]string{{"key", "data"}, {"data"}} {
		if err := v.Commit(ctx, sealed(t, k, fmt.Sprint("after ", i), true), k, "", nil); err != nil {
			t.Fatal(err)
		}
		if got := log.take(); !sameSaves(got, want...) {
			t.Fatalf("commit %d after the conversion saves %v, want %v", i+1, got, want)
		}
	}
	if entries := keyEntries(t, dir); len(entries) != 1 || !entries[0].ByKeyID {
		t.Fatalf("key file after the conversion: %+v", entries)
	}
}

// An entry bound to one key ID opens no blob that names another: it is not
// found for it, and relabelled to the other key ID it does not unseal (an
// enclave sealer authenticates the binding) or unseals to a key of another
// ID (the simulation sealer, which cannot). A blob that names a key it is
// not sealed under gets that key, and does not decrypt with it.
func TestKeyIDEntryOpensOnlyBlobsOfItsKey(t *testing.T) {
	ctx := context.Background()
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	for sname, sealer := range map[string]seal.KeySealer{"simulation": seal.SimulationKeySealer{}, "gramine": gramineSealer(t)} {
		id1, id2 := seal.KeyID(k1), seal.KeyID(k2)
		sk1, err := sealer.SealKey(k1, id1[:], "")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name  string
			entry seal.KeyEntry
			blob  []byte
		}{
			{"another key's blob", seal.KeyEntry{Binding: id1, ByKeyID: true, Sealed: sk1}, sealed(t, k2, "under k2", true)},
			{"entry relabelled", seal.KeyEntry{Binding: id2, ByKeyID: true, Sealed: sk1}, sealed(t, k2, "under k2", true)},
			{"a blob that names no key", seal.KeyEntry{Binding: id1, ByKeyID: true, Sealed: sk1}, sealed(t, k1, "under k1", false)},
		} {
			t.Run(sname+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				kf, err := seal.EncodeKeyFile([]seal.KeyEntry{tc.entry})
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "sealed_data"), tc.blob, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "sealed_key"), kf, 0o600); err != nil {
					t.Fatal(err)
				}
				v := restart(t, dir, sealer)
				blob, err := v.LoadBlob(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if dek, kp := v.KeyFor(ctx, blob); kp == nil {
					t.Fatalf("the entry of key ID %x gives a key (%x) for the blob", tc.entry.Binding[:4], dek[:4])
				}
			})
		}
		t.Run(sname+"/a blob naming another key", func(t *testing.T) {
			dir := t.TempDir()
			// Sealed under k2, naming k1 (only whoever holds k2 can make it).
			hdr := []byte(`{"` + seal.HeaderKeyIDField + `":"` + seal.KeyIDText(k1) + `"}`)
			blob, err := seal.Seal(nil, k2, hdr, []byte("under k2"))
			if err != nil {
				t.Fatal(err)
			}
			kf, _ := seal.EncodeKeyFile([]seal.KeyEntry{{Binding: id1, ByKeyID: true, Sealed: sk1}})
			os.WriteFile(filepath.Join(dir, "sealed_data"), blob, 0o600)
			os.WriteFile(filepath.Join(dir, "sealed_key"), kf, 0o600)
			_, dek := open(t, restart(t, dir, sealer))
			if _, _, err := seal.Open(dek, blob); !errors.Is(err, seal.ErrDecrypt) {
				t.Fatalf("a blob opens under the key it names but is not sealed under: %v", err)
			}
		})
	}
}

// A stored blob that was never opened (a recovery, a state being replaced)
// is not opened by the key file of the commit that replaces it, even when
// it names the same key ID: the new key is bound to the new blob until
// that is stored, so a crash in between leaves the old state as it was
// (unopened: recovery mode again).
func TestUnopenedBlobStaysUnopened(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sealer := gramineSealer(t)
	k := bytes.Repeat([]byte{3}, 32)
	stored := sealed(t, k, "the unreadable state", true)
	if err := os.WriteFile(filepath.Join(dir, "sealed_data"), stored, 0o600); err != nil {
		t.Fatal(err)
	}
	d, key := fileStores(t, dir)
	log := &saveLog{}
	v := New(Options{Data: log.wrap("data", d), Key: log.wrap("key", key), Sealer: sealer})
	if _, err := v.LoadBlob(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Recovered(ctx, "unusable"); err != nil {
		t.Fatal(err)
	}
	recovered := sealed(t, k, "recovered", true)
	// The key file is written; the blob's write fails before it lands.
	v.data = failingSave{v.data}
	if err := v.Commit(ctx, recovered, k, "", nil); err == nil {
		t.Fatal("the commit succeeds without its blob")
	}
	entries := keyEntries(t, dir)
	if _, ok := seal.Find(entries, stored); ok {
		t.Fatalf("the recovery's key file opens the blob it has not replaced: %+v", entries)
	}
	if _, ok := seal.Find(entries, recovered); !ok {
		t.Fatal("the recovery's key file does not open the recovered blob")
	}
	// Once the recovered state is stored, the key is bound to its key ID.
	v.data = v.data.(failingSave).Store
	for range 2 {
		if err := v.Commit(ctx, recovered, k, "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if entries := keyEntries(t, dir); len(entries) != 1 || !entries[0].ByKeyID {
		t.Fatalf("key file after the recovery: %+v", entries)
	}
}

type failingSave struct{ store.Store }

func (failingSave) Save(context.Context, []byte, store.Revision) (store.Revision, error) {
	return "", errors.New("injected: the disk is full")
}
