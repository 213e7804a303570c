package cli

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
)

// hintLine returns the "hint: " line of a text-mode error output.
func hintLine(errOut string) string {
	for line := range strings.Lines(errOut) {
		if h, ok := strings.CutPrefix(line, "hint: "); ok {
			return strings.TrimSpace(h)
		}
	}
	return ""
}

// TestHintsLeadToEraConfig: a failed --root, and an answer without a quote
// (a simulation Coordinator, or a man in the middle that strips the quote),
// get hints that lead to --era-config, never to --insecure or to dropping
// the check.
func TestHintsLeadToEraConfig(t *testing.T) {
	for name, err := range map[string]error{
		"no quote":      fmt.Errorf("verifying the Coordinator: %w: %w", client.ErrVerification, client.ErrNoQuote),
		"root mismatch": fmt.Errorf("GET /api/v2/status: %w: %w", client.ErrVerification, client.ErrRootMismatch),
	} {
		h := hintFor(err)
		if !strings.Contains(h, "--era-config") {
			t.Errorf("%s: the hint %q does not lead to --era-config", name, h)
		}
		for _, bad := range []string{"--insecure", "without --root"} {
			if strings.Contains(h, bad) {
				t.Errorf("%s: the hint %q leads to %s", name, h, bad)
			}
		}
	}

	// The same through the command: the fake is a simulation Coordinator
	// (quote null) with a root other than the pinned one.
	f := newFakeCoordinator(t)
	other := newFakeCoordinator(t)
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile(filepath.Join(dir, "other.pem"), other.rootPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	f.mux.HandleFunc("GET /api/v2/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.StatusResponse{Code: 1, Status: 1, Message: "recovery mode"}, "")
	})
	for name, args := range map[string][]string{
		"pinned root not presented": {"status", "--root", "other.pem", "--coordinator", f.addr()},
		"no quote":                  {"status", "--coordinator", f.addr()},
	} {
		code, _, errOut := run(t, nil, args...)
		h := hintLine(errOut)
		if code != ExitVerification || !strings.Contains(h, "--era-config") || strings.Contains(h, "--insecure") {
			t.Errorf("%s: exit %d, hint %q; want exit 3 and a hint to --era-config\n%s", name, code, h, errOut)
		}
	}
}

// TestInsecureWarns: every command run with --insecure warns on standard
// error that the Coordinator is not verified; standard output is
// unchanged, and with -o json the warning is a JSON object. Without
// --insecure nothing is said.
func TestInsecureWarns(t *testing.T) {
	f := newFakeCoordinator(t)
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile(filepath.Join(dir, "root.pem"), f.rootPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	f.mux.HandleFunc("GET /api/v2/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.StatusResponse{Code: 2, Status: 2, Message: "ready"}, "")
	})
	f.mux.HandleFunc("GET /api/v2/manifest", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 409, "fail", nil, "no manifest has been set yet")
	})
	env := map[string]string{EnvCoordinator: f.addr()}
	for _, args := range [][]string{
		{"status"},
		{"certificate", "root"},
		{"manifest", "get"}, // fails: the warning comes all the same
		{"recover", "public-key"},
	} {
		_, out, errOut := run(t, env, append(args, "--insecure")...)
		first, _, _ := strings.Cut(errOut, "\n")
		if !strings.HasPrefix(first, "quarry: warning: --insecure: the Coordinator is not verified") ||
			!strings.Contains(first, "man in the middle") || !strings.Contains(first, "gets everything") {
			t.Errorf("%v --insecure: standard error starts %q, want the warning", args, first)
		}
		if strings.Contains(out, "warning") {
			t.Errorf("%v --insecure: the warning went to standard output: %q", args, out)
		}
	}
	code, out, errOut := run(t, env, "status", "--insecure")
	if code != ExitOK || out != "2: ready\n" {
		t.Fatalf("status --insecure: %d %q %q", code, out, errOut)
	}
	code, out, errOut = run(t, env, "status", "--insecure", "--format", "json")
	var w struct {
		Warning string `json:"warning"`
	}
	if code != ExitOK || json.Unmarshal([]byte(errOut), &w) != nil || !strings.Contains(w.Warning, "not verified") || !strings.Contains(out, `"code": 2`) {
		t.Fatalf("status --insecure -o json: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := run(t, env, "status", "--root", "root.pem"); code != ExitOK || errOut != "" {
		t.Fatalf("status --root: %d, standard error %q, want nothing", code, errOut)
	}
	// A refused combination is a usage error before any connection: no
	// warning about a connection that is not made.
	if code, _, errOut := run(t, env, "status", "--insecure", "--root", "root.pem"); code != ExitUsage || strings.Contains(errOut, "warning") {
		t.Fatalf("--insecure --root: %d %q", code, errOut)
	}
}

