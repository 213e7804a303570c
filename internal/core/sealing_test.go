package core

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/updatelog"
	"github.com/quarry-cc/quarry/manifest"
)

func newSealingEnv(t *testing.T) (*faultEnv, *faultWorld) {
	t.Helper()
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 2)}
	e := &faultEnv{w: w, dir: t.TempDir()}
	e.open(t)
	return e, w
}

func asideFiles(t *testing.T, dir, prefix string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, prefix+".*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A sealed_key without sealed_data (a crash during the first set, or a
// lost sealed_data) used to make every manifest set fail with 500.
func TestStrayKeyFileIsMovedAside(t *testing.T) {
	e, w := newSealingEnv(t)
	stray := []byte("left over from an interrupted first write")
	if err := os.WriteFile(filepath.Join(e.dir, "sealed_key"), stray, 0o600); err != nil {
		t.Fatal(err)
	}
	e.open(t)
	if e.c.Status() != StateAcceptingManifest {
		t.Fatalf("state %d, want 2", e.c.Status())
	}
	moved := asideFiles(t, e.dir, "sealed_key")
	if len(moved) != 1 {
		t.Fatalf("stray key file not moved aside: %v", moved)
	}
	if b, _ := os.ReadFile(moved[0]); !bytes.Equal(b, stray) {
		t.Fatal("the moved file changed")
	}
	if _, err := e.c.SetManifest(context.Background(), w.manifest(manifestOpts{threshold: 1})); err != nil {
		t.Fatalf("set after a stray key file: %v", err)
	}
	if e.fresh(t).Status() != StateAcceptingMarbles {
		t.Fatal("the state set after a stray key file does not open")
	}
}

// A sealed_key that is a directory used to give a 500 at recovery.
func TestKeyFileDirectoryIsRecovered(t *testing.T) {
	e, _ := newSealingEnv(t)
	e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1})
	keyPath := filepath.Join(e.dir, "sealed_key")
	if err := os.Remove(keyPath); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(keyPath, 0o700); err != nil {
		t.Fatal(err)
	}
	e.open(t)
	if e.c.Status() != StateRecovery {
		t.Fatalf("state %d, want recovery", e.c.Status())
	}
	p := e.plain["r0"]
	if _, err := e.c.Recover(context.Background(), p, signSecret(e.w.rec[0], p)); err != nil {
		t.Fatalf("recovery with sealed_key a directory: %v", err)
	}
	if st, err := os.Stat(keyPath); err != nil || st.IsDir() {
		t.Fatalf("sealed_key after recovery: %v, %v", st, err)
	}
	if len(asideFiles(t, e.dir, "sealed_key")) != 1 {
		t.Fatal("the directory was not moved aside")
	}
	if e.fresh(t).Status() != StateAcceptingMarbles {
		t.Fatal("the recovered state does not open")
	}
}

// States written before the key file bound keys to blobs have the raw
// data key in sealed_key.
func TestLegacyRawKeyFileOpens(t *testing.T) {
	e, w := newSealingEnv(t)
	e.set(t, manifestOpts{threshold: 1})
	before := describe(e.c)
	if err := os.WriteFile(filepath.Join(e.dir, "sealed_key"), e.c.dek, 0o600); err != nil {
		t.Fatal(err)
	}
	e.open(t)
	if got := describe(e.c); got != before {
		t.Fatalf("legacy key file opens %q, want %q", got, before)
	}
	if err := e.c.SetSecrets(context.Background(), w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(e.dir, "sealed_key"))
	if !bytes.HasPrefix(raw, []byte(seal.KeyFileMagic)) {
		t.Fatal("the next write keeps the legacy key file")
	}
	if describe(e.fresh(t)) != describe(e.c) {
		t.Fatal("state after rewriting a legacy key file does not open")
	}
}

