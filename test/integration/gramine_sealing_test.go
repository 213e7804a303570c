package integration

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
	"github.com/quarry-cc/quarry/internal/seal"
)

// gramineSealing is a Coordinator under (fake) Gramine: real DCAP quotes
// through the FIFO device, sealing with the device's sealing keys.
type gramineSealing struct {
	*recoverySetup
	dev *graminetest.Device
}

func newGramineSealing(t *testing.T, mode string) *gramineSealing {
	t.Helper()
	s := newSGXPlatform(t, "UpToDate", nil)
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte { return s.quote(t, rd) })
	env := append(s.env(), "QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir)
	rs := newRecoverySetupEnv(t, env, func(f *fixture) {
		f.set("Config.SealMode", mode)
		f.set("Config.UpdateThreshold", 1)
	})
	return &gramineSealing{recoverySetup: rs, dev: dev}
}

func (g *gramineSealing) keyFile(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.c.sealDir, "sealed_key"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// With each seal mode (docs/sealing.md, "Where the data key is sealed") the state opens after a restart; another
// enclave's key (or signer's) leads to recovery mode, and the recovery
// secret restores and re-seals it with the current key; an older
// sealed_key leads to recovery mode; the data key is never in clear.
func TestGramineSealing(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"", "ProductKey", "UniqueKey"} {
		t.Run("mode="+mode, func(t *testing.T) {
			g := newGramineSealing(t, mode)
			hc := g.c.client(nil, nil)
			if !strings.Contains(g.c.Logs(), "sealing with Gramine's SGX sealing keys") {
				t.Fatalf("not sealing with Gramine's keys:\n%s", g.c.Logs())
			}
			g.c.restart()
			expectState(t, g.c, hc, 3, msgRunning)

			// The data key is never in the key file in clear, and the
			// key file names the sealer and the mode.
			key := g.keyFile(t)
			entries, err := seal.DecodeKeyFile(key)
			if err != nil || len(entries) == 0 || !bytes.HasPrefix(entries[0].Sealed, []byte("QRYGSK")) {
				t.Fatalf("key file: %v, %d entries", err, len(entries))
			}
			want := mode
			if want == "" {
				want = "ProductKey"
			}
			if !bytes.Contains(entries[0].Sealed, []byte(want)) {
				t.Errorf("the sealed key does not name seal mode %s", want)
			}
			dek := g.secrets["key1"] // with one recovery key, the secret is the data key
			if bytes.Contains(key, dek) {
				t.Fatal("sealed_key holds the data key in clear")
			}

			// Another enclave (UniqueKey) or signer (ProductKey).
			old := append([]byte{}, key...)
			g.c.kill()
			g.dev.SetSealingKey(t, want, nil)
			g.c.start()
			expectState(t, g.c, hc, 1, msgRecovery)
			if !strings.Contains(g.c.Logs(), "sealed by another enclave") {
				t.Errorf("the log does not say the key was sealed by another enclave:\n%s", g.c.Logs())
			}
			g.upload(t, "key1", 0)
			g.checkRecovered(t) // restarts: re-sealed with the current key
			if bytes.Equal(g.keyFile(t), old) {
				t.Fatal("the recovered state was not sealed again")
			}

			// An older sealed_key with newer sealed_data.
			older := g.keyFile(t)
			alice := g.f.users["alice"].cert
			r := do(t, g.c.client(g.root, &alice), http.MethodPost, g.c.url("/api/v2/update"), map[string][]byte{"manifest": packageUpdate(2)})
			expect(t, r, http.StatusOK, "success")
			r = do(t, g.c.client(g.root, &alice), http.MethodPost, g.c.url("/api/v2/update"), map[string][]byte{"manifest": packageUpdate(3)})
			expect(t, r, http.StatusOK, "success")
			g.c.kill()
			if err := os.WriteFile(filepath.Join(g.c.sealDir, "sealed_key"), older, 0o600); err != nil {
				t.Fatal(err)
			}
			g.c.start()
			expectState(t, g.c, hc, 1, msgRecovery)
			if !strings.Contains(g.c.Logs(), "belongs to another sealed_data") {
				t.Errorf("the log does not say the key belongs to another sealed_data:\n%s", g.c.Logs())
			}
		})
	}
}

