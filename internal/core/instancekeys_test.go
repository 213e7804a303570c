package core

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// cpu is a sealer with its own SGX sealing keys: another machine.
func cpu(t *testing.T) seal.KeySealer {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{seal.GramineMRSignerKey, seal.GramineMREnclaveKey} {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), []byte(rand.Text()[:16]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return seal.GramineKeySealer{Dir: dir}
}

func newInstanceID() *seal.InstanceID {
	var id seal.InstanceID
	rand.Read(id[:])
	return &id
}

// peerOf is a KeySource that asks another Core (as the peer protocol
// does after verifying the quote).
type peerOf struct {
	c     *Core
	calls int
}

func (p *peerOf) FetchKey(_ context.Context, keyID [32]byte) (*FetchedKey, error) {
	p.calls++
	if p.c == nil {
		return nil, errors.New("no peer alive")
	}
	dek, _, ok := p.c.PeerKey(keyID)
	if !ok {
		return nil, errors.New("the peer does not hold this key")
	}
	return &FetchedKey{DEK: dek, Allows: func(string) error { return nil }}, nil
}

type wrongKey struct{}

func (wrongKey) FetchKey(context.Context, [32]byte) (*FetchedKey, error) {
	return &FetchedKey{DEK: make([]byte, seal.KeySize), Allows: func(string) error { return nil }}, nil
}

// modeRefused is a peer whose quote does not satisfy the rules of the
// state's seal mode (it stated another mode, or the state changed mode
// in between); allows records the modes asked.
type modeRefused struct {
	c      *Core
	asked  []string
	noFunc bool
}

func (p *modeRefused) FetchKey(_ context.Context, keyID [32]byte) (*FetchedKey, error) {
	dek, _, ok := p.c.PeerKey(keyID)
	if !ok {
		return nil, errors.New("the peer does not hold this key")
	}
	if p.noFunc {
		return &FetchedKey{DEK: dek}, nil
	}
	return &FetchedKey{DEK: dek, Allows: func(mode string) error {
		p.asked = append(p.asked, mode)
		return errors.New("the peer's quote does not satisfy this seal mode")
	}}, nil
}

func (e *sharedEnv) instanceOn(sealer seal.KeySealer, id *seal.InstanceID, src KeySource) *Core {
	e.t.Helper()
	data, key := e.stores()
	c, err := New(e.t.Context(), Options{Data: data, Key: key, KeySealer: sealer, InstanceID: id, KeySource: src})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *sharedEnv) keyFile() *seal.InstanceKeyFile {
	e.t.Helper()
	_, key := e.stores()
	raw, _, err := key.Load(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	kf, err := seal.DecodeInstanceKeyFile(raw)
	if err != nil {
		e.t.Fatalf("the key file on etcd is not of version 2: %v", err)
	}
	return kf
}

// TestInstanceKeyEntries: every instance gets its own entry; one on
// another CPU joins through a peer; a commit by any instance keeps (and
// re-binds) the others' entries, so that each opens the newest state
// alone; without a peer it enters recovery mode.
func TestInstanceKeyEntries(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	cpuA, cpuB := cpu(t), cpu(t)
	idA, idB, idC := newInstanceID(), newInstanceID(), newInstanceID()

	a := e.instanceOn(cpuA, idA, nil)
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	if kf := e.keyFile(); len(kf.Entries) != 1 || kf.Entries[0].Instance != *idA {
		t.Fatalf("after the manifest: %d entries", len(kf.Entries))
	}

	// Another CPU without a peer: recovery mode, nothing written.
	before := e.keyFile()
	if b := e.instanceOn(cpuB, idB, &peerOf{}); b.Status() != StateRecovery {
		t.Fatalf("another CPU without a peer: state %d, want recovery", b.Status())
	}
	if len(e.keyFile().Entries) != len(before.Entries) {
		t.Fatal("a failed join changed the key file")
	}
	// A peer that hands out a wrong key: refused (recovery mode).
	if b := e.instanceOn(cpuB, idB, wrongKey{}); b.Status() != StateRecovery {
		t.Fatalf("with a wrong key from the peer: state %d, want recovery", b.Status())
	}

	// Through the peer a: joins and adds its own entry.
	src := &peerOf{c: a}
	b := e.instanceOn(cpuB, idB, src)
	if b.Status() != StateAcceptingMarbles || src.calls != 1 {
		t.Fatalf("b joined through a: state %d, %d calls", b.Status(), src.calls)
	}
	if kf := e.keyFile(); len(kf.Entries) != 2 {
		t.Fatalf("after b joined: %d entries, want 2", len(kf.Entries))
	}

	// a commits: b's entry is kept and bound to the new blob.
	mustSync(t, a)
	if err := e.upload(a, "uploaded", "from a"); err != nil {
		t.Fatal(err)
	}
	if kf := e.keyFile(); len(kf.Entries) != 2 {
		t.Fatalf("after a's commit: %d entries, want 2", len(kf.Entries))
	}
	// b commits (its own entry sealed again, a's kept).
	if err := e.upload(b, "followup", "from b"); err != nil {
		t.Fatal(err)
	}
	// b restarted, no peer: opens the newest state with its own entry.
	b2 := e.instanceOn(cpuB, idB, &peerOf{})
	if b2.Status() != StateAcceptingMarbles || e.secret(b2, "uploaded") != "from a" || e.secret(b2, "followup") != "from b" {
		t.Fatalf("b restarted alone: state %d", b2.Status())
	}
	a2 := e.instanceOn(cpuA, idA, &peerOf{})
	if a2.Status() != StateAcceptingMarbles {
		t.Fatalf("a restarted alone: state %d", a2.Status())
	}
	// c on a's CPU opens a's entry without a peer and adds its own.
	c := e.instanceOn(cpuA, idC, &peerOf{})
	if c.Status() != StateAcceptingMarbles {
		t.Fatalf("c on a's CPU: state %d", c.Status())
	}
	kf := e.keyFile()
	if len(kf.Entries) != 3 {
		t.Fatalf("after c: %d entries, want 3", len(kf.Entries))
	}
	// A new instance on a third CPU with only dead peers: recovery mode.
	if d := e.instanceOn(cpu(t), newInstanceID(), &peerOf{}); d.Status() != StateRecovery {
		t.Fatalf("a third CPU without a peer: state %d, want recovery", d.Status())
	}
}

// TestInstanceKeyFileOlderThanBlob: the key records bind keys to blobs
// even though the sealed entries do not: an older key file with a newer
// blob is refused (recovery mode): a key file opens only the blob it is
// bound to (docs/sealing.md).
func TestInstanceKeyFileOlderThanBlob(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	cpuA := cpu(t)
	idA := newInstanceID()
	a := e.instanceOn(cpuA, idA, nil)
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	data, key := e.stores()
	oldKey, _, _ := key.Load(t.Context())
	if err := e.upload(a, "uploaded", "v"); err != nil {
		t.Fatal(err)
	}
	_, drev, _, krev, err := data.LoadPair(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	blob, _, _ := data.Load(t.Context())
	if _, err := data.SavePair(t.Context(), blob, drev, key, oldKey, krev); err != nil {
		t.Fatal(err)
	}
	if c := e.instanceOn(cpuA, idA, nil); c.Status() != StateRecovery {
		t.Fatalf("older key file: state %d, want recovery", c.Status())
	}
}

// TestFetchedKeyCheckedAgainstSealMode: a key from the KeySource is used
// only if its giver passes the check for the opened state's own seal
// mode: otherwise recovery mode, the key neither served to others nor
// sealed into the key file; a source without the check is refused.
func TestFetchedKeyCheckedAgainstSealMode(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a := e.instanceOn(cpu(t), newInstanceID(), nil)
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	before := e.keyFile()
	src := &modeRefused{c: a}
	b := e.instanceOn(cpu(t), newInstanceID(), src)
	if b.Status() != StateRecovery {
		t.Fatalf("a giver not allowed for the state's seal mode: state %d, want recovery", b.Status())
	}
	if len(src.asked) != 1 || src.asked[0] != a.snap.Load().manifest.Config.SealMode {
		t.Fatalf("Allows asked for %q, want the state's seal mode once", src.asked)
	}
	id := seal.KeyID(a.dek)
	if _, _, ok := b.PeerKey(id); ok {
		t.Fatal("the refused key is served to other instances")
	}
	if len(e.keyFile().Entries) != len(before.Entries) {
		t.Fatal("the refused key was sealed into the key file")
	}
	if c := e.instanceOn(cpu(t), newInstanceID(), &modeRefused{c: a, noFunc: true}); c.Status() != StateRecovery {
		t.Fatalf("a key without Allows: state %d, want recovery", c.Status())
	}
	// The same giver with the check passing: joins (the control).
	if d := e.instanceOn(cpu(t), newInstanceID(), &peerOf{c: a}); d.Status() != StateAcceptingMarbles {
		t.Fatalf("control: state %d", d.Status())
	}
}