// TestRecoverInsecureNeedsConfirmation: the fake plays a man in the middle
// that answers like a simulation Coordinator in recovery mode (quote null,
// its own root) and serves its own ephemeral key. 'recover --insecure' (with
// or without --ephemeral) is refused before anything is sent, saying why;
// with --expose-recovery-secret it is sent, and the stranger decrypts the
// recovery secret, which is what the confirmation accepts.
func TestRecoverInsecureNeedsConfirmation(t *testing.T) {
	mitm := newFakeCoordinator(t)
	dir := t.TempDir()
	t.Chdir(dir)
	owner := rsaKey(t)
	ownerDER, err := x509.MarshalPKCS8PrivateKey(owner)
	if err != nil {
		t.Fatal(err)
	}
	plain := bytes.Repeat([]byte{0x5a}, 32)
	ct, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, &owner.PublicKey, plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	secrets, _ := json.Marshal(recoverySecretsFile{RecoverySecrets: map[string][]byte{"owner": ct}})
	for name, data := range map[string][]byte{
		"owner.key":     pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ownerDER}),
		"recovery.json": secrets,
		"root.pem":      mitm.rootPEM,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ephemeral, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ephDER, _ := x509.MarshalPKIXPublicKey(&ephemeral.PublicKey)
	var mu sync.Mutex
	var stolen [][]byte
	mitm.mux.HandleFunc("GET /api/v2/recover/public-key", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.RecoveryPublicKeyResponse{Algorithm: "RSA", EphemeralPublicKey: ephDER}, "")
	})
	mitm.mux.HandleFunc("POST /api/v2/recover", func(w http.ResponseWriter, r *http.Request) {
		var req v2.RecoverRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		secret := req.RecoverySecret
		if got, err := rsa.DecryptOAEP(sha256.New(), nil, ephemeral, secret, nil); err == nil {
			secret = got
		}
		mu.Lock()
		stolen = append(stolen, secret)
		mu.Unlock()
		reply(w, 200, "success", v2.RecoverResponse{Message: "Recovery successful."}, "")
	})
	env := map[string]string{EnvCoordinator: mitm.addr()}
	recoverArgs := []string{"recover", "recovery.json", "--recovery-key", "owner.key"}

	for _, extra := range [][]string{{"--insecure"}, {"--insecure", "--ephemeral"}, {"--ephemeral", "--insecure", "--format", "json"}} {
		code, out, errOut := run(t, env, append(recoverArgs, extra...)...)
		if code != ExitUsage || out != "" {
			t.Errorf("%v: exit %d %q, want the usage error 2", extra, code, out)
		}
		for _, want := range []string{"recovery secret", "not verified", "man in the middle", "ephemeral key", "data key", "--era-config", "--expose-recovery-secret"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%v: the error does not say %q: %s", extra, want, errOut)
			}
		}
	}
	if got := mitm.received(); len(got) != 0 {
		t.Fatalf("refused recoveries sent requests: %v", got)
	}
	// The confirmation without --insecure is a mistake too.
	if code, _, errOut := run(t, env, append(recoverArgs, "--root", "root.pem", "--expose-recovery-secret")...); code != ExitUsage || !strings.Contains(errOut, "only confirms --insecure") {
		t.Fatalf("--expose-recovery-secret without --insecure: %d %q", code, errOut)
	}

	// Confirmed: sent, with the --insecure warning; with --ephemeral the
	// stranger's own key decrypts it.
	for _, extra := range [][]string{{"--insecure", "--expose-recovery-secret"}, {"--insecure", "--expose-recovery-secret", "--ephemeral"}} {
		code, out, errOut := run(t, env, append(recoverArgs, extra...)...)
		if code != ExitOK || out != "Recovery successful.\n" || !strings.Contains(errOut, "warning: --insecure") {
			t.Fatalf("%v: %d %q %q", extra, code, out, errOut)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stolen) != 2 || !bytes.Equal(stolen[0], plain) || !bytes.Equal(stolen[1], plain) {
		t.Fatalf("the man in the middle got %x, want the plain secret twice", stolen)
	}
}