// Disabled ↔ ProductKey through updates under Gramine: nothing lost across
// restarts; turning sealing off is refused.
func TestGramineSealingDisabledRoundTrip(t *testing.T) {
	t.Parallel()
	g := newGramineSealing(t, "Disabled")
	hc := g.c.client(nil, nil)
	alice := g.f.users["alice"].cert
	g.f.set("Config.SealMode", "ProductKey")
	updated := g.f.bytes(t)
	r := do(t, g.c.client(g.root, &alice), http.MethodPost, g.c.url("/api/v2/update"), map[string][]byte{"manifest": updated})
	expect(t, r, http.StatusOK, "success")
	g.c.restart()
	expectState(t, g.c, hc, 3, msgRunning)
	checkManifest(t, g.c, g.c.client(g.root, nil), g.root, updated)
	g.f.set("Config.SealMode", "Disabled")
	r = do(t, g.c.client(g.root, &alice), http.MethodPost, g.c.url("/api/v2/update"), map[string][]byte{"manifest": g.f.bytes(t)})
	expect(t, r, http.StatusBadRequest, "fail")
	g.c.restart()
	checkManifest(t, g.c, g.c.client(g.root, nil), g.root, updated)
}

// Under Gramine without sealing keys the Coordinator refuses to start,
// naming the override; with the override it starts and warns.
func TestGramineSealingRefusedWithoutKeys(t *testing.T) {
	t.Parallel()
	s := newSGXPlatform(t, "UpToDate", nil)
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte { return s.quote(t, rd) })
	if err := os.RemoveAll(filepath.Join(dev.Dir, "keys")); err != nil {
		t.Fatal(err)
	}
	env := append(s.env(), "QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir)
	code, out := runCoordinatorOnce(t, env...)
	if code == 0 || !strings.Contains(out, "QUARRY_INSECURE_SIMULATED_SEALING") {
		t.Fatalf("exit %d without sealing keys, log:\n%s", code, out)
	}
	c := startCoordinator(t, "", append(env, "QUARRY_INSECURE_SIMULATED_SEALING=1")...)
	if !strings.Contains(c.Logs(), "INSECURE: running under Gramine with simulated sealing") {
		t.Fatalf("no warning with the override:\n%s", c.Logs())
	}
	c.restart()
	if strings.Count(c.Logs(), "INSECURE: running under Gramine with simulated sealing") < 2 {
		t.Fatal("no warning at the second start")
	}
}

// sameSignerSealer is an enclave of the device's signer with another
// MRENCLAVE, as code the test runs itself: the device's MRSIGNER sealing
// key, a MRENCLAVE sealing key of its own.
func (g *gramineSealing) sameSignerSealer(t *testing.T) seal.GramineKeySealer {
	t.Helper()
	signer, err := (seal.GramineKeySealer{Dir: g.dev.Dir}).SealingKey(seal.ModeProductKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	enclave := make([]byte, 16)
	rand.Read(enclave)
	for name, k := range map[string][]byte{seal.GramineMRSignerKey: signer, seal.GramineMREnclaveKey: enclave} {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), k, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return seal.GramineKeySealer{Dir: dir}
}

// opensWith counts the entries of sealed_key whose key, unsealed by
// sealer, decrypts sealed_data.
func (g *gramineSealing) opensWith(t *testing.T, sealer seal.KeySealer) int {
	t.Helper()
	blob, err := os.ReadFile(filepath.Join(g.c.sealDir, "sealed_data"))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := seal.DecodeKeyFile(g.keyFile(t))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if dek, err := sealer.UnsealKey(e.Sealed, e.Binding[:]); err == nil {
			if _, _, err := seal.Open(dek, blob); err == nil {
				n++
			}
		}
	}
	return n
}

// Under (fake) Gramine, ProductKey → UniqueKey: an enclave of the same
// signer with another MRENCLAVE opens the new sealed_data with no entry of
// sealed_key (before the update it can); the answer's new recovery secret
// is what recovers the state on a new enclave build, the old one is
// refused (docs/sealing.md "SealMode changes").
func TestGramineSealModeTightened(t *testing.T) {
	t.Parallel()
	g := newGramineSealing(t, "ProductKey")
	hc := g.c.client(nil, nil)
	other := g.sameSignerSealer(t)
	if g.opensWith(t, other) == 0 {
		t.Fatal("setup: an enclave of the same signer does not open the ProductKey state")
	}
	old := g.secrets["key1"]
	fresh := g.tightenSealMode(t)
	if fresh == nil || bytes.Equal(fresh, old) {
		t.Fatal("the update to UniqueKey answered no new recovery secret")
	}
	if n := g.opensWith(t, other); n != 0 {
		t.Fatalf("an enclave of the same signer with another MRENCLAVE opens the new state with %d entries of sealed_key", n)
	}
	g.c.restart()
	expectState(t, g.c, hc, 3, msgRunning)

	// A new enclave build of the same signer: recovery mode; only the
	// new secret recovers.
	g.c.kill()
	g.dev.SetSealingKey(t, seal.ModeUniqueKey, nil)
	g.c.start()
	expectState(t, g.c, hc, 1, msgRecovery)
	expect(t, postRecover(t, g.c, old, sign(t, g.keys["key1"], old)), http.StatusBadRequest, "fail")
	g.secrets["key1"] = fresh
	g.upload(t, "key1", 0)
	g.checkRecovered(t)
}

