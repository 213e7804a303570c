package core

// Tests of SealMode changes and the data key (docs/sealing.md "SealMode
// changes"): a change to a stricter mode (ProductKey or the default →
// UniqueKey) makes a new data key, so that no entry sealed under the looser
// mode — in the key file, or another instance's on a shared store — opens
// the new state; a looser change keeps the key.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// sameSignerOtherEnclave is another enclave of the same signer on the same
// CPU as s (a Gramine sealer): s's MRSIGNER sealing key, its own MRENCLAVE
// one. It opens whatever s sealed under ProductKey, nothing s sealed under
// UniqueKey.
func sameSignerOtherEnclave(t *testing.T, s seal.KeySealer) seal.GramineKeySealer {
	t.Helper()
	g, ok := s.(seal.GramineKeySealer)
	if !ok {
		t.Fatalf("not a Gramine sealer: %T", s)
	}
	signer, err := g.SealingKey(seal.ModeProductKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	enclave := bytes.Repeat([]byte{0xee}, 16)
	if mine, _ := g.SealingKey(seal.ModeUniqueKey); bytes.Equal(mine, enclave) {
		enclave[0] ^= 1
	}
	for name, k := range map[string][]byte{seal.GramineMRSignerKey: signer, seal.GramineMREnclaveKey: enclave} {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), k, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return seal.GramineKeySealer{Dir: dir}
}

// sealedMode is the seal mode a Gramine-sealed key names in its header
// (docs/sealing.md: magic "QRYGSK", version, mode length, mode).
func sealedMode(t *testing.T, sealed []byte) string {
	t.Helper()
	if len(sealed) < 8 || string(sealed[:6]) != "QRYGSK" || len(sealed) < 8+int(sealed[7]) {
		t.Fatalf("not a Gramine-sealed key: %x", sealed)
	}
	return string(sealed[8 : 8+int(sealed[7])])
}

// sealedKey is one sealed data key of a key file, with what it was
// sealed for (the binding of version 1, the key ID of version 2).
type sealedKey struct {
	sealed, boundTo []byte
}

// sealedKeys lists every sealed data key of a key file of either version.
func sealedKeys(t *testing.T, keyFile []byte) []sealedKey {
	t.Helper()
	var out []sealedKey
	if seal.IsInstanceKeyFile(keyFile) {
		kf, err := seal.DecodeInstanceKeyFile(keyFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range kf.Entries {
			out = append(out, sealedKey{e.Sealed, e.KeyID[:]})
		}
		return out
	}
	entries, err := seal.DecodeKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		out = append(out, sealedKey{e.Sealed, e.Binding[:]})
	}
	return out
}

// opening counts the entries of keyFile that sealer unseals (unsealed)
// and those whose key decrypts blob (opened): an enclave that can run its
// own code tries every entry, whatever it is bound to.
func opening(t *testing.T, sealer seal.KeySealer, keyFile, blob []byte) (unsealed, opened int) {
	t.Helper()
	for _, k := range sealedKeys(t, keyFile) {
		dek, err := sealer.UnsealKey(k.sealed, k.boundTo)
		if err != nil {
			continue
		}
		unsealed++
		if _, _, err := seal.Open(dek, blob); err == nil {
			opened++
		}
	}
	return unsealed, opened
}

// modesOf returns the seal modes of the entries of keyFile that sealer
// unseals to dek.
func modesOf(t *testing.T, sealer seal.KeySealer, keyFile, dek []byte) []string {
	t.Helper()
	var out []string
	for _, k := range sealedKeys(t, keyFile) {
		if got, err := sealer.UnsealKey(k.sealed, k.boundTo); err == nil && bytes.Equal(got, dek) {
			out = append(out, sealedMode(t, k.sealed))
		}
	}
	return out
}

// modeLabel names a SealMode in a subtest name ("" is the default).
func modeLabel(m string) string {
	if m == "" {
		return "default"
	}
	return m
}

func (e *faultEnv) files(t *testing.T) (blob, keyFile []byte) {
	t.Helper()
	blob, err := os.ReadFile(filepath.Join(e.dir, "sealed_data"))
	if err != nil {
		t.Fatal(err)
	}
	keyFile, err = os.ReadFile(filepath.Join(e.dir, "sealed_key"))
	if err != nil {
		t.Fatal(err)
	}
	return blob, keyFile
}

// TestSealModeTighteningRevokesLooserEntries: after ProductKey (or the
// default) → UniqueKey, an enclave of the same signer with another
// MRENCLAVE opens the new state with no entry of the key file; the data
// key changed; the update answers new recovery secrets (also fetched
// again), they recover the new state, and the old ones do not.
func TestSealModeTighteningRevokesLooserEntries(t *testing.T) {
	for _, from := range []string{"", "ProductKey"} {
		t.Run("from "+modeLabel(from), func(t *testing.T) {
			ctx := context.Background()
			w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 1)}
			sealer := cpu(t)
			e := &faultEnv{w: w, dir: t.TempDir(), sealer: sealer}
			e.open(t)
			e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: from})
			other := sameSignerOtherEnclave(t, sealer)
			blob, keyFile := e.files(t)
			if _, opened := opening(t, other, keyFile, blob); opened == 0 {
				t.Fatal("setup: an enclave of the same signer does not open the ProductKey state")
			}
			oldDEK, oldSecret := e.c.dek, e.plain["r0"]

			res, err := e.c.Update(ctx, w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: "UniqueKey"}))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(e.c.dek, oldDEK) {
				t.Fatal("the data key stayed the same after tightening SealMode")
			}
			blob, keyFile = e.files(t)
			unsealed, opened := opening(t, other, keyFile, blob)
			if opened != 0 {
				t.Fatalf("an enclave of the same signer with another MRENCLAVE opens the new state with %d entries of the key file", opened)
			}
			if unsealed == 0 {
				t.Fatal("the key file no longer holds the old key for the old sealed_data (docs/sealing.md, the commit)")
			}
			if modes := modesOf(t, sealer, keyFile, e.c.dek); len(modes) != 1 || modes[0] != "UniqueKey" {
				t.Fatalf("the new data key is sealed in the modes %v, want only UniqueKey", modes)
			}
			if got := describe(e.fresh(t)); got != describe(e.c) {
				t.Fatalf("a restart opens %q, want the new state", got)
			}

			if len(res.RecoverySecrets) != 1 {
				t.Fatalf("the update answered %d recovery secrets, want 1", len(res.RecoverySecrets))
			}
			kept, err := e.c.RecoverySecrets(ctx, w.admin.peer())
			if err != nil || !bytes.Equal(kept["r0"], res.RecoverySecrets["r0"]) {
				t.Fatalf("GET recover/secrets after the update: %v, %v", kept, err)
			}
			e.keepPlain(t, res.RecoverySecrets)
			newSecret := e.plain["r0"]
			if bytes.Equal(newSecret, oldSecret) {
				t.Fatal("the recovery secret stayed the same")
			}
			want := describeSansLog(e.c)

			// The other enclave (an enclave upgrade, say) is in recovery
			// mode: the old secret no longer opens the state, the new one
			// does.
			e.sealer = other
			e.open(t)
			if e.c.Status() != StateRecovery {
				t.Fatalf("another MRENCLAVE: state %d, want recovery", e.c.Status())
			}
			if _, err := e.c.Recover(ctx, oldSecret, signSecret(w.rec[0], oldSecret)); err == nil {
				t.Fatal("the recovery secret from before the switch recovered the new state")
			}
			if e.c.Status() != StateRecovery {
				t.Fatalf("after the old secret: state %d, want recovery", e.c.Status())
			}
			if _, err := e.c.Recover(ctx, newSecret, signSecret(w.rec[0], newSecret)); err != nil {
				t.Fatalf("the new recovery secret: %v", err)
			}
			if got := describeSansLog(e.c); got != want {
				t.Fatalf("recovered %q, want %q", got, want)
			}
		})
	}
}