// The key file holds the new key bound to the new blob, and the key of the
// blob it replaced; each opens only its own blob.
func TestKeyFileBindsKeysToBlobs(t *testing.T) {
	e, w := newSealingEnv(t)
	e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1})
	oldBlob, _ := os.ReadFile(filepath.Join(e.dir, "sealed_data"))
	oldDEK := e.c.dek
	if _, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{1}, threshold: 1})); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(e.c.dek, oldDEK) {
		t.Fatal("new recovery keys did not change the data key")
	}
	newBlob, _ := os.ReadFile(filepath.Join(e.dir, "sealed_data"))
	raw, _ := os.ReadFile(filepath.Join(e.dir, "sealed_key"))
	entries, err := seal.DecodeKeyFile(raw)
	if err != nil || len(entries) != 2 {
		t.Fatalf("key file after a key change: %d entries, %v", len(entries), err)
	}
	if e0, ok := seal.Find(entries, newBlob); !ok || !bytes.Equal(e0.Sealed, e.c.dek) {
		t.Fatal("no entry with the new key for the new blob")
	}
	if e1, ok := seal.Find(entries, oldBlob); !ok || !bytes.Equal(e1.Sealed, oldDEK) {
		t.Fatal("no entry with the old key for the old blob")
	}
}

// SealMode changes (docs/sealing.md): Disabled → sealing works with the recovery
// secrets handed out at set; sealing → Disabled is refused; changes
// between the sealing modes survive restarts.
func TestSealModeChanges(t *testing.T) {
	t.Run("Disabled then sealing, same recovery keys", func(t *testing.T) {
		e, w := newSealingEnv(t)
		e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: "Disabled"})
		if e.fresh(t).Status() != StateAcceptingManifest {
			t.Fatal("SealMode Disabled persisted something")
		}
		if _, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1})); err != nil {
			t.Fatalf("turning sealing on: %v", err)
		}
		want := describe(e.c)
		if got := describe(e.fresh(t)); got != want {
			t.Fatalf("restart opens %q, want %q", got, want)
		}
		wantSansLog := describeSansLog(e.c)
		// The recovery secret handed out at the Disabled set recovers it.
		e.breakKey(t)
		e.open(t)
		p := e.plain["r0"]
		if _, err := e.c.Recover(context.Background(), p, signSecret(w.rec[0], p)); err != nil {
			t.Fatalf("recovering with the secret from the Disabled set: %v", err)
		}
		// The same state, its update log extended by the recovery.
		if got := describeSansLog(e.c); got != wantSansLog {
			t.Fatalf("recovered %q, want %q", got, wantSansLog)
		}
		if tail := e.c.snap.Load().persisted.UpdateLog; !strings.Contains(tail[len(tail)-1], updatelog.MsgRecovered) {
			t.Fatalf("the last log entry is %s, not the recovery", tail[len(tail)-1])
		}
	})
	t.Run("Disabled then sealing, new recovery keys", func(t *testing.T) {
		e, w := newSealingEnv(t)
		e.set(t, manifestOpts{threshold: 1, sealMode: "Disabled"})
		res, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{1}, threshold: 1}))
		if err != nil || len(res.RecoverySecrets) != 1 {
			t.Fatalf("turning sealing on with recovery keys: %v, %d secrets", err, len(res.RecoverySecrets))
		}
		if got, want := describe(e.fresh(t)), describe(e.c); got != want {
			t.Fatalf("restart opens %q, want %q", got, want)
		}
	})
	t.Run("sealing then Disabled is refused", func(t *testing.T) {
		e, w := newSealingEnv(t)
		e.set(t, manifestOpts{threshold: 1})
		before := describe(e.c)
		for _, mode := range []string{"Disabled"} {
			_, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{threshold: 1, sealMode: mode}))
			if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "SealMode") || !strings.Contains(err.Error(), "roll back") {
				t.Fatalf("turning sealing off: %v", err)
			}
		}
		if describe(e.c) != before || describe(e.fresh(t)) != before {
			t.Fatal("a refused update changed the state")
		}
	})
	t.Run("ProductKey, UniqueKey, ProductKey across restarts", func(t *testing.T) {
		e, w := newSealingEnv(t)
		e.set(t, manifestOpts{threshold: 1})
		for i, mode := range []string{"UniqueKey", "ProductKey", "UniqueKey", ""} {
			if _, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{threshold: 1, sealMode: mode, extraSecret: i%2 == 0})); err != nil {
				t.Fatalf("to %q: %v", mode, err)
			}
			want := describe(e.c)
			e.open(t)
			if got := describe(e.c); got != want {
				t.Fatalf("after changing to %q a restart opens %q, want %q", mode, got, want)
			}
		}
	})
	t.Run("Disabled in recovery mode keeps the old files", func(t *testing.T) {
		e, w := newSealingEnv(t)
		e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1})
		e.breakKey(t)
		e.open(t)
		if _, err := e.c.SetManifest(context.Background(), w.manifest(manifestOpts{threshold: 1, sealMode: "Disabled"})); err != nil {
			t.Fatal(err)
		}
		if len(asideFiles(t, e.dir, "sealed_data")) != 1 {
			t.Fatal("the unrecovered state was not kept aside")
		}
	})
}