// fakeGramineDir is a Gramine attestation directory as an enclave sees it
// (attestation type typ, both sealing keys), without a quoting enclave
// behind it: what a Coordinator finds in Gramine when it does not ask for
// quotes.
func fakeGramineDir(t *testing.T, typ string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "attestation")
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "attestation_type"), []byte(typ+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{seal.GramineMRSignerKey, seal.GramineMREnclaveKey} {
		key := make([]byte, 16)
		rand.Read(key)
		if err := os.WriteFile(filepath.Join(dir, name), key, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestGramineSealingFailsClosed: where Gramine's attestation directory
// exists, a Coordinator that would not seal with the enclave's sealing
// keys refuses to start (exit 1), naming what to set, and writes nothing:
// with the default attestation (simulation), and with auto when Gramine's
// attestation type is not dcap. The insecure override starts it with the
// warning and the data key in clear; without the directory simulation runs
// as before.
func TestGramineSealingFailsClosed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, typ string
		env       []string
		words     []string
	}{
		{"default attestation", "dcap", nil,
			[]string{"the attestation is simulation (QUARRY_ATTESTATION)", "QUARRY_ATTESTATION=gramine"}},
		{"simulation", "dcap", []string{"QUARRY_ATTESTATION=simulation"},
			[]string{"the attestation is simulation (QUARRY_ATTESTATION)"}},
		{"auto, epid", "epid", []string{"QUARRY_ATTESTATION=auto"},
			[]string{`Gramine's attestation type is \"epid\", not dcap`}},
		{"auto, none", "none", []string{"QUARRY_ATTESTATION=auto"},
			[]string{`Gramine's attestation type is \"none\", not dcap`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fakeGramineDir(t, tc.typ)
			sealDir := t.TempDir()
			env := append([]string{"QUARRY_GRAMINE_ATTESTATION_DIR=" + dir, "EDG_COORDINATOR_SEAL_DIR=" + sealDir}, tc.env...)
			code, out := runCoordinatorOnce(t, env...)
			if code != 1 || !strings.Contains(out, "cannot start") {
				t.Fatalf("exit %d, want 1 (cannot start); log:\n%s", code, out)
			}
			for _, w := range append(tc.words, "Gramine's attestation directory", "exists", "in clear",
				`sgx.remote_attestation = \"dcap\"`, "QUARRY_INSECURE_SIMULATED_SEALING=1") {
				if !strings.Contains(out, w) {
					t.Errorf("the refusal does not say %q:\n%s", w, out)
				}
			}
			if _, err := os.Stat(filepath.Join(sealDir, "sealed_key")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the refused start wrote sealed_key: %v", err)
			}

			// The override: starts, warns, keeps the data key in clear.
			c := startCoordinator(t, sealDir, append(env, "QUARRY_INSECURE_SIMULATED_SEALING=1")...)
			if !strings.Contains(c.Logs(), "INSECURE: running under Gramine with simulated sealing") {
				t.Fatalf("no warning with the override:\n%s", c.Logs())
			}
			hc := c.client(nil, nil)
			_, adminPEM := newUserCert(t, "admin")
			expect(t, setManifest(t, c, hc, marbleManifest(t, adminPEM)), http.StatusOK, "success")
			entries, err := seal.DecodeKeyFile(readFileT(t, filepath.Join(sealDir, "sealed_key")))
			if err != nil || len(entries) != 1 || len(entries[0].Sealed) != 32 {
				t.Fatalf("with the override the key file should hold the data key in clear: %v, %+v", err, entries)
			}
		})
	}

	// No attestation directory: simulation as before.
	c := startCoordinator(t, "", "QUARRY_GRAMINE_ATTESTATION_DIR="+filepath.Join(t.TempDir(), "absent"))
	if !strings.Contains(c.Logs(), "sealing in simulation mode") || strings.Contains(c.Logs(), "INSECURE") {
		t.Fatalf("without the directory:\n%s", c.Logs())
	}
}

func readFileT(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