// TestSealModeChangeDataKey: which SealMode changes make a new data key
// (and new recovery secrets), and that the secret that should recover the
// state afterwards does.
func TestSealModeChangeDataKey(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		newKey   bool
	}{
		{"", "UniqueKey", true},
		{"ProductKey", "UniqueKey", true},
		{"UniqueKey", "ProductKey", false},
		{"UniqueKey", "", false},
		{"", "ProductKey", false},
		{"ProductKey", "", false},
		{"UniqueKey", "UniqueKey", false},
		{"Disabled", "UniqueKey", false},
		{"Disabled", "ProductKey", false},
	} {
		t.Run(modeLabel(tc.from)+" to "+modeLabel(tc.to), func(t *testing.T) {
			ctx := context.Background()
			e, w := newSealingEnv(t)
			e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: tc.from})
			oldDEK, oldSecret := e.c.dek, e.plain["r0"]
			res, err := e.c.Update(ctx, w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: tc.to, extraSecret: true}))
			if err != nil {
				t.Fatal(err)
			}
			if changed := !bytes.Equal(e.c.dek, oldDEK); changed != tc.newKey {
				t.Fatalf("data key changed: %v, want %v", changed, tc.newKey)
			}
			secret := oldSecret
			if tc.newKey {
				if len(res.RecoverySecrets) != 1 {
					t.Fatalf("%d recovery secrets, want 1", len(res.RecoverySecrets))
				}
				e.keepPlain(t, res.RecoverySecrets)
				secret = e.plain["r0"]
			} else if len(res.RecoverySecrets) != 0 {
				t.Fatalf("recovery secrets without a new data key: %v", res.RecoverySecrets)
			}
			want := describeSansLog(e.c)
			e.breakKey(t)
			e.open(t)
			if tc.newKey {
				if _, err := e.c.Recover(ctx, oldSecret, signSecret(w.rec[0], oldSecret)); err == nil {
					t.Fatal("the old recovery secret recovered the state of the new key")
				}
			}
			if _, err := e.c.Recover(ctx, secret, signSecret(w.rec[0], secret)); err != nil {
				t.Fatalf("recovering: %v", err)
			}
			if got := describeSansLog(e.c); got != want {
				t.Fatalf("recovered %q, want %q", got, want)
			}
		})
	}
}