func TestRecoverySecretsKept(t *testing.T) {
	e, w := newSealingEnv(t)
	enc, err := e.c.SetManifest(context.Background(), w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1}))
	if err != nil {
		t.Fatal(err)
	}
	e.open(t) // kept across restarts
	got, err := e.c.RecoverySecrets(context.Background(), w.admin.peer())
	if err != nil || !bytes.Equal(got["r0"], enc["r0"]) {
		t.Fatalf("RecoverySecrets = %v, %v", got, err)
	}
	res, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{1}, threshold: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if got, err = e.c.RecoverySecrets(context.Background(), w.second.peer()); err != nil || len(got) != 1 || !bytes.Equal(got["r1"], res.RecoverySecrets["r1"]) {
		t.Fatalf("after an update: %v, %v", got, err)
	}
	if _, err := e.c.RecoverySecrets(context.Background(), nil); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("without a certificate: %v", err)
	}
	if _, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{threshold: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.RecoverySecrets(context.Background(), w.admin.peer()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("without recovery keys: %v", err)
	}
}

func TestAuthenticateUser(t *testing.T) {
	e, w := newSealingEnv(t)
	if err := e.c.AuthenticateUser(w.admin.peer()); !errors.Is(err, ErrWrongState) {
		t.Fatalf("before a manifest: %v", err)
	}
	e.set(t, manifestOpts{threshold: 1})
	if err := e.c.AuthenticateUser(w.admin.peer()); err != nil {
		t.Fatal(err)
	}
	stranger := newFaultUser(t, "stranger")
	for _, peer := range [][]*x509.Certificate{nil, {stranger.cert}, {stranger.cert, w.admin.cert}} {
		if err := e.c.AuthenticateUser(peer); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("peer of %d certificates: %v", len(peer), err)
		}
	}
}

func TestSecretLimitsRefuseUpFront(t *testing.T) {
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 1)}
	data, key := newStores().data, newStores().key
	c, err := New(context.Background(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{},
		SecretLimits: secrets.Limits{MaxSecrets: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetManifest(context.Background(), w.manifest(manifestOpts{threshold: 1})); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "QUARRY_MAX_SECRETS") {
		t.Fatalf("over the secret count: %v", err)
	}
	if c.Status() != StateAcceptingManifest || load(t, data) != nil {
		t.Fatal("a refused manifest changed the state")
	}
}

// A state sealed by an earlier version may hold a manifest that today's
// stricter Parse refuses (duplicate keys): it must still open.
func TestStoredManifestWithDuplicateKeysOpens(t *testing.T) {
	e, _ := newSealingEnv(t)
	e.set(t, manifestOpts{threshold: 1})
	old := []byte(`{"Packages":{"p":{"Debug":true}},"packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}}}`)
	if _, err := manifest.Parse(old); err == nil {
		t.Fatal("Parse accepts a manifest with duplicate keys")
	}
	s := e.c.snap.Load()
	st := *s.persisted
	st.Manifest = old
	e.c.mu.Lock()
	err := e.c.commit(context.Background(), &st, e.c.header, e.c.dek, "")
	e.c.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if f := e.fresh(t); f.Status() != StateAcceptingMarbles {
		t.Fatalf("a stored manifest with duplicate keys does not open: state %d", f.Status())
	}
}

// describeSansLog is describe without the update log (tail and head).
func describeSansLog(c *Core) string {
	s := c.snap.Load()
	st := *s.persisted
	st.UpdateLog, st.Log = nil, nil
	b, err := json.Marshal(&st)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(b)
	return "running " + hex.EncodeToString(sum[:8]) + " " + s.fingerprint[:8]
}
