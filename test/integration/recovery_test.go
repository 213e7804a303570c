package integration

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recoverySetup is a running coordinator whose manifest has recovery keys,
// with the decrypted recovery secrets.
type recoverySetup struct {
	c       *coordinator
	f       *fixture
	raw     []byte
	root    *x509.Certificate
	keys    map[string]*rsa.PrivateKey
	secrets map[string][]byte // plain, decrypted with the recovery keys
}

func newRecoverySetup(t *testing.T, n int, threshold int) *recoverySetup {
	t.Helper()
	return newRecoverySetupN(t, n, func(f *fixture) {
		if threshold > 0 {
			f.set("Config.RecoveryThreshold", threshold)
		}
	})
}

// newRecoverySetupWith is newRecoverySetup with one recovery key and the
// fixture changed by change before the manifest is set.
func newRecoverySetupWith(t *testing.T, change func(f *fixture)) *recoverySetup {
	t.Helper()
	return newRecoverySetupN(t, 1, change)
}

func newRecoverySetupN(t *testing.T, n int, change func(f *fixture)) *recoverySetup {
	t.Helper()
	return newRecoverySetupIn(t, n, nil, change)
}

// newRecoverySetupEnv is newRecoverySetupWith on a Coordinator started with
// the environment env.
func newRecoverySetupEnv(t *testing.T, env []string, change func(f *fixture)) *recoverySetup {
	t.Helper()
	return newRecoverySetupIn(t, 1, env, change)
}

func newRecoverySetupIn(t *testing.T, n int, env []string, change func(f *fixture)) *recoverySetup {
	t.Helper()
	return newRecoverySetupOn(t, startCoordinator(t, "", env...), n, change)
}

// newRecoverySetupOn is newRecoverySetupN on the Coordinator c.
func newRecoverySetupOn(t *testing.T, c *coordinator, n int, change func(f *fixture)) *recoverySetup {
	t.Helper()
	hc := c.client(nil, nil)
	root := fetchRoot(t, c, hc)
	f := newFixture(t)
	keys := map[string]*rsa.PrivateKey{}
	pems := map[string]any{}
	for i, k := range recoveryKeys(t, n) {
		name := fmt.Sprintf("key%d", i+1)
		keys[name] = k
		pems[name] = publicKeyPEM(t, k)
	}
	f.set("RecoveryKeys", pems)
	change(f)
	raw := f.bytes(t)
	r := setManifest(t, c, hc, raw)
	expect(t, r, http.StatusOK, "success")
	var set struct {
		RecoverySecrets map[string][]byte `json:"RecoverySecrets"`
	}
	decode(t, r, &set)
	if len(set.RecoverySecrets) != n {
		t.Fatalf("got %d recovery secrets, want %d", len(set.RecoverySecrets), n)
	}
	s := &recoverySetup{c: c, f: f, raw: raw, root: root, keys: keys, secrets: map[string][]byte{}}
	for name, ct := range set.RecoverySecrets {
		k, ok := keys[name]
		if !ok {
			t.Fatalf("recovery secret for unknown key %q", name)
		}
		// Exactly what MarbleRun's CLI does: RSA-OAEP with SHA-256.
		plain, err := rsa.DecryptOAEP(sha256.New(), nil, k, ct, nil)
		if err != nil {
			t.Fatalf("decrypting the recovery secret of %s: %v", name, err)
		}
		s.secrets[name] = plain
	}
	return s
}

// breakKey kills the coordinator, removes sealed_key and starts it again:
// recovery mode.
func (s *recoverySetup) breakKey(t *testing.T) {
	t.Helper()
	s.c.kill()
	if err := os.Remove(filepath.Join(s.c.sealDir, "sealed_key")); err != nil {
		t.Fatal(err)
	}
	s.c.start()
	expectState(t, s.c, s.c.client(nil, nil), 1, msgRecovery)
}

