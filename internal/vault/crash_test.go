package vault

// The Vault's own fault suite: each commit of a sequence (the first state,
// a change under the same data key, a new data key, a new seal mode) runs
// with a failure or a crash injected at each of its write steps in turn.
// Afterwards a fresh Vault on the same files must open the state from
// before or the state after the commit — never nothing, never a third
// pair — and the state after whenever Commit said it was stored. When the
// process goes on after a failed write, the next commit must work and be
// what a fresh Vault opens. This is the contract of the package comment;
// a change of the commit path (fewer syncs, grouped commits) must keep
// this suite green.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

// version is one state of the sequence: an opaque blob, the data key it is
// committed under and its seal mode.
type version struct {
	blob []byte
	dek  []byte
	mode string
}

func versions() []version {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	return []version{
		{[]byte("state 1"), k1, "ProductKey"},
		{[]byte("state 2, same key"), k1, "ProductKey"},
		{[]byte("state 3, new key"), k2, "ProductKey"},
		{[]byte("state 4, new seal mode"), k2, "UniqueKey"},
	}
}

// namedVersions is a sequence of sealed blobs whose headers name their
// data key (seal.HeaderKeyIDField), after a first blob that names none (as
// written before key IDs, with a key file bound to it): the conversion of
// that key file, the commit that drops the converted entry, commits that
// write only the blob, a new key, and a new seal mode of the same key.
func namedVersions(t testing.TB) []version {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	return []version{
		{sealed(t, k1, "state 1, names no key", false), k1, "ProductKey"},
		{sealed(t, k1, "state 2, converts the key file", true), k1, "ProductKey"},
		{sealed(t, k1, "state 3, drops the old blob's entry", true), k1, "ProductKey"},
		{sealed(t, k1, "state 4, the blob alone", true), k1, "ProductKey"},
		{sealed(t, k2, "state 5, new key", true), k2, "ProductKey"},
		{sealed(t, k2, "state 6, the blob alone", true), k2, "ProductKey"},
		{sealed(t, k2, "state 7, new seal mode", true), k2, "UniqueKey"},
		{sealed(t, k2, "state 8, the blob alone", true), k2, "UniqueKey"},
	}
}

