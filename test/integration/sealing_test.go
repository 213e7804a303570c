package integration

import (
	"bytes"
	"crypto/rsa"
	"crypto/sha256"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SealMode Disabled first, then an update that turns sealing on: the state
// survives a SIGKILL, and the recovery secret handed out at the Disabled
// set recovers it (docs/sealing.md, "SealMode changes"; an earlier version
// answered the update with 200 and lost the state at the next restart).
func TestSealModeDisabledThenSealingSurvivesRestart(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupWith(t, func(f *fixture) {
		f.set("Config.SealMode", "Disabled")
		f.set("Config.UpdateThreshold", 1)
	})
	if _, err := os.Stat(filepath.Join(s.c.sealDir, "sealed_data")); !os.IsNotExist(err) {
		t.Fatalf("SealMode Disabled wrote sealed_data: %v", err)
	}
	alice := s.f.users["alice"].cert
	f := s.f
	f.set("Config.SealMode", "ProductKey")
	updated := f.bytes(t)
	r := do(t, s.c.client(s.root, &alice), http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": updated})
	expect(t, r, http.StatusOK, "success")
	s.raw = updated

	s.c.restart()
	hc := s.c.client(nil, nil)
	expectState(t, s.c, hc, 3, msgRunning)
	checkManifest(t, s.c, s.c.client(s.root, nil), s.root, updated)

	// The secret from the Disabled set opens the state sealing wrote.
	s.breakKey(t)
	s.upload(t, "key1", 0)
	s.checkRecovered(t)
}

// Turning sealing off is refused with a 400 that says why, and changes
// nothing.
func TestSealModeToDisabledRefused(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupWith(t, func(f *fixture) { f.set("Config.UpdateThreshold", 1) })
	alice := s.f.users["alice"].cert
	s.f.set("Config.SealMode", "Disabled")
	r := do(t, s.c.client(s.root, &alice), http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": s.f.bytes(t)})
	expect(t, r, http.StatusBadRequest, "fail")
	if !strings.Contains(r.Message, "SealMode") || !strings.Contains(r.Message, "roll back") {
		t.Fatalf("message does not say why: %q", r.Message)
	}
	s.c.restart()
	expectState(t, s.c, s.c.client(nil, nil), 3, msgRunning)
	checkManifest(t, s.c, s.c.client(s.root, nil), s.root, s.raw)
}

// A sealed_key without sealed_data (a crash during the first set) used to
// make every manifest set fail with 500 until the file was deleted by hand.
func TestStraySealedKeyBeforeFirstManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stray := filepath.Join(dir, "sealed_key")
	if err := os.WriteFile(stray, []byte("interrupted first write"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCoordinator(t, dir)
	hc := c.client(nil, nil)
	expectState(t, c, hc, 2, msgReady)
	moved, _ := filepath.Glob(stray + ".orphaned-*")
	if len(moved) != 1 || !strings.Contains(c.Logs(), moved[0]) {
		t.Fatalf("the stray key file was not moved aside with a log line: %v\n%s", moved, c.Logs())
	}
	raw := newFixture(t).bytes(t)
	expect(t, setManifest(t, c, hc, raw), http.StatusOK, "success")
	c.restart()
	expectState(t, c, hc, 3, msgRunning)
}

// sealed_key being a directory used to give a 500 at recovery.
func TestSealedKeyDirectoryAtRecovery(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 1, 0)
	s.c.kill()
	keyPath := filepath.Join(s.c.sealDir, "sealed_key")
	if err := os.Remove(keyPath); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(keyPath, 0o700); err != nil {
		t.Fatal(err)
	}
	s.c.start()
	expectState(t, s.c, s.c.client(nil, nil), 1, msgRecovery)
	s.upload(t, "key1", 0)
	s.checkRecovered(t)
	if moved, _ := filepath.Glob(keyPath + ".unusable-*"); len(moved) != 1 {
		t.Fatalf("the directory was not moved aside: %v", moved)
	}
}

// tightenSealMode sends a full update to SealMode UniqueKey as alice and
// returns the recovery secret of key1 it answered, decrypted (nil when the
// answer holds none).
func (s *recoverySetup) tightenSealMode(t *testing.T) []byte {
	t.Helper()
	alice := s.f.users["alice"].cert
	s.f.set("Config.SealMode", "UniqueKey")
	updated := s.f.bytes(t)
	r := do(t, s.c.client(s.root, &alice), http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": updated})
	expect(t, r, http.StatusOK, "success")
	s.raw = updated
	var d updateData
	decode(t, r, &d)
	if len(d.RecoverySecrets) == 0 {
		return nil
	}
	if len(d.RecoverySecrets) != 1 || d.RecoverySecrets["key1"] == nil {
		t.Fatalf("recovery secrets %v, want key1's", d.RecoverySecrets)
	}
	// The secrets are kept for GET /api/v2/recover/secrets as well.
	g := do(t, s.c.client(s.root, &alice), http.MethodGet, s.c.url("/api/v2/recover/secrets"), nil)
	expect(t, g, http.StatusOK, "success")
	var kept struct {
		RecoverySecrets map[string][]byte `json:"recoverySecrets"`
	}
	decode(t, g, &kept)
	if !bytes.Equal(kept.RecoverySecrets["key1"], d.RecoverySecrets["key1"]) {
		t.Fatal("GET /api/v2/recover/secrets does not serve the secrets the update answered")
	}
	plain, err := rsa.DecryptOAEP(sha256.New(), nil, s.keys["key1"], d.RecoverySecrets["key1"], nil)
	if err != nil {
		t.Fatalf("decrypting the new recovery secret: %v", err)
	}
	return plain
}

// An update from ProductKey (the default) to UniqueKey makes a new data
// key: its answer carries new recovery secrets, they recover the state
// after a restart in recovery mode, and the old ones no longer do
// (docs/sealing.md "SealMode changes"). Back to ProductKey keeps the key.
func TestSealModeTightenedNewRecoverySecrets(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupWith(t, func(f *fixture) { f.set("Config.UpdateThreshold", 1) })
	old := s.secrets["key1"]
	fresh := s.tightenSealMode(t)
	if fresh == nil {
		t.Fatal("the update to UniqueKey answered no recovery secrets")
	}
	if bytes.Equal(fresh, old) {
		t.Fatal("the update to UniqueKey answered the old recovery secret")
	}
	s.c.restart()
	expectState(t, s.c, s.c.client(nil, nil), 3, msgRunning)

	s.breakKey(t)
	r := postRecover(t, s.c, old, sign(t, s.keys["key1"], old))
	expect(t, r, http.StatusBadRequest, "fail")
	s.secrets["key1"] = fresh
	s.upload(t, "key1", 0)
	s.checkRecovered(t)

	// UniqueKey → ProductKey: the key stays, no new secrets.
	alice := s.f.users["alice"].cert
	s.f.set("Config.SealMode", "ProductKey")
	r = do(t, s.c.client(s.root, &alice), http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": s.f.bytes(t)})
	expect(t, r, http.StatusOK, "success")
	var d updateData
	decode(t, r, &d)
	if d.RecoverySecrets != nil {
		t.Fatalf("loosening SealMode answered recovery secrets: %v", d.RecoverySecrets)
	}
	s.raw = s.f.bytes(t)
	s.breakKey(t)
	s.upload(t, "key1", 0)
	s.checkRecovered(t)
}