func sign(t *testing.T, k *rsa.PrivateKey, secret []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(secret)
	sig, err := rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

type recoverData struct {
	Remaining int    `json:"remaining"`
	Message   string `json:"message"`
}

func postRecover(t *testing.T, c *coordinator, secret, sig []byte) response {
	t.Helper()
	return do(t, c.client(nil, nil), http.MethodPost, c.url("/api/v2/recover"),
		map[string][]byte{"recoverySecret": secret, "recoverySecretSignature": sig})
}

// upload sends the named key's secret and expects success with remaining.
func (s *recoverySetup) upload(t *testing.T, name string, remaining int) {
	t.Helper()
	r := postRecover(t, s.c, s.secrets[name], sign(t, s.keys[name], s.secrets[name]))
	expect(t, r, http.StatusOK, "success")
	var d recoverData
	decode(t, r, &d)
	want := "Recovery successful."
	if remaining > 0 {
		want = fmt.Sprintf("Secret was processed successfully. Upload the next secret. Remaining secrets: %d", remaining)
	}
	if d.Remaining != remaining || d.Message != want {
		t.Fatalf("recover %s: %+v, want remaining %d %q", name, d, remaining, want)
	}
}

// checkRecovered checks state 3 with the original root and manifest, and
// that a restart needs no recovery.
func (s *recoverySetup) checkRecovered(t *testing.T) {
	t.Helper()
	hc := s.c.client(nil, nil)
	expectState(t, s.c, hc, 3, msgRunning)
	if root := fetchRoot(t, s.c, hc); !root.Equal(s.root) {
		t.Fatal("the recovered Coordinator has another root certificate")
	}
	checkManifest(t, s.c, s.c.client(s.root, nil), s.root, s.raw)
	s.c.restart()
	expectState(t, s.c, hc, 3, msgRunning)
	checkManifest(t, s.c, s.c.client(s.root, nil), s.root, s.raw)
}

func TestRecoverySingleKey(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 1, 0)
	if len(s.secrets["key1"]) != 32 {
		t.Fatalf("single-key recovery secret has %d bytes, want the 32-byte data key", len(s.secrets["key1"]))
	}
	// Not in recovery mode yet: 409.
	r := postRecover(t, s.c, s.secrets["key1"], sign(t, s.keys["key1"], s.secrets["key1"]))
	expect(t, r, http.StatusConflict, "fail")
	expect(t, do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/recover/public-key"), nil), http.StatusConflict, "fail")

	s.breakKey(t)
	s.upload(t, "key1", 0)
	s.checkRecovered(t)
}

func TestRecoveryTwoKeysXOR(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 2, 0)
	s.breakKey(t)
	s.upload(t, "key1", 1)
	s.upload(t, "key2", 0)
	s.checkRecovered(t)
}

func TestRecoveryThresholdTwoOfThree(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 3, 2)
	for _, k := range s.secrets {
		if len(k) != 33 {
			t.Fatalf("Shamir share has %d bytes, want 33", len(k))
		}
	}
	for _, pair := range [][2]string{{"key1", "key2"}, {"key1", "key3"}, {"key3", "key2"}} {
		t.Run(pair[0]+"+"+pair[1], func(t *testing.T) {
			s.breakKey(t)
			s.upload(t, pair[0], 1)
			s.upload(t, pair[1], 0)
			s.checkRecovered(t)
		})
	}
}

func TestRecoveryWithEphemeralKey(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 2, 0)
	s.breakKey(t)
	hc := s.c.client(nil, nil)
	r := do(t, hc, http.MethodGet, s.c.url("/api/v2/recover/public-key"), nil)
	expect(t, r, http.StatusOK, "success")
	var pk struct {
		Algorithm string `json:"algorithm"`
		Key       []byte `json:"ephemeralPublicKey"`
	}
	decode(t, r, &pk)
	pub, err := x509.ParsePKIXPublicKey(pk.Key)
	if err != nil || pk.Algorithm != "RSA" {
		t.Fatalf("public key %q: %v", pk.Algorithm, err)
	}
	rsaPub := pub.(*rsa.PublicKey)
	if rsaPub.N.BitLen() != 4096 {
		t.Errorf("ephemeral key has %d bits, want 4096", rsaPub.N.BitLen())
	}
	// The same key is served again.
	r2 := do(t, hc, http.MethodGet, s.c.url("/api/v2/recover/public-key"), nil)
	var pk2 struct {
		Key []byte `json:"ephemeralPublicKey"`
	}
	decode(t, r2, &pk2)
	if string(pk2.Key) != string(pk.Key) {
		t.Fatal("ephemeral key changed between requests")
	}
	for i, name := range []string{"key1", "key2"} {
		ct, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, rsaPub, s.secrets[name], nil)
		if err != nil {
			t.Fatal(err)
		}
		r := postRecover(t, s.c, ct, sign(t, s.keys[name], s.secrets[name]))
		expect(t, r, http.StatusOK, "success")
		var d recoverData
		decode(t, r, &d)
		if d.Remaining != 1-i {
			t.Fatalf("remaining %d", d.Remaining)
		}
	}
	s.checkRecovered(t)
}