// sealed seals plaintext under dek with a JSON header that names dek's
// key ID when named is set.
func sealed(t testing.TB, dek []byte, plaintext string, named bool) []byte {
	t.Helper()
	hdr := []byte(`{"format":1}`)
	if named {
		hdr = []byte(`{"format":1,"` + seal.HeaderKeyIDField + `":"` + seal.KeyIDText(dek) + `"}`)
	}
	b, err := seal.Seal(nil, dek, hdr, []byte(plaintext))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fileStores(t *testing.T, dir string) (data, key store.Store) {
	t.Helper()
	d, err := filestore.New(dir, "sealed_data")
	if err != nil {
		t.Fatal(err)
	}
	k, err := filestore.New(dir, "sealed_key")
	if err != nil {
		t.Fatal(err)
	}
	return d, k
}

// open starts a Vault on the stores as a restart does: it returns the
// stored blob and the data key that opens it (nil, nil: nothing stored).
func open(t *testing.T, v *Vault) (blob, dek []byte) {
	t.Helper()
	ctx := context.Background()
	blob, err := v.LoadBlob(ctx)
	if errors.Is(err, store.ErrNotFound) {
		if err := v.SetStrayKeyAside(ctx, "orphaned"); err != nil {
			t.Fatal(err)
		}
		return nil, nil
	}
	if err != nil {
		t.Fatalf("the stored blob cannot be read: %v", err)
	}
	dek, kp := v.KeyFor(ctx, blob)
	if kp != nil {
		t.Fatalf("the key file does not open the stored blob %q: %s: %v", blob, kp.What, kp.Cause)
	}
	return blob, dek
}

// gramineSealer is a Gramine key sealer on fake sealing keys.
func gramineSealer(t *testing.T) seal.KeySealer {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{seal.GramineMRSignerKey, seal.GramineMREnclaveKey} {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), bytes.Repeat([]byte{byte(i + 1)}, 16), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return seal.GramineKeySealer{Dir: dir}
}

func TestCommitSurvivesEveryFault(t *testing.T) {
	modes := []struct {
		mode       storetest.FaultMode
		persistent bool
	}{
		{storetest.FailBefore, false}, {storetest.FailAfter, false},
		{storetest.FailBefore, true}, {storetest.FailAfter, true},
		{storetest.CrashBefore, false}, {storetest.CrashAfter, false},
	}
	sealers := map[string]seal.KeySealer{"simulation": seal.SimulationKeySealer{}, "gramine": gramineSealer(t)}
	sequences := map[string][]version{"opaque": versions(), "named": namedVersions(t)}
	for sname, sealer := range sealers {
		for qname, vs := range sequences {
			for i := range vs {
				t.Run(fmt.Sprintf("%s/%s/to %d", sname, qname, i+1), func(t *testing.T) {
					for k := 1; ; k++ {
						fired := false
						for _, m := range modes {
							if commitWithFault(t, sealer, vs, i, k, m.mode, m.persistent, false) {
								fired = true
							}
						}
						if !fired {
							if k == 1 {
								t.Fatal("the commit writes nothing")
							}
							t.Logf("%d write steps", k-1)
							return
						}
					}
				})
			}
		}
	}
}

// TestFirstKeyStagedEarlySurvivesEveryFault: the key file of a first
// state staged ahead of its commit (StageFirstKey), with each fault at
// each write step.
func TestFirstKeyStagedEarlySurvivesEveryFault(t *testing.T) {
	modes := []storetest.FaultMode{storetest.FailBefore, storetest.FailAfter, storetest.CrashBefore, storetest.CrashAfter}
	for sname, sealer := range map[string]seal.KeySealer{"simulation": seal.SimulationKeySealer{}, "gramine": gramineSealer(t)} {
		t.Run(sname, func(t *testing.T) {
			vs := namedVersions(t)[4:] // a first blob that names its key
			for k := 1; ; k++ {
				fired := false
				for _, m := range modes {
					for _, persistent := range []bool{false, true} {
						if commitWithFault(t, sealer, vs, 0, k, m, persistent, true) {
							fired = true
						}
					}
				}
				if !fired {
					if k != 5 {
						t.Fatalf("%d write steps, want 4 (the key file staged ahead, the blob staged, each put in place)", k-1)
					}
					return
				}
			}
		})
	}
}

// commitWithFault stores vs[:i], then commits vs[i] with a fault at write
// step k and checks the outcome; it reports whether the fault fired. With
// early, the key file is staged ahead of the commit (StageFirstKey).
func commitWithFault(t *testing.T, sealer seal.KeySealer, vs []version, i, k int, mode storetest.FaultMode, persistent, early bool) bool {
	t.Helper()
	name := fmt.Sprintf("step %d %s persistent=%v", k, mode, persistent)
	ctx := context.Background()
	dir := t.TempDir()
	plain := func() *Vault {
		d, key := fileStores(t, dir)
		return New(Options{Data: d, Key: key, Sealer: sealer})
	}
	if i > 0 {
		v := plain()
		open(t, v)
		for _, p := range vs[:i] {
			if err := v.Commit(ctx, p.blob, p.dek, p.mode, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	var old *version
	if i > 0 {
		old = &vs[i-1]
	}
	faults := &storetest.Faults{}
	d, key := fileStores(t, dir)
	v := New(Options{Data: faults.Wrap(d), Key: faults.Wrap(key), Sealer: sealer})
	if blob, dek := open(t, v); old != nil {
		v.Opened(dek, old.mode, nil)
		if !bytes.Equal(blob, old.blob) {
			t.Fatalf("set-up: stored %q, want %q", blob, old.blob)
		}
	}
	next := vs[i]
	faults.Arm(k, mode, persistent)
	var err error
	if early {
		err = v.StageFirstKey(ctx, next.dek, next.mode)
	}
	if err == nil {
		err = v.Commit(ctx, next.blob, next.dek, next.mode, nil)
	}
	faults.Disarm()
	if !faults.Fired() {
		if err != nil {
			t.Fatalf("%s: the commit fails without a fault: %v", name, err)
		}
		return false
	}

	// A restart sees the files as they are (on a copy: a restart may
	// move a stray key file aside, and the process below goes on).
	blob, dek := open(t, restart(t, dir, sealer))
	switch {
	case bytes.Equal(blob, next.blob):
		if !bytes.Equal(dek, next.dek) {
			t.Fatalf("%s: the new blob opens with another data key", name)
		}
	case old != nil && bytes.Equal(blob, old.blob):
		if !bytes.Equal(dek, old.dek) {
			t.Fatalf("%s: the old blob opens with another data key", name)
		}
		if Stored(err) {
			t.Fatalf("%s: Commit said the new state is stored (%v), but a restart opens the old one", name, err)
		}
	case old == nil && blob == nil:
		if Stored(err) {
			t.Fatalf("%s: Commit said the first state is stored (%v), but a restart finds none", name, err)
		}
	default:
		t.Fatalf("%s: a restart opens a third state %q (before %v, attempted %q; commit error %v)", name, blob, old, next.blob, err)
	}
	if err != nil && !Stored(err) && !errors.Is(err, ErrOutcomeUnknown) && bytes.Equal(blob, next.blob) {
		t.Fatalf("%s: Commit said nothing was changed (%v), but a restart opens the new state", name, err)
	}
	if mode == storetest.CrashBefore || mode == storetest.CrashAfter {
		return true
	}
	// The process goes on: the next commit works and is what a restart
	// opens (it first resolves what a failed write left).
	then := version{[]byte(fmt.Sprintf("after %s", name)), next.dek, next.mode}
	if _, named := seal.BlobKeyID(next.blob); named {
		then.blob = sealed(t, next.dek, "after "+name, true)
	}
	if err := v.Commit(ctx, then.blob, then.dek, then.mode, nil); err != nil {
		t.Fatalf("%s: the next commit fails: %v", name, err)
	}
	if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, then.blob) || !bytes.Equal(dek, then.dek) {
		t.Fatalf("%s: after the next commit a restart opens %q", name, blob)
	}
	return true
}

// restart returns a Vault on a copy of the files in dir.
func restart(t *testing.T, dir string, sealer seal.KeySealer) *Vault {
	t.Helper()
	cp := t.TempDir()
	for _, name := range []string{"sealed_data", "sealed_key"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cp, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, key := fileStores(t, cp)
	return New(Options{Data: d, Key: key, Sealer: sealer})
}
