package integration

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const (
	msgRecovery = "Coordinator is in recovery mode. Either upload a key to unseal the saved state, or set a new manifest. For more information on how to proceed, consult the documentation."
	msgReady    = "Coordinator is ready to accept a manifest."
	msgRunning  = "Coordinator is running correctly and ready to accept marbles."
)

type statusData struct {
	Code    int    `json:"code"`
	Status  int    `json:"status"`
	Message string `json:"message"`
}

func getStatus(t *testing.T, c *coordinator, hc *http.Client) statusData {
	t.Helper()
	r := do(t, hc, http.MethodGet, c.url("/api/v2/status"), nil)
	expect(t, r, http.StatusOK, "success")
	var s statusData
	decode(t, r, &s)
	if s.Code != s.Status {
		t.Fatalf("status data code %d != status %d", s.Code, s.Status)
	}
	return s
}

func expectState(t *testing.T, c *coordinator, hc *http.Client, code int, msg string) {
	t.Helper()
	s := getStatus(t, c, hc)
	if s.Code != code || s.Message != msg {
		t.Fatalf("status = %d %q, want %d %q", s.Code, s.Message, code, msg)
	}
}

type quoteData struct {
	Cert  string  `json:"cert"`
	Quote *string `json:"quote"`
}

// getChain fetches /api/v2/quote and returns the intermediate and root.
func getChain(t *testing.T, c *coordinator, hc *http.Client) (inter, root *x509.Certificate) {
	t.Helper()
	r := do(t, hc, http.MethodGet, c.url("/api/v2/quote"), nil)
	expect(t, r, http.StatusOK, "success")
	var q quoteData
	decode(t, r, &q)
	if q.Quote != nil {
		t.Fatalf("simulation quote = %q, want null", *q.Quote)
	}
	certs := parseChain(t, q.Cert)
	if len(certs) != 2 {
		t.Fatalf("chain has %d certificates, want 2", len(certs))
	}
	inter, root = certs[0], certs[1]
	if err := inter.CheckSignatureFrom(root); err != nil {
		t.Fatalf("intermediate is not signed by the root: %v", err)
	}
	if err := root.CheckSignatureFrom(root); err != nil {
		t.Fatalf("root is not self-signed: %v", err)
	}
	return inter, root
}

func parseChain(t *testing.T, text string) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	rest := []byte(text)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

type manifestData struct {
	Signature   []byte `json:"manifestSignatureRootECDSA"`
	Fingerprint string `json:"manifestFingerprint"`
	Manifest    []byte `json:"manifest"`
}

func setManifest(t *testing.T, c *coordinator, hc *http.Client, raw []byte) response {
	t.Helper()
	return do(t, hc, http.MethodPost, c.url("/api/v2/manifest"), map[string][]byte{"manifest": raw})
}

func TestStatusAndManifestLifecycle(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	expectState(t, c, hc, 2, msgReady)

	// Pin the root fetched before the manifest, as clients do.
	_, root := getChain(t, c, hc)
	pinned := c.client(root, nil)
	expectState(t, c, pinned, 2, msgReady)

	r := do(t, pinned, http.MethodGet, c.url("/api/v2/manifest"), nil)
	expect(t, r, http.StatusConflict, "fail")

	raw := newFixture(t).bytes(t)
	r = setManifest(t, c, pinned, raw)
	expect(t, r, http.StatusOK, "success")
	var set struct {
		RecoverySecrets map[string][]byte `json:"RecoverySecrets"`
	}
	decode(t, r, &set)
	if set.RecoverySecrets == nil || len(set.RecoverySecrets) != 0 {
		t.Fatalf("RecoverySecrets = %v, want an empty object", set.RecoverySecrets)
	}
	expectState(t, c, pinned, 3, msgRunning)

	checkManifest(t, c, pinned, root, raw)

	// A second set is refused and changes nothing.
	r = setManifest(t, c, pinned, raw)
	expect(t, r, http.StatusConflict, "fail")
	if !strings.Contains(r.Message, "server is not in expected state") {
		t.Errorf("409 message = %q", r.Message)
	}
	checkManifest(t, c, pinned, root, raw)

	// Clean shutdown on SIGTERM.
	if err := c.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, c.Logs())
	}
}

