package integration

// A MarbleRun state planted in the seal directory of a Coordinator under
// (fake) Gramine: never adopted with a raw key, whatever the migration
// setting (docs/migration.md, "The enclave rule"; docs/threat-model.md).

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
	"github.com/quarry-cc/quarry/internal/marblerun"
	"github.com/quarry-cc/quarry/internal/marblerun/marbleruntest"
)

// enclaveHost is a fake Gramine device whose quotes are recorded by the
// report data they bind.
type enclaveHost struct {
	env []string
	mu  sync.Mutex
	rds [][64]byte
}

func newEnclaveHost(t *testing.T) *enclaveHost {
	t.Helper()
	s := newSGXPlatform(t, "UpToDate", nil)
	h := &enclaveHost{}
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte {
		h.mu.Lock()
		h.rds = append(h.rds, rd)
		h.mu.Unlock()
		return s.quote(t, rd)
	})
	h.env = append(s.env(), "QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir)
	return h
}

// quoted reports whether the enclave ever quoted the root rootDER.
func (h *enclaveHost) quoted(rootDER []byte) bool {
	want := attest.ReportData(rootDER, nil)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, rd := range h.rds {
		if rd == want {
			return true
		}
	}
	return false
}

// plantedDir writes the single vector's state, encrypted under a key the
// host picked, and that key raw as sealed_key: the deployment's manifest
// byte for byte, the vector's root and secrets.
func plantedDir(t *testing.T, v *mrVector) (dir string, data, key []byte) {
	t.Helper()
	sd, err := marblerun.ParseSealedData(v.data)
	if err != nil {
		t.Fatal(err)
	}
	key = make([]byte, 32)
	rand.Read(key)
	if data, err = marbleruntest.Seal(key, sd.RecoveryData, v.Store(t)); err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	for name, b := range map[string][]byte{"sealed_data": data, "sealed_key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, data, key
}

// checkPlantedNotServed: state 1, the planted root neither served, nor in
// the chain, nor quoted, and the planted files as they were (no copy).
func checkPlantedNotServed(t *testing.T, c *coordinator, h *enclaveHost, v *mrVector, data, key []byte) {
	t.Helper()
	hc := c.client(nil, nil)
	expectState(t, c, hc, 1, msgRecovery)
	r := do(t, hc, http.MethodGet, c.url("/api/v2/quote"), nil)
	expect(t, r, http.StatusOK, "success")
	var q quoteData
	decode(t, r, &q)
	if q.Quote == nil {
		t.Error("no quote under Gramine")
	}
	root := v.root(t)
	if strings.Contains(q.Cert, strings.TrimSpace(v.expected.Certificates.Root)) {
		t.Error("the chain holds the planted root")
	}
	if h.quoted(root.Raw) {
		t.Error("the enclave quoted the planted root")
	}
	// A client that pins the planted root does not get through.
	if _, err := c.client(root, nil).Get(c.url("/api/v2/status")); err == nil {
		t.Error("the Client API serves the planted root")
	}
	for name, want := range map[string][]byte{"sealed_data": data, "sealed_key": key} {
		if b, err := os.ReadFile(filepath.Join(c.sealDir, name)); err != nil || !bytes.Equal(b, want) {
			t.Errorf("%s was changed: %v", name, err)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(c.sealDir, "*.marblerun-*")); len(m) != 0 {
		t.Errorf("a migration began: %v", m)
	}
}

// checkMigration runs --check-migration with env on dir.
func checkMigration(t *testing.T, dir string, env []string) (int, string) {
	t.Helper()
	cmd := exec.Command(coordinatorBin, "--check-migration")
	cmd.Env = append([]string{"EDG_COORDINATOR_SEAL_DIR=" + dir, "PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// TestGramineRefusesPlantedMarbleRunState: by default (and with 0) the
// enclave treats a MarbleRun state as unreadable: recovery mode, the files
// untouched, the recovery refused naming the setting, the dry run too.
func TestGramineRefusesPlantedMarbleRunState(t *testing.T) {
	t.Parallel()
	v := readMarbleRunVector(t, "single")
	h := newEnclaveHost(t)
	for _, setting := range []string{"", "QUARRY_MIGRATE_MARBLERUN=0"} {
		t.Run("setting="+setting, func(t *testing.T) {
			dir, data, key := plantedDir(t, v)
			env := h.env
			if setting != "" {
				env = append(env[:len(env):len(env)], setting)
			}
			code, out := checkMigration(t, dir, env)
			if code != 1 || !strings.Contains(out, "QUARRY_MIGRATE_MARBLERUN=1") || !strings.Contains(out, "would NOT migrate") {
				t.Errorf("--check-migration: exit %d\n%s", code, out)
			}
			c := startCoordinator(t, dir, env...)
			checkPlantedNotServed(t, c, h, v, data, key)
			if !strings.Contains(c.Logs(), "QUARRY_MIGRATE_MARBLERUN=1") {
				t.Errorf("the log does not name the setting:\n%s", c.Logs())
			}
			// Even the deployment's genuine, signed secret is refused:
			// the migration is off.
			k := v.recoveryOrder()[0]
			secret, sig := v.recoverBody(t, k)
			r := postRecover(t, c, secret, sig)
			expect(t, r, http.StatusConflict, "fail")
			if !strings.Contains(r.Message, "--migrate-marblerun=1") || !strings.Contains(r.Message, "QUARRY_MIGRATE_MARBLERUN=1") {
				t.Errorf("the refusal does not name the setting: %q", r.Message)
			}
			c.restart()
			checkPlantedNotServed(t, c, h, v, data, key)
		})
	}
}

// TestGramineMigrationOptIn: with QUARRY_MIGRATE_MARBLERUN=1 the planted
// state is still not taken with its raw key, nor with the key uploaded
// unsigned (v1) or signed by a key outside its manifest; a genuine MarbleRun
// state is migrated after MarbleRun's signed recovery, and the shipped
// setting (0) then opens it.
func TestGramineMigrationOptIn(t *testing.T) {
	t.Parallel()
	v := readMarbleRunVector(t, "single")
	h := newEnclaveHost(t)
	on := append(h.env[:len(h.env):len(h.env)], "QUARRY_MIGRATE_MARBLERUN=1", "QUARRY_ENABLE_V1_RECOVER=1")

	t.Run("planted", func(t *testing.T) {
		dir, data, key := plantedDir(t, v)
		code, out := checkMigration(t, dir, on)
		if code != 0 || !strings.Contains(out, "recovery needed: yes") || !strings.Contains(out, "raw data key") || !strings.Contains(out, "only signed recovery secrets") {
			t.Errorf("--check-migration: exit %d\n%s", code, out)
		}
		c := startCoordinator(t, dir, on...)
		checkPlantedNotServed(t, c, h, v, data, key)
		r := do(t, c.client(nil, nil), http.MethodPost, c.url("/recover"), toInts(key))
		expectV1(t, r, http.StatusForbidden, "error")
		if !strings.Contains(r.Message, "/api/v2/recover") {
			t.Errorf("unsigned v1 upload: %q", r.Message)
		}
		attacker, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		expect(t, postRecover(t, c, key, sign(t, attacker, key)), http.StatusBadRequest, "fail")
		checkPlantedNotServed(t, c, h, v, data, key)
	})

	t.Run("genuine", func(t *testing.T) {
		dir := v.sealDir(t, true)
		c := startCoordinator(t, dir, on...)
		checkPlantedNotServed(t, c, h, v, v.data, v.key)
		for _, k := range v.recoveryOrder() {
			secret, sig := v.recoverBody(t, k)
			expect(t, postRecover(t, c, secret, sig), http.StatusOK, "success")
		}
		checkMigratedAPI(t, c, v)
		if !h.quoted(v.root(t).Raw) {
			t.Error("the migrated root was not quoted")
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "sealed_key")); bytes.Contains(b, v.key) {
			t.Error("the data key is in clear in sealed_key after the migration")
		}
		c.kill()
		c.env = h.env // the shipped enclave: migration off
		c.start()
		checkMigratedAPI(t, c, v)
	})
}

// TestGramineRefusesRestoredSimulationBackup: a backup of a Coordinator
// without an enclave (its data key in clear, known to whoever holds the
// backup) restored into the enclave's seal directory opens to recovery mode;
// the data key uploaded without a signature is refused, so the restored root
// is never served or quoted unless the manifest's recovery keys sign.
func TestGramineRefusesRestoredSimulationBackup(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupN(t, 1, func(*fixture) {})
	file := filepath.Join(t.TempDir(), "sim.qbk")
	runToolOK(t, "backup", "--seal-dir", s.c.sealDir, "--out", file)
	s.c.kill()
	dir := filepath.Join(t.TempDir(), "enclave")
	runToolOK(t, "restore", "--seal-dir", dir, "--in", file)
	data, _ := os.ReadFile(filepath.Join(dir, "sealed_data"))
	key, _ := os.ReadFile(filepath.Join(dir, "sealed_key"))

	h := newEnclaveHost(t)
	c := startCoordinator(t, dir, append(h.env[:len(h.env):len(h.env)], "QUARRY_ENABLE_V1_RECOVER=1")...)
	hc := c.client(nil, nil)
	expectState(t, c, hc, 1, msgRecovery)
	if !strings.Contains(c.Logs(), "sealed another way") {
		t.Errorf("the log does not say the key was not sealed by the enclave:\n%s", c.Logs())
	}
	// With one recovery key its secret is the data key, which lies in
	// clear in the backup's sealed_key.
	secret := s.secrets["key1"]
	if !bytes.Contains(key, secret) {
		t.Fatal("the simulation backup does not hold the data key in clear")
	}
	r := do(t, hc, http.MethodPost, c.url("/recover"), toInts(secret))
	expectV1(t, r, http.StatusForbidden, "error")
	attacker, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, postRecover(t, c, secret, sign(t, attacker, secret)), http.StatusBadRequest, "fail")
	expectState(t, c, hc, 1, msgRecovery)
	if fetchRoot(t, c, hc).Equal(s.root) || h.quoted(s.root.Raw) {
		t.Error("the restored root is served or quoted")
	}
	for name, want := range map[string][]byte{"sealed_data": data, "sealed_key": key} {
		if b, _ := os.ReadFile(filepath.Join(dir, name)); !bytes.Equal(b, want) {
			t.Errorf("%s was changed", name)
		}
	}
	// The manifest's recovery key recovers it, and the enclave seals it.
	expect(t, postRecover(t, c, secret, sign(t, s.keys["key1"], secret)), http.StatusOK, "success")
	expectState(t, c, hc, 3, msgRunning)
	if b, _ := os.ReadFile(filepath.Join(dir, "sealed_key")); bytes.Contains(b, secret) {
		t.Error("the data key is still in clear")
	}
}
