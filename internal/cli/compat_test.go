package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

func TestLooksLikeAddress(t *testing.T) {
	for s, want := range map[string]bool{
		"localhost:4433":             true,
		"10.0.0.1:4433,10.0.0.2:443": true,
		"[::1]:4433":                 true,
		"coordinator.example:4433":   true,
		"admin.crt":                  false,
		"localhost":                  false,
		"host:port":                  false,
		"host:0":                     false,
		"host:70000":                 false,
		"a:1,admin.crt":              false,
		"":                           false,
		"secret-name":                false,
	} {
		if got := looksLikeAddress(s); got != want {
			t.Errorf("looksLikeAddress(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestQCNLPCCSURL reads the pccs_url of Intel's QCNL configuration in both
// of its forms.
func TestQCNLPCCSURL(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ content, want string }{
		"json": {`{
  "pccs_url": "https://pccs.example:8081/sgx/certification/v4/",
  "use_secure_cert": true
}`, "https://pccs.example:8081/sgx/certification/v4/"},
		"key=value": {"# comment\nPCCS_URL=https://localhost:8081/sgx/certification/v3/\nUSE_SECURE_CERT=FALSE\n", "https://localhost:8081/sgx/certification/v3/"},
		"none":      {`{"use_secure_cert": true}`, ""},
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := qcnlPCCSURL(p); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
	if got := qcnlPCCSURL(filepath.Join(dir, "missing")); got != "" {
		t.Errorf("missing file: %q", got)
	}
}

// TestEraConfigCollateralFromQCNL: --era-config without --collateral-file
// or --pccs-url takes the PCCS of Intel's QCNL configuration, as
// marblerun's verification does; without one it is a usage error naming
// the ways to give it.
func TestEraConfigCollateralFromQCNL(t *testing.T) {
	f := newFakeCoordinator(t) // simulation: no quote
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("era.json", []byte(`{"UniqueID":"`+strings.Repeat("ab", 32)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	old := qcnlConfPath
	t.Cleanup(func() { qcnlConfPath = old })

	qcnlConfPath = filepath.Join(dir, "absent.conf")
	code, _, errOut := run(t, nil, "status", "--era-config", "era.json", "--coordinator", f.addr())
	if code != ExitUsage || !strings.Contains(errOut, "--pccs-url") || !strings.Contains(errOut, EnvPCCSURL) || !strings.Contains(errOut, "absent.conf") {
		t.Fatalf("no collateral source: exit %d, want 2 naming the flags, variables and the QCNL file\n%s", code, errOut)
	}

	qcnlConfPath = filepath.Join(dir, "qcnl.conf")
	if err := os.WriteFile(qcnlConfPath, []byte(`{"pccs_url": "https://127.0.0.1:1/sgx/certification/v4/"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The verifier is built; the fake sends no quote, so verification
	// fails (exit 3) instead of the usage error.
	code, _, errOut = run(t, nil, "status", "--era-config", "era.json", "--coordinator", f.addr())
	if code != ExitVerification || !strings.Contains(errOut, "no quote") {
		t.Fatalf("with the QCNL file: exit %d, want 3 (no quote)\n%s", code, errOut)
	}
	// The same through the variables.
	qcnlConfPath = filepath.Join(dir, "absent.conf")
	code, _, errOut = run(t, map[string]string{EnvPCCSURL: "https://127.0.0.1:1/"}, "status", "--era-config", "era.json", "--coordinator", f.addr())
	if code != ExitVerification {
		t.Fatalf("with %s: exit %d, want 3\n%s", EnvPCCSURL, code, errOut)
	}
}

// TestAddressArgument: the address as the last argument replaces
// QUARRY_COORDINATOR, may not be given twice, and a command with too many
// arguments says what it takes.
func TestAddressArgument(t *testing.T) {
	f := newFakeCoordinator(t)
	f.mux.HandleFunc("GET /api/v2/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.StatusResponse{Code: 2, Status: 2, Message: "ready"}, "")
	})
	t.Chdir(t.TempDir())
	code, out, errOut := run(t, map[string]string{EnvCoordinator: "127.0.0.1:1"}, "status", f.addr(), "-i")
	if code != 0 || out != "2: ready\n" {
		t.Fatalf("the address as the argument: %d %q %q", code, out, errOut)
	}
	code, _, errOut = run(t, nil, "status", f.addr(), "--coordinator", f.addr(), "-i")
	if code != ExitUsage || !strings.Contains(errOut, "given twice") {
		t.Fatalf("twice: %d %q", code, errOut)
	}
	code, _, errOut = run(t, nil, "status", f.addr(), "extra", "-i")
	if code != ExitUsage || !strings.Contains(errOut, "takes 0 arguments, or 1 with the Coordinator's address last") {
		t.Fatalf("too many: %d %q", code, errOut)
	}
}

// TestSecretGetAddress: in 'secret get' a last argument of the form
// host:port is the address unless --coordinator is given; the other
// arguments are the names asked for.
func TestSecretGetAddress(t *testing.T) {
	f := newFakeCoordinator(t)
	var mu sync.Mutex
	var asked [][]string
	f.mux.HandleFunc("GET /api/v2/secrets", func(w http.ResponseWriter, r *http.Request) {
		names := r.URL.Query()["s"]
		mu.Lock()
		asked = append(asked, names)
		mu.Unlock()
		out := map[string]v2.Secret{}
		for _, n := range names {
			out[n] = v2.Secret{Type: "plain", UserDefined: true, Private: []byte("v"), Public: []byte("v")}
		}
		reply(w, 200, "success", v2.SecretsGetResponse{Secrets: out}, "")
	})
	dir := t.TempDir()
	t.Chdir(dir)
	certPEM, keyPEM, _ := selfSigned(t, "alice")
	if err := os.WriteFile("a.crt", certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("a.key", keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, nil, "secret", "get", "x", "y", f.addr(), "-i", "-c", "a.crt", "-k", "a.key")
	if code != 0 || out != "x:\n\tType:          plain\n\tData:          [118]\n\ny:\n\tType:          plain\n\tData:          [118]\n\n" {
		t.Fatalf("marblerun's form: %d %q %q", code, out, errOut)
	}
	// With --coordinator every argument is a name, even one like an address.
	code, _, errOut = run(t, nil, "secret", "get", "x", "h:1", "-i", "-c", "a.crt", "-k", "a.key", "--coordinator", f.addr())
	if code != 0 {
		t.Fatalf("quarry's form: %d %q", code, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || strings.Join(asked[0], ",") != "x,y" || strings.Join(asked[1], ",") != "x,h:1" {
		t.Fatalf("names asked for: %q", asked)
	}
}

// TestProgress: while the Coordinator generates secrets, a terminal on
// standard error sees a line with the time waited, cleared before the
// answer; standard output is unchanged, and without a terminal or with
// --format json nothing is shown.
func TestProgress(t *testing.T) {
	oldDelay, oldTick := progressDelay, progressTick
	progressDelay, progressTick = 20*time.Millisecond, 10*time.Millisecond
	t.Cleanup(func() { progressDelay, progressTick = oldDelay, oldTick })

	f := newFakeCoordinator(t)
	f.mux.HandleFunc("POST /api/v2/manifest", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond) // generating secrets
		reply(w, 200, "success", map[string]any{"RecoverySecrets": map[string][]byte{}}, "")
	})
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("m.json", []byte(`{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	runTerm := func(terminal bool, args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := Run(context.Background(), Params{Args: args, Stdout: &stdout, Stderr: &stderr, StderrTerminal: terminal})
		return code, stdout.String(), stderr.String()
	}
	code, out, errOut := runTerm(true, "manifest", "set", "m.json", "--insecure", "--coordinator", f.addr())
	if code != 0 || !strings.HasPrefix(out, "Manifest set (SHA-256 ") {
		t.Fatalf("set: %d %q %q", code, out, errOut)
	}
	if !strings.Contains(errOut, "\r\x1b[Kquarry: generating the manifest's secrets… ") || !strings.HasSuffix(errOut, "\r\x1b[K") {
		t.Fatalf("no progress line, or not cleared at the end, on the terminal: %q", errOut)
	}
	for _, tc := range []struct {
		terminal bool
		extra    []string
	}{{false, nil}, {true, []string{"--format", "json"}}} {
		f2 := newFakeInstance(t, f)
		f2.mux.HandleFunc("POST /api/v2/manifest", func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(100 * time.Millisecond)
			reply(w, 200, "success", map[string]any{"RecoverySecrets": map[string][]byte{}}, "")
		})
		_, _, errOut := runTerm(tc.terminal, append([]string{"manifest", "set", "m.json", "--insecure", "--coordinator", f2.addr()}, tc.extra...)...)
		if strings.Contains(errOut, "generating") {
			t.Errorf("terminal %v %v: progress shown: %q", tc.terminal, tc.extra, errOut)
		}
	}
}

// TestCertFlagNamesAnAddress: -c is the user's certificate (marblerun's
// meaning); an address given there is named in the error.
func TestCertFlagNamesAnAddress(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, args := range [][]string{
		{"secret", "get", "x", "-c", "127.0.0.1:4433", "-k", "k.pem", "--coordinator", "127.0.0.1:4433", "-i"},
		{"status", "--insecure", "-c", "127.0.0.1:4433"}, // quarry's former -c, without --key
	} {
		code, _, errOut := run(t, nil, args...)
		if code != ExitUsage || !strings.Contains(errOut, "-c is --cert") || !strings.Contains(errOut, `"127.0.0.1:4433" the Coordinator's address`) {
			t.Errorf("%q: exit %d: %q", args, code, errOut)
		}
	}
}

// TestRecoverSecretFiles: sign-secret and encrypt-secret decrypt the
// secret with -k and never overwrite a file; an encrypted secret without a
// key is refused, naming -k.
func TestRecoverSecretFiles(t *testing.T) {
	t.Chdir(t.TempDir())
	code, _, errOut := run(t, nil, "recover-with-signature", "sign-secret", "s.bin", "-o", "s.sig")
	if code != ExitUsage || !strings.Contains(errOut, "-k/--key are required") {
		t.Fatalf("no key: %d %q", code, errOut)
	}
	if err := os.WriteFile("enc.bin", bytes.Repeat([]byte{7}, 256), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("pub.pem", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = run(t, nil, "recover-with-signature", "encrypt-secret", "enc.bin", "--coordinator-pub-key", "pub.pem", "-o", "out")
	if code != ExitUsage || !strings.Contains(errOut, "--coordinator-pub-key") {
		t.Fatalf("bad public key: %d %q", code, errOut)
	}
}
