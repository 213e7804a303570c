package integration

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/marble"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// trustSetup is a simulation coordinator whose Marble "app" runs testapp
// with a relative and an absolute file, and whose user "admin" may read
// the shared certificate secret "tlscert" and update the package.
type trustSetup struct {
	*marbleSetup
	absFile string // the absolute file of the manifest
	rootPEM string // a PEM file of the Coordinator root
	rootSum string // the root's SHA-256 in hex
}

func newTrustSetup(t *testing.T) *trustSetup {
	t.Helper()
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	root := fetchRoot(t, c, hc)
	admin, adminPEM := newUserCert(t, "admin")
	absDir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	absFile := filepath.Join(absDir, "abs", "secret.hex")
	doc := map[string]any{
		"Packages": map[string]any{"pkg": map[string]any{"SignerID": hexA, "ProductID": 1, "SecurityVersion": 1}},
		"Marbles": map[string]any{"app": map[string]any{"Package": "pkg", "Parameters": map[string]any{
			"Files": map[string]any{"conf/mine.hex": "{{hex .Secrets.mine.Private}}", absFile: "{{hex .Secrets.mine.Private}}"},
			"Env":   map[string]any{"GREETING": "hello"},
			"Argv":  []string{"testapp", "-env", "GREETING,MARBLE_PREDEFINED_*", "-out", "report.json", "conf/mine.hex", absFile},
		}}},
		"Secrets": map[string]any{
			"mine":    map[string]any{"Type": "symmetric-key", "Size": 256},
			"tlscert": map[string]any{"Type": "cert-ecdsa", "Size": 256, "Shared": true},
		},
		"Users": map[string]any{"admin": map[string]any{"Certificate": adminPEM, "Roles": []string{"reader", "packages"}}},
		"Roles": map[string]any{
			"reader":   map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"tlscert"}, "Actions": []string{"ReadSecret"}},
			"packages": map[string]any{"ResourceType": "Packages", "ResourceNames": []string{"pkg"}, "Actions": []string{"UpdateSecurityVersion"}},
		},
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, setManifest(t, c, hc, raw), http.StatusOK, "success")
	rootPEM := filepath.Join(t.TempDir(), "coordinator-root.pem")
	if err := os.WriteFile(rootPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(root.Raw)
	return &trustSetup{marbleSetup: &marbleSetup{c: c, root: root, admin: admin}, absFile: absFile,
		rootPEM: rootPEM, rootSum: hex.EncodeToString(sum[:])}
}

// pins are the two ways to pin the Coordinator in quarry-premain.
func (s *trustSetup) pins() map[string]string {
	return map[string]string{
		"file":        "QUARRY_COORDINATOR_ROOT=" + s.rootPEM,
		"fingerprint": "QUARRY_COORDINATOR_ROOT_SHA256=" + s.rootSum,
	}
}

// mustRunPinned runs the Marble "app" pinned, which must succeed with its
// files written (the absolute one too) and nothing said on stderr, and
// returns its identity.
func (s *trustSetup) mustRunPinned(t *testing.T, pinEnv string) activated {
	t.Helper()
	r, res := marbleRun{typ: "app", env: []string{pinEnv}}.mustRun(t, s.c)
	if res.stderr != "" {
		t.Errorf("pinned run: stderr %q, want nothing", res.stderr)
	}
	for _, f := range []string{"conf/mine.hex", s.absFile} {
		if got := r.Files[f]; got.Error != "" || len(got.Data) != 64 || got.Mode != "0600" {
			t.Errorf("file %s: %+v, want the 256-bit key in hex, mode 0600", f, got)
		}
	}
	return r.activated(t)
}