// TestSealModeTighteningWithoutRecoveryKeys: a new data key as well, and
// no recovery secrets (there is nobody to give them to).
func TestSealModeTighteningWithoutRecoveryKeys(t *testing.T) {
	e, w := newSealingEnv(t)
	e.set(t, manifestOpts{threshold: 1})
	old := e.c.dek
	res, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{threshold: 1, sealMode: "UniqueKey"}))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(e.c.dek, old) || len(res.RecoverySecrets) != 0 {
		t.Fatalf("data key changed %v, %d recovery secrets; want a new key and none", !bytes.Equal(e.c.dek, old), len(res.RecoverySecrets))
	}
	if _, err := e.c.RecoverySecrets(context.Background(), w.admin.peer()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GET recover/secrets without recovery keys: %v", err)
	}
	if got := describe(e.fresh(t)); got != describe(e.c) {
		t.Fatalf("a restart opens %q", got)
	}
}

// TestSealModeTighteningWithNewRecoveryKeys: one update that changes both
// RecoveryKeys and SealMode makes one new key: the key file holds it (for
// the new blob, UniqueKey only) and the old key (for the old blob), the
// secrets of the new recovery keys recover it.
func TestSealModeTighteningWithNewRecoveryKeys(t *testing.T) {
	ctx := context.Background()
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 2)}
	sealer := cpu(t)
	e := &faultEnv{w: w, dir: t.TempDir(), sealer: sealer}
	e.open(t)
	e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1})
	oldBlob, _ := e.files(t)
	oldDEK := e.c.dek
	res, err := e.c.Update(ctx, w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{1}, threshold: 1, sealMode: "UniqueKey"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.RecoverySecrets["r1"]; !ok || len(res.RecoverySecrets) != 1 {
		t.Fatalf("recovery secrets %v, want r1 only", res.RecoverySecrets)
	}
	blob, keyFile := e.files(t)
	entries, err := seal.DecodeKeyFile(keyFile)
	if err != nil || len(entries) != 2 {
		t.Fatalf("key file: %d entries, %v; want 2", len(entries), err)
	}
	newEntry, ok := seal.Find(entries, blob)
	if !ok || sealedMode(t, newEntry.Sealed) != "UniqueKey" {
		t.Fatal("the entry of the new blob is missing or not UniqueKey")
	}
	if dek, err := sealer.UnsealKey(newEntry.Sealed, newEntry.Binding[:]); err != nil || !bytes.Equal(dek, e.c.dek) {
		t.Fatalf("the entry of the new blob does not hold the current key: %v", err)
	}
	oldEntry, ok := seal.Find(entries, oldBlob)
	if !ok {
		t.Fatal("no entry for the old blob")
	}
	if dek, err := sealer.UnsealKey(oldEntry.Sealed, oldEntry.Binding[:]); err != nil || !bytes.Equal(dek, oldDEK) {
		t.Fatalf("the entry of the old blob does not hold the old key: %v", err)
	}
	if _, opened := opening(t, sameSignerOtherEnclave(t, sealer), keyFile, blob); opened != 0 {
		t.Fatal("an enclave of the same signer opens the new state")
	}
	want := describeSansLog(e.c)
	e.keepPlain(t, res.RecoverySecrets)
	e.breakKey(t)
	e.open(t)
	p := e.plain["r1"]
	if _, err := e.c.Recover(ctx, p, signSecret(w.rec[1], p)); err != nil {
		t.Fatalf("recovering with the new key's secret: %v", err)
	}
	if got := describeSansLog(e.c); got != want {
		t.Fatalf("recovered %q, want %q", got, want)
	}
}