func TestRecoveryRejectsBadUploads(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 2, 0)
	s.breakKey(t)
	// Malformed bodies in recovery mode: 400, and the round is not touched.
	for _, body := range []string{"{", `{"recoverySecret":"AAAA"}`, `{"recoverySecretSignature":"AAAA"}`} {
		expect(t, do(t, s.c.client(nil, nil), http.MethodPost, s.c.url("/api/v2/recover"), body), http.StatusBadRequest, "fail")
	}
	k1 := s.secrets["key1"]
	garbage := make([]byte, 32)
	rand.Read(garbage)
	for _, tc := range []struct {
		name        string
		secret, sig []byte
		want        string
	}{
		{"signature by another recovery key", k1, sign(t, s.keys["key2"], k1), "signature"},
		{"garbage signature", k1, []byte("not a signature"), "signature"},
		{"garbage secret", garbage, sign(t, s.keys["key1"], garbage), "not a recovery secret"},
		{"wrong length without ephemeral key", []byte("short"), sign(t, s.keys["key1"], []byte("short")), "ephemeral key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := postRecover(t, s.c, tc.secret, tc.sig)
			expect(t, r, http.StatusBadRequest, "fail")
			if !strings.Contains(r.Message, tc.want) {
				t.Fatalf("message %q does not contain %q", r.Message, tc.want)
			}
			expectState(t, s.c, s.c.client(nil, nil), 1, msgRecovery)
		})
	}
	// The round continues after the rejections: the first share counts...
	s.upload(t, "key1", 1)
	// ...a reused share is refused and does not count...
	r := postRecover(t, s.c, k1, sign(t, s.keys["key1"], k1))
	expect(t, r, http.StatusBadRequest, "fail")
	if !strings.Contains(r.Message, "already uploaded") {
		t.Fatalf("reused share message %q", r.Message)
	}
	// ...and the second completes the recovery.
	s.upload(t, "key2", 0)
	s.checkRecovered(t)
	// Recovery in state 3: 409.
	r = postRecover(t, s.c, k1, sign(t, s.keys["key1"], k1))
	expect(t, r, http.StatusConflict, "fail")
	// Malformed bodies: in state 3 the state is checked first (409, docs/design/decisions.md#d16).
	for _, body := range []string{"{", `{"recoverySecret":"AAAA"}`, `{"recoverySecretSignature":"AAAA"}`} {
		expect(t, do(t, s.c.client(nil, nil), http.MethodPost, s.c.url("/api/v2/recover"), body), http.StatusConflict, "fail")
	}
}

func TestRecoveryWithCorruptKeyFile(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 1, 0)
	s.c.kill()
	keyPath := filepath.Join(s.c.sealDir, "sealed_key")
	bad := make([]byte, 32)
	rand.Read(bad)
	if err := os.WriteFile(keyPath, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	s.c.start()
	expectState(t, s.c, s.c.client(nil, nil), 1, msgRecovery)
	s.upload(t, "key1", 0)
	s.checkRecovered(t)
}

func TestNewManifestInRecoveryModeResets(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 1, 0)
	s.breakKey(t)
	before, _ := os.ReadFile(filepath.Join(s.c.sealDir, "sealed_data"))
	hc := s.c.client(nil, nil)
	_, root := getChain(t, s.c, hc)
	raw := newFixture(t).bytes(t)
	expect(t, setManifest(t, s.c, hc, raw), http.StatusOK, "success")
	expectState(t, s.c, hc, 3, msgRunning)
	checkManifest(t, s.c, s.c.client(root, nil), root, raw)
	moved, _ := filepath.Glob(filepath.Join(s.c.sealDir, "sealed_data.unrecovered-*"))
	if len(moved) != 1 {
		t.Fatalf("moved-aside files %v", moved)
	}
	if old, _ := os.ReadFile(moved[0]); string(old) != string(before) {
		t.Fatal("the moved-aside file is not the old sealed state")
	}
	if !strings.Contains(s.c.Logs(), moved[0]) {
		t.Errorf("the log does not say where the old state went:\n%s", s.c.Logs())
	}
	s.c.restart()
	expectState(t, s.c, hc, 3, msgRunning)
	checkManifest(t, s.c, s.c.client(root, nil), root, raw)
}
