package vault

// The key file of a first state written ahead of its commit
// (WriteFirstKey): the commit then writes the blob alone.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
)

func TestFirstKeyWrittenAhead(t *testing.T) {
	for sname, sealer := range map[string]seal.KeySealer{"simulation": seal.SimulationKeySealer{}, "gramine": gramineSealer(t)} {
		t.Run(sname, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			log := &saveLog{}
			k1 := bytes.Repeat([]byte{1}, 32)
			v := loggedVault(t, dir, sealer, log)
			openAs(t, v, "")
			v.WriteFirstKey(ctx, k1, "ProductKey")
			first := sealed(t, k1, "first state", true)
			if err := v.Commit(ctx, first, k1, "ProductKey", nil); err != nil {
				t.Fatal(err)
			}
			if got := log.take(); !sameSaves(got, "key", "data") {
				t.Fatalf("the first commit saves %v, want [key data] (the key file ahead, then the blob)", got)
			}
			if e := keyEntries(t, dir); len(e) != 1 || !e[0].ByKeyID || e[0].Binding != seal.KeyID(k1) || !seal.SealedIn(sealer, e[0].Sealed, "ProductKey") {
				t.Fatalf("the key file written ahead is %+v, want k1 alone, bound to its key ID, sealed in ProductKey", e)
			}
			if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, first) || !bytes.Equal(dek, k1) {
				t.Fatal("a restart does not open the first state")
			}
			// The Vault knows the key file it placed: the next commit
			// under the key writes the blob alone.
			second := sealed(t, k1, "second state", true)
			if err := v.Commit(ctx, second, k1, "ProductKey", nil); err != nil {
				t.Fatal(err)
			}
			if got := log.take(); !sameSaves(got, "data") {
				t.Fatalf("the second commit saves %v, want [data]", got)
			}
			if blob, _ := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, second) {
				t.Fatal("a restart does not open the second state")
			}
		})
	}
}

// A first state given up after its key file was written ahead leaves that
// key file alone: it opens nothing, a restart moves it aside, and the next
// first commit of the same process replaces it.
func TestFirstKeyAbandoned(t *testing.T) {
	ctx := context.Background()
	sealer := seal.SimulationKeySealer{}
	dir := t.TempDir()
	log := &saveLog{}
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	v := loggedVault(t, dir, sealer, log)
	openAs(t, v, "")
	v.WriteFirstKey(ctx, k1, "ProductKey")
	v.Settle(ctx)
	if got := log.take(); !sameSaves(got, "key") {
		t.Fatalf("saves %v, want [key]", got)
	}
	cp := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(dir, "sealed_key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cp, "sealed_key"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if blob, _ := open(t, loggedVault(t, cp, sealer, &saveLog{})); blob != nil {
		t.Fatal("a key file without a blob opened a state")
	}
	if _, err := os.Stat(filepath.Join(cp, "sealed_key")); !os.IsNotExist(err) {
		t.Fatalf("a restart left the key file without a blob in place (stat: %v)", err)
	}

	// The same process sets a first state again, under another key.
	v.WriteFirstKey(ctx, k2, "ProductKey")
	first := sealed(t, k2, "first state", true)
	if err := v.Commit(ctx, first, k2, "ProductKey", nil); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !sameSaves(got, "key", "data") {
		t.Fatalf("the first commit saves %v, want [key data]", got)
	}
	if e := keyEntries(t, dir); len(e) != 1 || e[0].Binding != seal.KeyID(k2) {
		t.Fatalf("the key file holds %d entries (first bound to %x), want k2's alone", len(e), e[0].Binding)
	}
	if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, first) || !bytes.Equal(dek, k2) {
		t.Fatal("a restart does not open the first state")
	}
}

// A commit that is not the one the key file was written for (another key,
// a blob that names no key) writes its own key file: the one written ahead
// is only used when it opens the blob.
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
			v.WriteFirstKey(ctx, k1, "ProductKey")
			if err := v.Commit(ctx, c.blob, c.dek, c.mode, nil); err != nil {
				t.Fatal(err)
			}
			if got := log.take(); !sameSaves(got, "key", "key", "data") {
				t.Fatalf("saves %v, want [key key data] (the key file ahead, then the commit's own)", got)
			}
			if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, c.blob) || !bytes.Equal(dek, c.dek) {
				t.Fatal("a restart does not open the committed state")
			}
		})
	}
}

// With a state stored, WriteFirstKey writes nothing: the key file must
// keep opening that state, which only Commit's key file does.
func TestFirstKeyNotWrittenOverAStoredState(t *testing.T) {
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
	v.WriteFirstKey(ctx, k2, "ProductKey")
	v.Settle(ctx)
	if got := log.take(); len(got) != 0 {
		t.Fatalf("WriteFirstKey with a state stored saved %v", got)
	}
	if blob, dek := open(t, restart(t, dir, sealer)); !bytes.Equal(blob, first) || !bytes.Equal(dek, k1) {
		t.Fatal("a restart does not open the stored state")
	}
	second := sealed(t, k2, "new key", true)
	if err := v.Commit(ctx, second, k2, "ProductKey", nil); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !sameSaves(got, "key", "data") {
		t.Fatalf("the key change saves %v, want [key data]", got)
	}
}