// TestSealModeTighteningPending: a multi-party update to UniqueKey keeps
// the key while it waits; the acknowledgement that applies it makes the
// new key and answers the new recovery secrets.
func TestSealModeTighteningPending(t *testing.T) {
	ctx := context.Background()
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 1)}
	sealer := cpu(t)
	e := &faultEnv{w: w, dir: t.TempDir(), sealer: sealer}
	e.open(t)
	e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 2})
	oldDEK := e.c.dek
	next := w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 2, sealMode: "UniqueKey"})
	res, err := e.c.Update(ctx, w.admin.peer(), next)
	if err != nil || res.MissingAcknowledgments != 1 {
		t.Fatalf("initiating: %+v, %v", res, err)
	}
	if !bytes.Equal(e.c.dek, oldDEK) || len(res.RecoverySecrets) != 0 {
		t.Fatal("a pending update changed the data key")
	}
	res, err = e.c.AcknowledgeUpdate(ctx, w.second.peer(), next)
	if err != nil || res.MissingAcknowledgments != 0 {
		t.Fatalf("acknowledging: %+v, %v", res, err)
	}
	if bytes.Equal(e.c.dek, oldDEK) || len(res.RecoverySecrets) != 1 {
		t.Fatalf("the applying acknowledgement: data key changed %v, %d recovery secrets", !bytes.Equal(e.c.dek, oldDEK), len(res.RecoverySecrets))
	}
	blob, keyFile := e.files(t)
	if _, opened := opening(t, sameSignerOtherEnclave(t, sealer), keyFile, blob); opened != 0 {
		t.Fatal("an enclave of the same signer opens the applied state")
	}
	want := describeSansLog(e.c)
	e.keepPlain(t, res.RecoverySecrets)
	e.breakKey(t)
	e.open(t)
	p := e.plain["r0"]
	if _, err := e.c.Recover(ctx, p, signSecret(w.rec[0], p)); err != nil {
		t.Fatalf("recovering with the secret of the acknowledgement: %v", err)
	}
	if got := describeSansLog(e.c); got != want {
		t.Fatalf("recovered %q, want %q", got, want)
	}
}

// TestSealModeTighteningSharedStore: on etcd another instance's entry
// (sealed under ProductKey) is not carried to the new data key: an
// enclave of that instance's signer with another MRENCLAVE opens the new
// state with no entry; the instance itself joins again through a peer and
// then holds a UniqueKey entry only.
func TestSealModeTighteningSharedStore(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	e.w.rec = rsaKeys(t, 1)
	cpuA, cpuB := cpu(t), cpu(t)
	idA, idB := newInstanceID(), newInstanceID()
	a := e.instanceOn(cpuA, idA, nil)
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1})); err != nil {
		t.Fatal(err)
	}
	src := &peerOf{c: a}
	b := e.instanceOn(cpuB, idB, src)
	if b.Status() != StateAcceptingMarbles || len(e.keyFile().Entries) != 2 {
		t.Fatalf("b did not join: state %d", b.Status())
	}
	data, key := e.stores()
	otherB := sameSignerOtherEnclave(t, cpuB)
	blob, _, _ := data.Load(t.Context())
	raw, _, _ := key.Load(t.Context())
	if _, opened := opening(t, otherB, raw, blob); opened == 0 {
		t.Fatal("setup: an enclave of b's signer does not open the ProductKey state")
	}
	oldDEK := a.dek

	res, err := a.Update(t.Context(), e.w.admin.peer(), e.w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: "UniqueKey"}))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a.dek, oldDEK) || len(res.RecoverySecrets) != 1 {
		t.Fatalf("data key changed %v, %d recovery secrets", !bytes.Equal(a.dek, oldDEK), len(res.RecoverySecrets))
	}
	blob, _, _ = data.Load(t.Context())
	raw, _, _ = key.Load(t.Context())
	if _, opened := opening(t, otherB, raw, blob); opened != 0 {
		t.Fatalf("an enclave of b's signer with another MRENCLAVE opens the new state with %d entries", opened)
	}
	if _, opened := opening(t, cpuB, raw, blob); opened != 0 {
		t.Fatal("b's ProductKey entry was carried to the new data key")
	}
	newID := seal.KeyID(a.dek)
	for _, en := range e.keyFile().Entries {
		if en.KeyID == newID && (en.Instance != *idA || sealedMode(t, en.Sealed) != "UniqueKey") {
			t.Fatalf("an entry of the new key: instance %x, mode %s", en.Instance[:4], sealedMode(t, en.Sealed))
		}
	}

	// b follows: its entry is for the old key, so it asks the peer, and
	// adds an entry of the new key sealed under UniqueKey.
	calls := src.calls
	mustSync(t, b)
	if b.Status() != StateAcceptingMarbles || describe(b) != describe(a) || src.calls != calls+1 {
		t.Fatalf("b after the switch: state %d, %d peer calls", b.Status(), src.calls-calls)
	}
	kf := e.keyFile()
	entry, ok := kf.Entry(*idB, newID)
	if !ok || sealedMode(t, entry.Sealed) != "UniqueKey" {
		t.Fatal("b has no UniqueKey entry of the new key after joining again")
	}
	raw, _, _ = key.Load(t.Context())
	if _, opened := opening(t, otherB, raw, blob); opened != 0 {
		t.Fatal("after b joined again, an enclave of b's signer opens the state")
	}
}
