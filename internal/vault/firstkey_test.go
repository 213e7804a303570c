package vault

// The key file of a first state staged ahead of its commit
// (StageFirstKey): written and synced while the state is built, put in
// place by the commit.

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

// commitPuts commits blob under dek in mode and checks which stores put
// a file in place, in order.
func commitPuts(t *testing.T, v *Vault, log *saveLog, blob, dek []byte, mode string, want ...string) {
	t.Helper()
	if err := v.Commit(context.Background(), blob, dek, mode, nil); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !sameSaves(got, want...) {
		t.Fatalf("the commit of %q puts %v in place, want %v", plaintextOf(t, version{blob, dek, mode}), got, want)
	}
}

func TestFirstKeyStagedAhead(t *testing.T) {
	for sname, sealer := range map[string]seal.KeySealer{"simulation": seal.SimulationKeySealer{}, "gramine": gramineSealer(t)} {
		t.Run(sname, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			log := &saveLog{}
			k1 := bytes.Repeat([]byte{1}, 32)
			v := loggedVault(t, dir, sealer, log)
			openAs(t, v, "")
			if err := v.StageFirstKey(ctx, k1, "ProductKey"); err != nil {
				t.Fatal(err)
			}
			if v.early == nil {
				t.Fatal("nothing was staged")
			}
			first := sealed(t, k1, "first state", true)
			commitPuts(t, v, log, first, k1, "ProductKey", "key", "data")
			if e := keyEntries(t, dir); len(e) != 1 || !e[0].ByKeyID || e[0].Binding != seal.KeyID(k1) || !seal.SealedIn(sealer, e[0].Sealed, "ProductKey") {
				t.Fatalf("the staged key file is %+v, want k1 alone, bound to its key ID, sealed in ProductKey", e)
			}
			if got := storetest.Files(t, dir); !slices.Equal(got, []string{"sealed_data", "sealed_key"}) {
				t.Fatalf("the directory holds %q", got)
			}
			if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, first) || !bytes.Equal(dek, k1) {
				t.Fatal("a restart does not open the first state")
			}
			// The Vault knows the key file it placed: the next commit
			// under the key writes the blob alone.
			second := sealed(t, k1, "second state", true)
			commitPuts(t, v, log, second, k1, "ProductKey", "data")
			if blob, _ := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, second) {
				t.Fatal("a restart does not open the second state")
			}
		})
	}
}

// A first state given up after its key file was staged leaves nothing:
// the staged file is removed, and the next first commit goes on.
func TestFirstKeyDiscarded(t *testing.T) {
	ctx := context.Background()
	sealer := seal.SimulationKeySealer{}
	dir := t.TempDir()
	log := &saveLog{}
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	v := loggedVault(t, dir, sealer, log)
	openAs(t, v, "")
	if err := v.StageFirstKey(ctx, k1, "ProductKey"); err != nil {
		t.Fatal(err)
	}
	v.DiscardFirstKey()
	if got := log.take(); len(got) != 0 {
		t.Fatalf("put %v in place, want nothing", got)
	}
	if got := storetest.Files(t, dir); len(got) != 0 {
		t.Fatalf("a discarded key file left %q", got)
	}
	// Staging again replaces an earlier staged key file, too.
	if err := v.StageFirstKey(ctx, k1, "ProductKey"); err != nil {
		t.Fatal(err)
	}
	if err := v.StageFirstKey(ctx, k2, "ProductKey"); err != nil {
		t.Fatal(err)
	}
	first := sealed(t, k2, "first state", true)
	commitPuts(t, v, log, first, k2, "ProductKey", "key", "data")
	if e := keyEntries(t, dir); len(e) != 1 || e[0].Binding != seal.KeyID(k2) {
		t.Fatalf("the key file holds %d entries, want k2's alone", len(e))
	}
	if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, first) || !bytes.Equal(dek, k2) {
		t.Fatal("a restart does not open the first state")
	}
}

// A commit that is not the one the key file was staged for (another key,
// another mode, a blob that names no key) writes its own key file: the
// staged one is used only when it opens the blob.
func TestFirstKeyNotForThisCommit(t *testing.T) {
	ctx := context.Background()
	sealer := seal.SimulationKeySealer{}
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	for name, c := range map[string]struct {
		blob []byte
		dek  []byte
		mode string
	}{
		"another key":    {sealed(t, k2, "under k2", true), k2, "ProductKey"},
		"another mode":   {sealed(t, k1, "under k1, UniqueKey", true), k1, "UniqueKey"},
		"a blob unnamed": {sealed(t, k1, "names no key", false), k1, "ProductKey"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			log := &saveLog{}
			v := loggedVault(t, dir, sealer, log)
			openAs(t, v, "")
			if err := v.StageFirstKey(ctx, k1, "ProductKey"); err != nil {
				t.Fatal(err)
			}
			commitPuts(t, v, log, c.blob, c.dek, c.mode, "key", "data")
			if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, c.blob) || !bytes.Equal(dek, c.dek) {
				t.Fatal("a restart does not open the committed state")
			}
			if got := storetest.Files(t, dir); !slices.Equal(got, []string{"sealed_data", "sealed_key"}) {
				t.Fatalf("the directory holds %q", got)
			}
		})
	}
}

// With a state stored, StageFirstKey stages nothing: the key file must
// keep opening that state, which only Commit's key file does.
func TestFirstKeyNotStagedOverAStoredState(t *testing.T) {
	ctx := context.Background()
	sealer := seal.SimulationKeySealer{}
	dir := t.TempDir()
	log := &saveLog{}
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	v := loggedVault(t, dir, sealer, log)
	openAs(t, v, "")
	first := sealed(t, k1, "first state", true)
	if err := v.Commit(ctx, first, k1, "ProductKey", nil); err != nil {
		t.Fatal(err)
	}
	log.take()
	if err := v.StageFirstKey(ctx, k2, "ProductKey"); err != nil {
		t.Fatal(err)
	}
	if v.early != nil {
		t.Fatal("a key file was staged with a state stored")
	}
	second := sealed(t, k2, "new key", true)
	commitPuts(t, v, log, second, k2, "ProductKey", "key", "data")
	// A key change: the new key, and the old one bound to the stored blob.
	if e := keyEntries(t, dir); len(e) != 2 || e[0].Binding != seal.KeyID(k2) || e[1].Binding != seal.KeyID(k1) {
		t.Fatalf("the key file holds %+v, want k2's entry and k1's", e)
	}
	if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, second) || !bytes.Equal(dek, k2) {
		t.Fatal("a restart does not open the new state")
	}
}

// A data key that cannot be sealed (here: a Gramine sealer without its
// sealing keys) is an error of StageFirstKey, and nothing is staged or
// written.
func TestFirstKeyUnsealable(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	v := loggedVault(t, dir, seal.GramineKeySealer{Dir: t.TempDir()}, &saveLog{})
	openAs(t, v, "")
	if err := v.StageFirstKey(ctx, bytes.Repeat([]byte{1}, 32), "ProductKey"); err == nil {
		t.Fatal("a data key the sealer cannot seal was staged")
	}
	if v.early != nil {
		t.Fatal("something was staged")
	}
	if got := storetest.Files(t, dir); len(got) != 0 {
		t.Fatalf("the directory holds %q", got)
	}
}
