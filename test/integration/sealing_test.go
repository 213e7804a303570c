package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SealMode Disabled first, then an update that turns sealing on: the state
// survives a SIGKILL, and the recovery secret handed out at the Disabled
// set recovers it (issue 12; today the update answered 200 and the state
// was lost at the next restart).
func TestSealModeDisabledThenSealingSurvivesRestart(t *testing.T) {
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
