package integration

// Taking over a MarbleRun Coordinator's seal directory (docs/migration.md):
// the real binary is started on copies of the MarbleRun state vectors in
// testdata/marblerun-state.

import (
	"bytes"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/marblerun/marbleruntest"
)

const marbleRunVectors = "../../testdata/marblerun-state"

var marbleRunVectorNames = marbleruntest.VectorNames

// mrVector is one MarbleRun state vector.
type mrVector struct {
	*marbleruntest.Vector
	name       string
	data, key  []byte
	admin      tls.Certificate
	recKeys    map[string]*rsa.PrivateKey
	recSecrets map[string][]byte
	expected   marbleruntest.Expected
}

func readMarbleRunVector(t *testing.T, name string) *mrVector {
	t.Helper()
	v := marbleruntest.ReadVector(t, marbleRunVectors, name)
	admin, err := tls.X509KeyPair(v.AdminCertPEM, v.AdminKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &mrVector{Vector: v, name: v.Name, data: v.Data, key: v.Key, admin: admin,
		recKeys: v.RecoveryKeys, recSecrets: v.RecoverySecrets, expected: v.Expected}
}

// recoverBody returns the plain secret of key k and its signature, as
// `marblerun recover` sends them.
func (v *mrVector) recoverBody(t *testing.T, k string) (secret, sig []byte) {
	t.Helper()
	return v.recSecrets[k], v.Sign(t, k, v.recSecrets[k])
}

func (v *mrVector) recoveryOrder() []string { return v.RecoveryOrder("shareholder2") }

// sealDir returns a new seal directory holding copies of the vector's files
// (sealed_key only if withKey).
func (v *mrVector) sealDir(t *testing.T, withKey bool) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sealed_data"), v.data, 0o600); err != nil {
		t.Fatal(err)
	}
	if withKey {
		if err := os.WriteFile(filepath.Join(dir, "sealed_key"), v.key, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func (v *mrVector) root(t *testing.T) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode([]byte(v.expected.Certificates.Root))
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkMigratedAPI compares the API's answers with the vector's.
func checkMigratedAPI(t *testing.T, c *coordinator, v *mrVector) {
	t.Helper()
	// The Client API's TLS certificate is the vector's root: pin it.
	hc := c.client(v.root(t), nil)
	r := do(t, hc, http.MethodGet, c.url("/api/v2/status"), nil)
	expect(t, r, http.StatusOK, "success")
	var st struct{ Code int }
	decode(t, r, &st)
	if st.Code != 3 {
		t.Fatalf("state %d, want 3", st.Code)
	}
	r = do(t, hc, http.MethodGet, c.url("/api/v2/quote"), nil)
	expect(t, r, http.StatusOK, "success")
	var q struct{ Cert string }
	decode(t, r, &q)
	if q.Cert != v.expected.QuoteResponse.Cert || q.Cert != v.expected.Certificates.Intermediate+v.expected.Certificates.Root {
		t.Errorf("quote chain differs:\n%s", q.Cert)
	}
	r = do(t, hc, http.MethodGet, c.url("/api/v2/manifest"), nil)
	expect(t, r, http.StatusOK, "success")
	var m struct {
		Manifest                   string `json:"manifest"`
		ManifestFingerprint        string `json:"manifestFingerprint"`
		ManifestSignatureRootECDSA string `json:"manifestSignatureRootECDSA"`
	}
	decode(t, r, &m)
	if m.Manifest != v.expected.Manifest.Manifest || m.ManifestFingerprint != v.expected.Manifest.Fingerprint || m.ManifestSignatureRootECDSA != v.expected.Manifest.Signature {
		t.Errorf("manifest differs: %s", m.ManifestFingerprint)
	}
	got := getSecrets(t, c, c.client(v.root(t), &v.admin), v.expected.SecretsQuery...)
	if len(got) != len(v.expected.SecretsResponse.Secrets) {
		t.Errorf("%d secrets, want %d", len(got), len(v.expected.SecretsResponse.Secrets))
	}
	for name, w := range v.expected.SecretsResponse.Secrets {
		g := got[name]
		if g.Type != w.Type || g.Size != w.Size || g.Shared != w.Shared || g.UserDefined != w.UserDefined || g.ValidFor != w.ValidFor ||
			!bytes.Equal(g.Cert, w.Cert) || !bytes.Equal(g.Private, w.Private) || !bytes.Equal(g.Public, w.Public) {
			t.Errorf("secret %s differs: %+v", name, g)
		}
	}
	if log := updateLog(t, c, hc); !slices.Equal(log, v.expected.UpdateLog.UpdateLog) {
		t.Errorf("update log %q\nwant %q", log, v.expected.UpdateLog.UpdateLog)
	}
	// The mesh port presents the Marble Root (MarbleRun's TLS server
	// certificate there) after Quarry's serving certificate, which the
	// vector's root certifies (docs/trust.md).
	conn, err := tls.Dial("tcp", c.meshAddr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mb, _ := pem.Decode([]byte(v.expected.Certificates.MarbleRoot))
	rb, _ := pem.Decode([]byte(v.expected.Certificates.Root))
	root, err := x509.ParseCertificate(rb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if peer := conn.ConnectionState().PeerCertificates; len(peer) != 4 || !bytes.Equal(peer[1].Raw, mb.Bytes) || !peer[0].IsCA || peer[0].CheckSignatureFrom(root) != nil {
		t.Error("the mesh port does not present a serving certificate of the vector's root followed by the vector's Marble Root")
	}
}

func updateLog(t *testing.T, c *coordinator, hc *http.Client) []string {
	t.Helper()
	r := do(t, hc, http.MethodGet, c.url("/api/v2/update"), nil)
	expect(t, r, http.StatusOK, "success")
	var d struct {
		UpdateLog []string `json:"updateLog"`
	}
	decode(t, r, &d)
	return d.UpdateLog
}

// checkKeptAside checks the moved-aside MarbleRun files are byte-identical.
func checkKeptAside(t *testing.T, dir string, v *mrVector, withKey bool) {
	t.Helper()
	for name, want := range map[string][]byte{"sealed_data": v.data, "sealed_key": v.key} {
		if name == "sealed_key" && !withKey {
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(dir, name+".marblerun-*"))
		if len(matches) != 1 {
			t.Errorf("%d copies of MarbleRun's %s, want 1: %v", len(matches), name, matches)
			continue
		}
		if b, err := os.ReadFile(matches[0]); err != nil || !bytes.Equal(b, want) {
			t.Errorf("%s is not byte-identical to MarbleRun's %s", matches[0], name)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sealed_data")); !bytes.HasPrefix(b, []byte("QRYSEAL")) {
		t.Error("sealed_data is not Quarry's after the migration")
	}
}

func TestMigrateMarbleRunDirect(t *testing.T) {
	t.Parallel()
	for _, name := range marbleRunVectorNames {
		t.Run(name, func(t *testing.T) {
			v := readMarbleRunVector(t, name)
			dir := v.sealDir(t, true)
			c := startCoordinator(t, dir)
			if !strings.Contains(c.Logs(), "MarbleRun state migrated") {
				t.Fatalf("no migration logged:\n%s", c.Logs())
			}
			checkMigratedAPI(t, c, v)
			checkKeptAside(t, dir, v, true)
			// A second start (after SIGKILL) opens the Quarry state.
			c.restart()
			if strings.Count(c.Logs(), "MarbleRun state found") != 1 {
				t.Error("the second start migrated again")
			}
			checkMigratedAPI(t, c, v)
			checkKeptAside(t, dir, v, true)
		})
	}
}

func TestMigrateMarbleRunThroughRecovery(t *testing.T) {
	t.Parallel()
	for _, name := range marbleRunVectorNames {
		t.Run(name, func(t *testing.T) {
			v := readMarbleRunVector(t, name)
			dir := v.sealDir(t, false)
			c := startCoordinator(t, dir)
			hc := c.client(nil, nil)
			r := do(t, hc, http.MethodGet, c.url("/api/v2/status"), nil)
			var st struct{ Code int }
			decode(t, r, &st)
			if st.Code != 1 {
				t.Fatalf("state %d, want 1 (recovery mode)", st.Code)
			}
			// A wrong secret is refused at once and changes nothing.
			k0 := v.recoveryOrder()[0]
			wrong := bytes.Clone(v.recSecrets[k0])
			wrong[3] ^= 0x10
			expect(t, postRecover(t, c, wrong, sign(t, v.recKeys[k0], wrong)), http.StatusBadRequest, "fail")
			for i, k := range v.recoveryOrder() {
				secret, sig := v.recoverBody(t, k)
				r := postRecover(t, c, secret, sig)
				expect(t, r, http.StatusOK, "success")
				var d struct{ Remaining int }
				decode(t, r, &d)
				if last := i == len(v.recoveryOrder())-1; last != (d.Remaining == 0) {
					t.Fatalf("upload %s: remaining %d", k, d.Remaining)
				}
			}
			checkMigratedAPI(t, c, v)
			checkKeptAside(t, dir, v, false)
			c.restart()
			checkMigratedAPI(t, c, v)
		})
	}
}

// TestMigrateMarbleRunSharesOfAnotherDeployment: multiparty's shares on
// threshold's state are refused; nothing changes on disk.
func TestMigrateMarbleRunSharesOfAnotherDeployment(t *testing.T) {
	t.Parallel()
	v, other := readMarbleRunVector(t, "threshold"), readMarbleRunVector(t, "multiparty")
	dir := v.sealDir(t, false)
	c := startCoordinator(t, dir)
	for _, k := range other.recoveryOrder() {
		secret, sig := other.recoverBody(t, k)
		r := postRecover(t, c, secret, sig)
		expect(t, r, http.StatusBadRequest, "fail")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sealed_data")); !bytes.Equal(b, v.data) {
		t.Error("sealed_data changed")
	}
}

// TestMigrateMarbleRunThenPackageUpdate: migrate, apply the vector's
// package update as admin, restart: everything is still there, with the
// update.
func TestMigrateMarbleRunThenPackageUpdate(t *testing.T) {
	t.Parallel()
	v := readMarbleRunVector(t, "single")
	dir := v.sealDir(t, true)
	c := startCoordinator(t, dir)
	admin := c.client(v.root(t), &v.admin)
	before := getSecrets(t, c, admin, v.expected.SecretsQuery...)
	update := []byte(`{"Packages":{"backend":{"SecurityVersion":3}}}`)
	expect(t, do(t, admin, http.MethodPost, c.url("/api/v2/update"), map[string][]byte{"manifest": update}), http.StatusOK, "success")
	c.restart()
	hc := c.client(v.root(t), nil)
	log := updateLog(t, c, hc)
	if len(log) != len(v.expected.UpdateLog.UpdateLog)+1 || !slices.Equal(log[:len(log)-1], v.expected.UpdateLog.UpdateLog) ||
		!strings.Contains(log[len(log)-1], `"new version":3`) {
		t.Errorf("update log after the update: %q", log)
	}
	after := getSecrets(t, c, admin, v.expected.SecretsQuery...)
	for name, b := range before {
		a := after[name]
		if strings.HasPrefix(b.Type, "cert-") && !b.UserDefined {
			if bytes.Equal(a.Cert, b.Cert) {
				t.Errorf("shared certificate %s was not re-issued by the package update", name)
			}
			continue
		}
		if !bytes.Equal(a.Private, b.Private) || !bytes.Equal(a.Cert, b.Cert) {
			t.Errorf("secret %s changed", name)
		}
	}
	r := do(t, hc, http.MethodGet, c.url("/api/v2/manifest"), nil)
	var m struct {
		ManifestFingerprint string `json:"manifestFingerprint"`
	}
	decode(t, r, &m)
	if m.ManifestFingerprint != v.expected.Manifest.Fingerprint {
		t.Error("the manifest changed")
	}
	r = do(t, hc, http.MethodGet, c.url("/api/v2/quote"), nil)
	var q struct{ Cert string }
	decode(t, r, &q)
	if !strings.HasSuffix(q.Cert, v.expected.Certificates.Root) {
		t.Error("the root changed")
	}
	// The recovery secret still recovers the updated state.
	c.kill()
	if err := os.Rename(filepath.Join(dir, "sealed_key"), filepath.Join(dir, "lost_key")); err != nil {
		t.Fatal(err)
	}
	c.start()
	secret, sig := v.recoverBody(t, "recoveryKey1")
	expect(t, postRecover(t, c, secret, sig), http.StatusOK, "success")
	if got := updateLog(t, c, c.client(v.root(t), nil)); !slices.Equal(got, log) {
		t.Error("the recovered state is not the updated one")
	}
}

func TestMigrateMarbleRunBothFormats(t *testing.T) {
	t.Parallel()
	v := readMarbleRunVector(t, "single")
	// Both formats: MarbleRun's sealed_data with a Quarry key file.
	dir := v.sealDir(t, false)
	quarryKey := append([]byte("QRYKEY\x00\x01\x01\x00\x01"), make([]byte, 36)...)
	quarryKey[len(quarryKey)-4] = 0 // an entry of length 0 is corrupt, still a Quarry file
	if err := os.WriteFile(filepath.Join(dir, "sealed_key"), quarryKey, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(coordinatorBin, "--seal-dir", dir, "--client-addr", "127.0.0.1:0", "--mesh-addr", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "both formats") {
		t.Fatalf("both formats: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sealed_data")); !bytes.Equal(b, v.data) {
		t.Error("sealed_data changed")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sealed_key")); !bytes.Equal(b, quarryKey) {
		t.Error("sealed_key changed")
	}
}

// TestCheckMigrationWritesNothing: the dry run reports the counts and
// leaves every byte and modification time of the directory as it was.
func TestCheckMigrationWritesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		withKey bool
		want    []string
	}{
		{"single", true, []string{"recovery needed: no", "secrets: 8", "users: 1", "update log entries: 5", "monotonic counters: 2"}},
		{"threshold", true, []string{"recovery needed: no", "secrets: 3", "users: 1", "update log entries: 2", "shamir (3 shares)"}},
		{"multiparty", false, []string{"recovery needed: yes", "xor or shamir, 2 shares"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := readMarbleRunVector(t, tc.name)
			dir := v.sealDir(t, tc.withKey)
			old := time.Now().Add(-time.Hour).Truncate(time.Second)
			for _, p := range []string{dir, filepath.Join(dir, "sealed_data"), filepath.Join(dir, "sealed_key")} {
				os.Chtimes(p, old, old)
			}
			before := snapshotDir(t, dir)
			cmd := exec.Command(coordinatorBin, "--check-migration")
			cmd.Env = []string{"EDG_COORDINATOR_SEAL_DIR=" + dir, "PATH=" + os.Getenv("PATH")}
			var stdout bytes.Buffer
			cmd.Stdout = &stdout
			if err := cmd.Run(); err != nil {
				t.Fatalf("check-migration: %v\n%s", err, stdout.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("report lacks %q:\n%s", w, stdout.String())
				}
			}
			if after := snapshotDir(t, dir); after != before {
				t.Errorf("the directory changed:\n%s\nwas\n%s", after, before)
			}
		})
	}
}

// snapshotDir describes every entry's name, mode, size, modification time
// and content hash, the directory's own modification time included.
func snapshotDir(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString(info.ModTime().String() + "\n")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, _ := e.Info()
		content, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		sum := sha256.Sum256(content)
		b.WriteString(e.Name() + " " + fi.Mode().String() + " " + fi.ModTime().String() + " " + base64.StdEncoding.EncodeToString(sum[:]) + "\n")
	}
	return b.String()
}

// pendingSealDir writes a crafted MarbleRun state with a pending
// multi-party update (admin initiated, alice has not acknowledged) and the
// vector's sealed_key into a new seal directory.
func pendingSealDir(t *testing.T, v *mrVector) (string, *marbleruntest.PendingState, tls.Certificate) {
	t.Helper()
	ps := v.WithPendingUpdate(t, false)
	dir := t.TempDir()
	for name, b := range map[string][]byte{"sealed_data": ps.Data, "sealed_key": v.key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	alice, err := tls.X509KeyPair(ps.AliceCertPEM, ps.AliceKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return dir, ps, alice
}

func currentManifest(t *testing.T, c *coordinator, hc *http.Client) []byte {
	t.Helper()
	r := do(t, hc, http.MethodGet, c.url("/api/v2/manifest"), nil)
	expect(t, r, http.StatusOK, "success")
	var m struct {
		Manifest []byte `json:"manifest"`
	}
	decode(t, r, &m)
	return m.Manifest
}

// TestMigrateMarbleRunPendingUpdate: the real binary migrates MarbleRun's
// pending multi-party update; GET /api/v2/update-manifest shows it waiting
// for alice (also after a SIGKILL), and alice's acknowledgement applies it.
func TestMigrateMarbleRunPendingUpdate(t *testing.T) {
	t.Parallel()
	v := readMarbleRunVector(t, "single")
	dir, ps, aliceCert := pendingSealDir(t, v)
	c := startCoordinator(t, dir)
	root := v.root(t)
	hc := c.client(root, nil)
	alice, admin := c.client(root, &aliceCert), c.client(root, &v.admin)
	for range 2 {
		r := do(t, hc, http.MethodGet, c.url("/api/v2/update-manifest"), nil)
		expect(t, r, http.StatusOK, "success")
		var d updateData
		decode(t, r, &d)
		if !bytes.Equal(d.Manifest, ps.Update) || !slices.Equal(d.MissingUsers, []string{"alice"}) || d.Message != "1 user still needs to acknowledge the update manifest" {
			t.Fatalf("pending update: %s", r.Data)
		}
		c.restart()
	}
	expect(t, do(t, admin, http.MethodPost, c.url("/api/v2/update"), map[string][]byte{"manifest": ps.Update}), http.StatusConflict, "fail")
	r := do(t, admin, http.MethodPost, c.url("/api/v2/update-manifest"), map[string][]byte{"manifest": ps.Update})
	expect(t, r, http.StatusOK, "success")
	var d updateData
	decode(t, r, &d)
	if d.MissingAcknowledgments != 1 || !strings.Contains(d.Message, "already acknowledged") {
		t.Fatalf("admin acknowledged in MarbleRun, again: %s", r.Data)
	}
	if !bytes.Equal(currentManifest(t, c, hc), ps.Manifest) {
		t.Fatal("the manifest changed before alice acknowledged")
	}
	r = do(t, alice, http.MethodPost, c.url("/api/v2/update-manifest"), map[string][]byte{"manifest": ps.Update})
	expect(t, r, http.StatusOK, "success")
	decode(t, r, &d)
	if d.MissingAcknowledgments != 0 || d.RecoverySecrets != nil {
		t.Fatalf("alice's acknowledgement: %s", r.Data)
	}
	expect(t, do(t, hc, http.MethodGet, c.url("/api/v2/update-manifest"), nil), http.StatusNotFound, "fail")
	c.restart()
	if !bytes.Equal(currentManifest(t, c, hc), ps.Update) {
		t.Fatal("the update is not applied")
	}
	if log := updateLog(t, c, hc); !strings.Contains(log[len(log)-1], "Complete Manifest updated") {
		t.Errorf("last log entry %q", log[len(log)-1])
	}
}

// TestMigrateMarbleRunPendingUpdateCancel: alice cancels the migrated
// pending update; the manifest stays MarbleRun's.
func TestMigrateMarbleRunPendingUpdateCancel(t *testing.T) {
	t.Parallel()
	v := readMarbleRunVector(t, "single")
	dir, ps, aliceCert := pendingSealDir(t, v)
	c := startCoordinator(t, dir)
	root := v.root(t)
	hc := c.client(root, nil)
	expect(t, do(t, c.client(root, &aliceCert), http.MethodPost, c.url("/api/v2/update-cancel"), nil), http.StatusOK, "success")
	c.restart()
	expect(t, do(t, hc, http.MethodGet, c.url("/api/v2/update-manifest"), nil), http.StatusNotFound, "fail")
	if !bytes.Equal(currentManifest(t, c, hc), ps.Manifest) {
		t.Fatal("the manifest changed")
	}
	if log := updateLog(t, c, hc); !strings.Contains(log[len(log)-1], "cancelled by user") || !strings.Contains(log[len(log)-1], `"alice"`) {
		t.Errorf("last log entry %q", log[len(log)-1])
	}
}

// TestMigrateMarbleRunLegacyKeyRefused: a 16-byte legacy data key stops the
// start and the dry run with a clear message (exit 1); nothing changes.
func TestMigrateMarbleRunLegacyKeyRefused(t *testing.T) {
	t.Parallel()
	v := readMarbleRunVector(t, "single")
	data, key := v.WithLegacyKey(t)
	dir := t.TempDir()
	for name, b := range map[string][]byte{"sealed_data": data, "sealed_key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshotDir(t, dir)
	for _, args := range [][]string{{"--check-migration"}, {"--client-addr", "127.0.0.1:0", "--mesh-addr", "127.0.0.1:0"}} {
		cmd := exec.Command(coordinatorBin, args...)
		cmd.Env = []string{"EDG_COORDINATOR_SEAL_DIR=" + dir, "PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "the data key has 16 bytes") || !strings.Contains(string(out), "RecoveryKeys") {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
		if args[0] == "--check-migration" {
			// The dry run writes nothing at all.
			if after := snapshotDir(t, dir); after != before {
				t.Errorf("the dry run changed the directory:\n%s\nwas\n%s", after, before)
			}
		}
	}
	// The start (which takes the directory's lock) leaves both files as
	// they were and makes no copy.
	for name, want := range map[string][]byte{"sealed_data": data, "sealed_key": key} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(b, want) {
			t.Errorf("%s changed: %v", name, err)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*.marblerun-*")); len(m) != 0 {
		t.Errorf("copies made although nothing was migrated: %v", m)
	}
}