// TestPinnedMarblesRefuseImpostors runs the real coordinator, activates a
// pinned Marble through quarry-premain, and builds impostors of the Marble
// API from what it and a user hold: the Marble's own certificate and key
// (MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN and _PRIVATE_KEY) and the
// certificate secret "tlscert" read over GET /api/v2/secrets, each with
// the Coordinator's public chain. A pinned quarry-premain (pinned by PEM
// file and by fingerprint) and a pinned marble.Activate refuse both: no
// request reaches them, nothing is written, nothing exec'd. Unpinned,
// marble.Activate takes their word, and quarry-premain talks to them and
// is kept from writing an absolute path only by having no file roots.
// After a package update, which renews the Marble Root, the same pins
// accept the genuine Coordinator; a pin to the Marble Root, as the old
// Options.RootCAs did, is refused.
func TestPinnedMarblesRefuseImpostors(t *testing.T) {
	t.Parallel()
	s := newTrustSetup(t)

	a := s.mustRunPinned(t, s.pins()["fingerprint"])
	if !a.coordRoot.Equal(s.root) {
		t.Fatal("MARBLE_PREDEFINED_COORDINATOR_ROOT_CA is not the root of /api/v2/quote")
	}
	sec := getSecrets(t, s.c, s.adminClient(), "tlscert")["tlscert"]
	secKey, err := x509.ParsePKCS8PrivateKey(sec.Private)
	if err != nil {
		t.Fatal(err)
	}
	secCert, err := x509.ParseCertificate(sec.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if err := secCert.CheckSignatureFrom(a.chain[1]); err != nil {
		t.Fatalf("the certificate secret is not issued with the intermediate key: %v", err)
	}
	inter := a.chain[1]

	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	evil := &marblepb.Parameters{
		Files: map[string][]byte{victim: []byte("pwned"), "pwned.txt": []byte("pwned")},
		Env:   map[string][]byte{"PWNED": []byte("1")},
		Argv:  []string{"testapp", "-out", "report.json"},
	}
	for _, imp := range []struct {
		name string
		cert tls.Certificate
	}{
		{"the Marble's own credentials", tls.Certificate{Certificate: [][]byte{a.leaf.Raw, inter.Raw, s.root.Raw}, PrivateKey: a.key}},
		{"the certificate secret a user reads", tls.Certificate{Certificate: [][]byte{secCert.Raw, inter.Raw, s.root.Raw}, PrivateKey: secKey}},
	} {
		t.Run(imp.name, func(t *testing.T) {
			impostor := marbletest.NewWithCertificate(t, imp.cert, func(marbletest.Request) (*marblepb.Parameters, error) { return evil, nil })
			impostorC := &coordinator{meshAddr: impostor.Addr}

			for pinName, pinEnv := range s.pins() {
				res := marbleRun{typ: "app", env: []string{pinEnv}}.mustBeRefused(t, impostorC,
					"the server did not prove to be the pinned Coordinator", "not certified by the pinned Coordinator root")
				if _, err := os.Stat(filepath.Join(res.dir, "pwned.txt")); err == nil {
					t.Errorf("pinned by %s: the impostor's file was written", pinName)
				}
			}
			opts := marble.Options{MarbleType: "app", CoordinatorAddr: impostor.Addr, UUIDFile: filepath.Join(t.TempDir(), "uuid"),
				Attempts: 1, CoordinatorRoot: s.root}
			if _, err := marble.Activate(context.Background(), opts); !errors.Is(err, marble.ErrNotCoordinator) {
				t.Fatalf("pinned marble.Activate: err = %v, want ErrNotCoordinator", err)
			}
			opts.CoordinatorRoot, opts.CoordinatorRootSHA256 = nil, mustFingerprint(t, s.rootSum)
			if _, err := marble.Activate(context.Background(), opts); !errors.Is(err, marble.ErrNotCoordinator) {
				t.Fatalf("marble.Activate pinned by fingerprint: err = %v, want ErrNotCoordinator", err)
			}
			if n := len(impostor.Requests()); n != 0 {
				t.Fatalf("%d requests reached the impostor from pinned Marbles", n)
			}

			// Unpinned, the impostor is believed: the check above is the
			// pin's doing, not a broken impostor.
			opts.CoordinatorRootSHA256 = nil
			p, err := marble.Activate(context.Background(), opts)
			if err != nil || string(p.Env["PWNED"]) != "1" {
				t.Fatalf("unpinned marble.Activate: %v, %v; want the impostor's parameters", p, err)
			}
			res := marbleRun{typ: "app"}.mustBeRefused(t, impostorC, "the Coordinator is not pinned", "no file roots are declared", victim)
			if n := len(impostor.Requests()); n != 2 {
				t.Errorf("%d requests reached the impostor, want the 2 unpinned ones", n)
			}
			if _, err := os.Stat(filepath.Join(res.dir, "report.json")); err == nil {
				t.Error("the unpinned premain exec'd the impostor's program although a file was refused")
			}
		})
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Fatalf("the victim outside holds %q (%v)", b, err)
	}

	// A package update renews the Marble Root; the pins stay valid.
	expect(t, do(t, s.adminClient(), http.MethodPost, s.c.url("/api/v2/update"),
		map[string][]byte{"manifest": []byte(`{"Packages":{"pkg":{"SecurityVersion":2}}}`)}), http.StatusOK, "success")
	for pinName, pinEnv := range s.pins() {
		b := s.mustRunPinned(t, pinEnv)
		if b.marbleRoot.Equal(a.marbleRoot) || !b.coordRoot.Equal(s.root) {
			t.Fatalf("pinned by %s after the update: Marble Root renewed %v, Coordinator root kept %v; want both",
				pinName, !b.marbleRoot.Equal(a.marbleRoot), b.coordRoot.Equal(s.root))
		}
	}
	opts := marble.Options{MarbleType: "app", CoordinatorAddr: s.c.meshAddr, UUIDFile: filepath.Join(t.TempDir(), "uuid"),
		Attempts: 1, CoordinatorRoot: s.root}
	if _, err := marble.Activate(context.Background(), opts); err != nil {
		t.Fatalf("pinned marble.Activate after the update: %v", err)
	}

	// The Marble Root is no pin, neither as RootCAs nor as the root.
	pool := x509.NewCertPool()
	pool.AddCert(a.marbleRoot)
	//lint:ignore SA1019 the deprecated field is set on purpose: Activate must refuse it
	opts.CoordinatorRoot, opts.RootCAs = nil, pool
	if _, err := marble.Activate(context.Background(), opts); !errors.Is(err, marble.ErrMarbleRootPin) {
		t.Fatalf("RootCAs: err = %v, want ErrMarbleRootPin", err)
	}
	//lint:ignore SA1019 cleared again, with the Marble Root as the pin
	opts.CoordinatorRoot, opts.RootCAs = a.marbleRoot, nil
	if _, err := marble.Activate(context.Background(), opts); !errors.Is(err, marble.ErrMarbleRootPin) {
		t.Fatalf("CoordinatorRoot = the Marble Root: err = %v, want ErrMarbleRootPin", err)
	}
}

func mustFingerprint(t *testing.T, s string) []byte {
	t.Helper()
	b, err := marble.ParseFingerprint(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPremainFilesAgainstTheCoordinator: with the real coordinator, the
// manifest's absolute file is written by a pinned premain, refused by an
// unpinned one without file roots (exit 1, naming the file, nothing
// exec'd), and written by an unpinned one whose operator declares its
// directory in QUARRY_FILE_ROOTS; a symbolic link planted where the file
// goes is refused even for the pinned premain, and its target is left
// alone.
func TestPremainFilesAgainstTheCoordinator(t *testing.T) {
	t.Parallel()
	s := newTrustSetup(t)
	s.mustRunPinned(t, s.pins()["file"])

	res := marbleRun{typ: "app"}.mustBeRefused(t, s.c, "no file roots are declared", s.absFile)
	if _, err := os.Stat(filepath.Join(res.dir, "conf")); err == nil {
		t.Error("a relative file was written although the absolute one was refused")
	}

	marbleRun{typ: "app", env: []string{"QUARRY_FILE_ROOTS=" + filepath.Dir(s.absFile)}}.mustRun(t, s.c)

	outside := t.TempDir()
	target := filepath.Join(outside, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.absFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, s.absFile); err != nil {
		t.Fatal(err)
	}
	marbleRun{typ: "app", env: []string{s.pins()["fingerprint"]}}.mustBeRefused(t, s.c,
		"secret.hex is a symbolic link", "not written through symbolic links")
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep" {
		t.Errorf("the link's target holds %q (%v), want it unchanged", b, err)
	}
}