// checkManifest verifies GET /api/v2/manifest against the uploaded bytes and
// the root certificate.
func checkManifest(t *testing.T, c *coordinator, hc *http.Client, root *x509.Certificate, raw []byte) {
	t.Helper()
	r := do(t, hc, http.MethodGet, c.url("/api/v2/manifest"), nil)
	expect(t, r, http.StatusOK, "success")
	var m manifestData
	decode(t, r, &m)
	if !bytes.Equal(m.Manifest, raw) {
		t.Fatal("manifest bytes differ from the upload")
	}
	sum := sha256.Sum256(raw)
	if m.Fingerprint != hex.EncodeToString(sum[:]) {
		t.Fatalf("fingerprint = %s, want %x", m.Fingerprint, sum)
	}
	if !ecdsa.VerifyASN1(root.PublicKey.(*ecdsa.PublicKey), sum[:], m.Signature) {
		t.Fatal("manifest signature does not verify with the root certificate")
	}
}

func TestQuoteAndNonce(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	inter, root := getChain(t, c, hc)
	if root.Subject.CommonName != "MarbleRun Coordinator" || inter.Subject.CommonName != "MarbleRun Coordinator - Intermediate CA" {
		t.Errorf("subjects: %q, %q", root.Subject.CommonName, inter.Subject.CommonName)
	}
	// The TLS server certificate is the root of the chain.
	resp, err := hc.Get(c.url("/api/v2/status"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !resp.TLS.PeerCertificates[0].Equal(root) {
		t.Fatal("TLS server certificate is not the root from /api/v2/quote")
	}
	if resp.TLS.Version < 0x0303 {
		t.Fatalf("TLS version %x", resp.TLS.Version)
	}
	// Pinning the root works for the SANs (localhost, loopback).
	pinned := c.client(root, nil)
	expectState(t, c, pinned, 2, msgReady)

	nonce := base64.URLEncoding.EncodeToString([]byte("a fresh nonce!?"))
	for _, n := range []string{nonce, strings.TrimRight(nonce, "="), base64.URLEncoding.EncodeToString([]byte{0xfb, 0xff})} {
		r := do(t, pinned, http.MethodGet, c.url("/api/v2/quote?nonce="+n), nil)
		expect(t, r, http.StatusOK, "success")
		var q quoteData
		decode(t, r, &q)
		if q.Quote != nil {
			t.Fatal("simulation must return quote null")
		}
		if certs := parseChain(t, q.Cert); len(certs) != 2 || !certs[1].Equal(root) {
			t.Fatal("nonce request returned another chain")
		}
	}
	for _, bad := range []string{"not*base64", "a", base64.URLEncoding.EncodeToString(make([]byte, 2048))} {
		r := do(t, pinned, http.MethodGet, c.url("/api/v2/quote?nonce="+bad), nil)
		expect(t, r, http.StatusBadRequest, "fail")
		if !strings.Contains(r.Message, "bad nonce format") {
			t.Errorf("nonce %q: message %q", bad, r.Message)
		}
	}
}

func TestRoutingAndLimits(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", "QUARRY_MAX_MANIFEST_SIZE=4096")
	hc := c.client(nil, nil)
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/api/v2/nope", http.StatusNotFound, ""},
		{http.MethodGet, "/api/v2/status/", http.StatusNotFound, ""},
		{http.MethodPost, "/api/v2/status", http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodDelete, "/api/v2/manifest", http.StatusMethodNotAllowed, "GET, HEAD, POST"},
		{http.MethodPut, "/api/v2/quote", http.StatusMethodNotAllowed, "GET, HEAD"},
	} {
		r := do(t, hc, tc.method, c.url(tc.path), nil)
		expect(t, r, tc.status, "fail")
		if tc.allow != "" && !strings.Contains(r.Message, tc.allow) {
			t.Errorf("%s %s: message %q does not list %s", tc.method, tc.path, r.Message, tc.allow)
		}
	}
	// Unknown paths outside /api/v2 answer in the v1 envelope: never fail.
	r := do(t, hc, http.MethodGet, c.url("/nope"), nil)
	expect(t, r, http.StatusNotFound, "error")
	if !bytes.Contains(r.Raw, []byte(`"Status":"error"`)) {
		t.Errorf("v1 envelope expected: %s", r.Raw)
	}
	// Bodies: too large → 413; malformed → 400; the state stays 2.
	big := map[string][]byte{"manifest": bytes.Repeat([]byte("x"), 8192)}
	expect(t, do(t, hc, http.MethodPost, c.url("/api/v2/manifest"), big), http.StatusRequestEntityTooLarge, "fail")
	for _, body := range []string{"", "{", "[]", `{"manifest": 5}`, `{"manifest": "!!"}`, `{"manifest": ""}`, `{}`, `{"manifest": "e30="} trailing`} {
		r := do(t, hc, http.MethodPost, c.url("/api/v2/manifest"), body)
		expect(t, r, http.StatusBadRequest, "fail")
	}
	expectState(t, c, hc, 2, msgReady)
	if strings.Contains(c.Logs(), "panic") {
		t.Fatalf("log mentions a panic:\n%s", c.Logs())
	}
}

func TestValidationRulesRejected(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	keys := recoveryKeys(t, 2)
	k1, k2 := publicKeyPEM(t, keys[0]), publicKeyPEM(t, keys[1])
	for _, tc := range []struct {
		name    string
		mutate  func(f *fixture)
		section string
		want    string
	}{
		{"1 no packages", func(f *fixture) { f.set("Packages", deleted) }, "Packages", "no allowed packages defined"},
		{"2 no marbles", func(f *fixture) { f.set("Marbles", map[string]any{}) }, "Marbles", "no allowed marbles defined"},
		{"3 unknown marble package", func(f *fixture) { f.set("Marbles.frontend.Package", "nope") }, "Marbles", "manifest does not contain marble package nope"},
		{"4 UniqueID and SignerID", func(f *fixture) { f.set("Packages.backend.UniqueID", hexB) }, "Packages", "manifest specifies both UniqueID *and* SignerID/ProductID/SecurityVersion in package backend"},
		{"5 missing SignerID", func(f *fixture) { f.set("Packages.backend.SignerID", deleted) }, "Packages", "manifest misses value for SignerID in package backend"},
		{"5 missing ProductID", func(f *fixture) { f.set("Packages.backend.ProductID", deleted) }, "Packages", "manifest misses value for ProductID in package backend"},
		{"TDX production package pins only MRTD", func(f *fixture) {
			f.set("Packages.vm", map[string]any{"MRTD": strings.Repeat("ab", 48)})
		}, "Packages", "manifest misses value for RTMR1 in TDX package vm: a TDX package that is not Debug must set MRTD (firmware), RTMR1 (kernel), RTMR2"},
		{"TDX production package without TDAttributes", func(f *fixture) {
			f.set("Packages.vm", map[string]any{"MRTD": strings.Repeat("ab", 48), "RTMR1": strings.Repeat("cd", 48), "RTMR2": strings.Repeat("ef", 48)})
		}, "Packages", "manifest misses value for TDAttributes in TDX package vm"},
		{"6 unknown TLS tag", func(f *fixture) { f.set("Marbles.frontend.TLS", []string{"nope"}) }, "Marbles", "manifest misses TLS entry for nope"},
		{"7 incoming without port", func(f *fixture) {
			f.set("TLS.web.Incoming", []any{map[string]any{"Cert": "cert", "DisableClientAuth": true}})
		}, "TLS", "manifest misses Port in TLS.Incoming.web"},
		{"8 incoming undefined cert", func(f *fixture) {
			f.set("TLS.web.Incoming", []any{map[string]any{"Port": "1", "Cert": "nope", "DisableClientAuth": true}})
		}, "TLS", "TLS.Incoming.web references undefined secret nope"},
		{"9 cert without DisableClientAuth", func(f *fixture) { f.set("TLS.web.Incoming", []any{map[string]any{"Port": "1", "Cert": "cert"}}) }, "TLS", "TLS.Incoming.web defines Cert but does not disable client authentication"},
		{"10 DisableClientAuth without cert", func(f *fixture) {
			f.set("TLS.web.Incoming", []any{map[string]any{"Port": "1", "DisableClientAuth": true}})
		}, "TLS", "TLS.Incoming.web disables client authentication"},
		{"11 outgoing without Addr", func(f *fixture) { f.set("TLS.web.Outgoing", []any{map[string]any{"Port": "1"}}) }, "TLS", "manifest misses Addr in TLS.Outgoing.web"},
		{"11 outgoing without Port", func(f *fixture) { f.set("TLS.web.Outgoing", []any{map[string]any{"Addr": "a"}}) }, "TLS", "manifest misses Port in TLS.Outgoing.web"},
		{"12 user without certificate", func(f *fixture) { f.set("Users.bob.Certificate", "") }, "Users", "manifest does not contain a certificate for user bob"},
		{"13 unknown role", func(f *fixture) { f.set("Users.bob.Roles", []string{"nope"}) }, "Users", "manifest specifies role nope for user bob, but role does not exist"},
		{"14 duplicate certificate", func(f *fixture) { f.set("Users.bob.Certificate", f.users["alice"].pem) }, "Users", "manifest contains the same certificate for users alice and bob"},
		{"15 unknown package in role", func(f *fixture) { f.set("Roles.updater.ResourceNames", []string{"nope"}) }, "Roles", "role updater: resource nope of type Packages is not defined in manifest"},
		{"15 bad package action", func(f *fixture) { f.set("Roles.updater.Actions", []string{"ReadSecret"}) }, "Roles", "unknown action: ReadSecret for type Packages in role: updater"},
		{"16 bad secret action", func(f *fixture) { f.set("Roles.reader.Actions", []string{"Fly"}) }, "Roles", "unknown action: Fly for type Secrets in role: reader"},
		{"16 unknown secret in role", func(f *fixture) { f.set("Roles.reader.ResourceNames", []string{"nope"}) }, "Roles", "role reader: resource nope of type Secrets is not defined in manifest"},
		{"17 write on generated secret", func(f *fixture) { f.set("Roles.writer.ResourceNames", []string{"symkey"}) }, "Roles", "manifest specifies write permission for role writer and secret symkey, but secret is not user-defined"},
		{"18 read per-marble secret", func(f *fixture) {
			f.set("Secrets.mine", map[string]any{"Type": "symmetric-key", "Size": 128})
			f.set("Roles.reader.ResourceNames", []string{"mine"})
		}, "Roles", "manifest specifies read permission for role reader and per-marble-unique secret mine"},
		{"19 names on Manifest role", func(f *fixture) { f.set("Roles.admin.ResourceNames", []string{"x"}) }, "Roles", "role admin: resource names are not allowed for type Manifest"},
		{"19 bad manifest action", func(f *fixture) { f.set("Roles.admin.Actions", []string{"ReadSecret"}) }, "Roles", "unknown action: ReadSecret for type Manifest in role: admin"},
		{"20 unknown resource type", func(f *fixture) { f.set("Roles.admin.ResourceType", "manifest") }, "Roles", "unrecognized resource type"},
		{"21 unknown secret type", func(f *fixture) { f.set("Secrets.symkey.Type", "nope") }, "Secrets", "unknown type: nope for secret: symkey"},
		{"22 NotAfter and ValidFor", func(f *fixture) { f.set("Secrets.cert.Cert.NotAfter", "2030-01-01T00:00:00Z") }, "Secrets", "ambiguous certificate validity duration for secret: cert, both NotAfter and ValidFor are specified"},
		{"23 threshold above updaters", func(f *fixture) { f.set("Config.UpdateThreshold", 3) }, "Config", "not enough users with manifest update permissions (2) to meet the threshold of 3"},
		{"24 bad seal mode", func(f *fixture) { f.set("Config.SealMode", "productkey") }, "Config", "unknown seal mode: productkey"},
		{"25 unknown feature gate", func(f *fixture) { f.set("Config.FeatureGates", []string{"Nope"}) }, "Config", "unknown feature gate: Nope"},
		{"26 recovery threshold above keys", func(f *fixture) {
			f.set("RecoveryKeys", map[string]any{"k1": k1, "k2": k2})
			f.set("Config.RecoveryThreshold", 3)
		}, "Config", "not enough recovery keys (2) defined to meet the recovery threshold of 3"},
		{"27 recovery threshold 1", func(f *fixture) {
			f.set("RecoveryKeys", map[string]any{"k1": k1, "k2": k2})
			f.set("Config.RecoveryThreshold", 1)
		}, "Config", "invalid recovery threshold: if set, threshold must be at least 2"},
		{"28 symmetric size", func(f *fixture) { f.set("Secrets.symkey.Size", 12) }, "Secrets", "invalid secret size"},
		{"28 ecdsa size", func(f *fixture) { f.set("Secrets.cert.Size", 123) }, "Secrets", "unsupported size 123"},
		{"28 ed25519 size", func(f *fixture) { f.set("Secrets.cert.Type", "cert-ed25519") }, "Secrets", "none is expected, got: 256"},
		{"28 plain not user-defined", func(f *fixture) { f.set("Secrets.p", map[string]any{"Type": "plain"}) }, "Secrets", "unsupported secret of type plain"},
		{"28 rsa too small", func(f *fixture) { f.set("Secrets.cert.Type", "cert-rsa"); f.set("Secrets.cert.Size", 512) }, "Secrets", "512"},
		{"29 recovery key not PEM", func(f *fixture) { f.set("RecoveryKeys", map[string]any{"k1": "garbage"}) }, "RecoveryKeys", "given PEM data is not a public key"},
		{"30 user certificate not X.509", func(f *fixture) {
			f.set("Users.bob.Certificate", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
		}, "Users", "received invalid certificate for user bob"},
		{"31 template error", func(f *fixture) { f.set("Marbles.frontend.Parameters.Files./x", "{{ .Nope.Secrets") }, "Marbles", "frontend"},
		{"31 unknown secret in template", func(f *fixture) { f.set("Marbles.frontend.Parameters.Env.X", "{{ pem .Secrets.nope.Cert }}") }, "Marbles", "secret does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.mutate(f)
			r := setManifest(t, c, hc, f.bytes(t))
			expect(t, r, http.StatusBadRequest, "fail")
			if !strings.Contains(r.Message, tc.want) {
				t.Errorf("message %q does not contain %q", r.Message, tc.want)
			}
			var where struct {
				Section string `json:"section"`
			}
			decode(t, r, &where)
			if where.Section != tc.section {
				t.Errorf("data.section = %q, want %q (data %s)", where.Section, tc.section, r.Data)
			}
			expectState(t, c, hc, 2, msgReady)
		})
	}
	// Not JSON at all.
	r := setManifest(t, c, hc, []byte("not json"))
	expect(t, r, http.StatusBadRequest, "fail")
	if !strings.Contains(r.Message, "unmarshaling manifest") {
		t.Errorf("message %q", r.Message)
	}
	if _, err := os.Stat(filepath.Join(c.sealDir, "sealed_data")); !os.IsNotExist(err) {
		t.Fatalf("a rejected manifest left sealed_data behind: %v", err)
	}
}

func TestSurvivesSIGKILLAfterSet(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	_, root := getChain(t, c, hc)
	raw := newFixture(t).bytes(t)
	expect(t, setManifest(t, c, hc, raw), http.StatusOK, "success")

	c.restart() // SIGKILL right after the 200, then start again
	_, root2 := getChain(t, c, hc)
	if !root2.Equal(root) {
		t.Fatal("root certificate changed across the restart")
	}
	pinned := c.client(root, nil)
	expectState(t, c, pinned, 3, msgRunning)
	checkManifest(t, c, pinned, root, raw)

	for _, name := range []string{"sealed_data", "sealed_key"} {
		fi, err := os.Stat(filepath.Join(c.sealDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
	data, _ := os.ReadFile(filepath.Join(c.sealDir, "sealed_data"))
	if bytes.Contains(data, raw[:40]) {
		t.Fatal("sealed_data contains the manifest in clear")
	}
}

func TestUnreadableStateEntersRecovery(t *testing.T) {
	t.Parallel()
	setUp := func(t *testing.T) (*coordinator, []byte) {
		c := startCoordinator(t, "")
		hc := c.client(nil, nil)
		raw := newFixture(t).bytes(t)
		expect(t, setManifest(t, c, hc, raw), http.StatusOK, "success")
		c.kill()
		return c, raw
	}
	t.Run("missing sealed_key", func(t *testing.T) {
		c, _ := setUp(t)
		dataBefore, _ := os.ReadFile(filepath.Join(c.sealDir, "sealed_data"))
		if err := os.Remove(filepath.Join(c.sealDir, "sealed_key")); err != nil {
			t.Fatal(err)
		}
		c.start()
		hc := c.client(nil, nil)
		expectState(t, c, hc, 1, msgRecovery)
		expect(t, do(t, hc, http.MethodGet, c.url("/api/v2/manifest"), nil), http.StatusConflict, "fail")
		getChain(t, c, hc)
		if !strings.Contains(c.Logs(), "sealed data key is missing") {
			t.Errorf("log does not say what happened:\n%s", c.Logs())
		}
		// The fixture has no RecoveryKeys: recovery is impossible, and says so.
		r := do(t, hc, http.MethodPost, c.url("/api/v2/recover"),
			map[string][]byte{"recoverySecret": make([]byte, 32), "recoverySecretSignature": []byte("sig")})
		expect(t, r, http.StatusConflict, "fail")
		if !strings.Contains(r.Message, "cannot be recovered") {
			t.Errorf("message %q", r.Message)
		}
		dataAfter, _ := os.ReadFile(filepath.Join(c.sealDir, "sealed_data"))
		if !bytes.Equal(dataBefore, dataAfter) {
			t.Fatal("sealed_data changed in recovery mode")
		}
	})
	for _, corrupt := range []struct {
		name string
		f    func([]byte) []byte
	}{
		{"flipped byte", func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }},
		{"truncated", func(b []byte) []byte { return b[:3] }},
		{"garbage", func([]byte) []byte { return []byte("this is not a sealed state") }},
	} {
		t.Run("corrupt sealed_data "+corrupt.name, func(t *testing.T) {
			c, raw := setUp(t)
			path := filepath.Join(c.sealDir, "sealed_data")
			data, _ := os.ReadFile(path)
			bad := corrupt.f(data)
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			key, _ := os.ReadFile(filepath.Join(c.sealDir, "sealed_key"))
			c.start()
			hc := c.client(nil, nil)
			expectState(t, c, hc, 1, msgRecovery)
			if !strings.Contains(c.Logs(), "entering recovery mode") {
				t.Errorf("no recovery log line:\n%s", c.Logs())
			}
			// A restart changes nothing on disk either.
			c.restart()
			expectState(t, c, c.client(nil, nil), 1, msgRecovery)
			after, _ := os.ReadFile(path)
			keyAfter, _ := os.ReadFile(filepath.Join(c.sealDir, "sealed_key"))
			if !bytes.Equal(after, bad) || !bytes.Equal(keyAfter, key) {
				t.Fatal("sealed files changed in recovery mode")
			}
			// A new manifest starts over; the old files are moved aside.
			expect(t, setManifest(t, c, hc, raw), http.StatusOK, "success")
			expectState(t, c, hc, 3, msgRunning)
			moved, _ := filepath.Glob(filepath.Join(c.sealDir, "sealed_data.*"))
			if len(moved) != 1 {
				t.Fatalf("moved-aside files: %v", moved)
			}
			if old, _ := os.ReadFile(moved[0]); !bytes.Equal(old, bad) {
				t.Fatal("moved-aside sealed_data is not the old file")
			}
		})
	}
}

func TestSecondCoordinatorOnSameSealDirRefused(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	cmd := exec.Command(coordinatorBin)
	cmd.Env = []string{"EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0", "EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0", "EDG_COORDINATOR_SEAL_DIR=" + c.sealDir}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("second coordinator: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "another") {
		t.Errorf("message does not say another process holds the directory: %s", out)
	}
}

func TestCommandLine(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(coordinatorBin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"EDG_COORDINATOR_CLIENT_ADDR", "EDG_COORDINATOR_SEAL_DIR", "-dns-names"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
	for _, env := range []string{"EDG_COORDINATOR_CLIENT_ADDR=nope", "EDG_COORDINATOR_DNS_NAMES=bad name", "EDG_DEBUG_LOGGING=maybe"} {
		cmd := exec.Command(coordinatorBin)
		cmd.Env = []string{env, "EDG_COORDINATOR_SEAL_DIR=" + t.TempDir()}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Fatalf("%s: exit %v, want 2\n%s", env, err, out)
		}
		if !strings.Contains(string(out), "invalid configuration") {
			t.Errorf("%s: output %s", env, out)
		}
	}
}

func TestStartupManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raw := newFixture(t).bytes(t)
	path := filepath.Join(dir, "manifest.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCoordinator(t, "", "EDG_STARTUP_MANIFEST="+path)
	hc := c.client(nil, nil)
	expectState(t, c, hc, 3, msgRunning)
	_, root := getChain(t, c, hc)
	checkManifest(t, c, c.client(root, nil), root, raw)
	// A restart with saved state uses the saved state (docs/design/decisions.md#d10) and says
	// whether the startup manifest matches it.
	c.restart()
	expectState(t, c, hc, 3, msgRunning)
	if !strings.Contains(c.Logs(), `"matchesSavedManifest":true`) {
		t.Errorf("restart log does not compare the startup manifest:\n%s", c.Logs())
	}
	// A different startup manifest does not replace the saved state.
	if err := os.WriteFile(path, newFixture(t).bytes(t), 0o600); err != nil {
		t.Fatal(err)
	}
	c.restart()
	checkManifest(t, c, c.client(root, nil), root, raw)
	if !strings.Contains(c.Logs(), `"matchesSavedManifest":false`) {
		t.Errorf("restart log does not report the mismatch:\n%s", c.Logs())
	}
	// An invalid startup manifest on a fresh start stops the Coordinator.
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"Packages":{}}`), 0o600)
	cmd := exec.Command(coordinatorBin)
	cmd.Env = []string{"EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0", "EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_SEAL_DIR=" + t.TempDir(), "EDG_STARTUP_MANIFEST=" + bad}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "no allowed packages defined") {
		t.Fatalf("invalid startup manifest: %v\n%s", err, out)
	}
}

// TestManifestSizeLimit: the limit is on the manifest, not on its base64
// form in the request.
func TestManifestSizeLimit(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", "QUARRY_MAX_MANIFEST_SIZE=20000")
	hc := c.client(nil, nil)
	f := newFixture(t)
	f.set("Packages.backend.Padding", strings.Repeat("x", 20000-len(f.bytes(t))-40))
	raw := f.bytes(t)
	if len(raw) > 20000 || len(raw) < 19900 {
		t.Fatalf("fixture size %d", len(raw))
	}
	expect(t, setManifest(t, c, hc, raw), http.StatusOK, "success")
	c2 := startCoordinator(t, "", "QUARRY_MAX_MANIFEST_SIZE=20000")
	f.set("Packages.backend.Padding", strings.Repeat("x", 20000))
	r := setManifest(t, c2, c2.client(nil, nil), f.bytes(t))
	expect(t, r, http.StatusRequestEntityTooLarge, "fail")
	expectState(t, c2, c2.client(nil, nil), 2, msgReady)
}
