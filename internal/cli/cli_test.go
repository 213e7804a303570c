package cli

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/quarry-cc/quarry/api/jsend"
	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/testpki"
)

func TestExitCodes(t *testing.T) {
	apiErr := func(status int) error {
		return fmt.Errorf("doing it: %w", &client.Error{HTTPStatus: status, Status: "fail", Message: "m"})
	}
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"cobra's own error", errors.New(`unknown command "x" for "quarry"`), ExitUsage},
		{"usage", runError{usagef("bad")}, ExitUsage},
		{"usage unwrapped", usagef("bad"), ExitUsage},
		{"plain failure", runError{errors.New("disk full")}, ExitFailure},
		{"verification", runError{fmt.Errorf("x: %w", client.ErrVerification)}, ExitVerification},
		{"404", runError{apiErr(http.StatusNotFound)}, ExitNotFound},
		{"409", runError{apiErr(http.StatusConflict)}, ExitConflict},
		{"400", runError{apiErr(http.StatusBadRequest)}, ExitRejected},
		{"401", runError{apiErr(http.StatusUnauthorized)}, ExitRejected},
		{"403", runError{apiErr(http.StatusForbidden)}, ExitRejected},
		{"405", runError{apiErr(http.StatusMethodNotAllowed)}, ExitRejected},
		{"413", runError{apiErr(http.StatusRequestEntityTooLarge)}, ExitRejected},
		{"500", runError{apiErr(http.StatusInternalServerError)}, ExitFailure},
		{"502 not JSend", runError{&client.Error{HTTPStatus: 502}}, ExitFailure},
	} {
		if got := exitCode(tc.err); got != tc.want {
			t.Errorf("%s: exit code %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	err := fmt.Errorf("setting the manifest: %w", &client.Error{
		Method: "POST", Path: "/api/v2/manifest", HTTPStatus: 400, Status: "fail", Message: "no allowed packages defined",
	})
	want := "setting the manifest: no allowed packages defined (HTTP 400 Bad Request; POST /api/v2/manifest)"
	if got := describe(err); got != want {
		t.Fatalf("describe = %q, want %q", got, want)
	}
	if got := describe(errors.New("plain")); got != "plain" {
		t.Fatalf("describe(plain) = %q", got)
	}
}

func TestManifestJSON(t *testing.T) {
	// JSON is kept verbatim, whitespace and key order included.
	in := "{ \"Packages\" : {},\n  \"Marbles\": {} }\n"
	got, err := manifestJSON([]byte(in), "m")
	if err != nil || string(got) != in {
		t.Fatalf("JSON: %q, %v", got, err)
	}
	// YAML becomes compact JSON with sorted keys.
	got, err = manifestJSON([]byte("Packages:\n  b: {Debug: true}\n  a:\n    ProductID: 1\nMarbles: {}\n"), "m")
	if err != nil || string(got) != `{"Marbles":{},"Packages":{"a":{"ProductID":1},"b":{"Debug":true}}}` {
		t.Fatalf("YAML: %s, %v", got, err)
	}
	for name, bad := range map[string]string{
		"empty":          "  \n",
		"duplicate keys": "Packages: {}\nPackages: {}\n",
		"not a mapping":  "- a\n- b\n",
		"JSON array":     "[1,2]",
		"YAML scalar":    "hello",
		"broken":         "Packages: [\n",
	} {
		_, err := manifestJSON([]byte(bad), "m")
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%s: %v, want a usage error", name, err)
		}
	}
}

var testKey *rsa.PrivateKey

func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	if testKey == nil {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		testKey = k
	}
	return testKey
}

func TestRecoverySecret(t *testing.T) {
	key := rsaKey(t)
	other, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	plain := bytes.Repeat([]byte{7}, 32)
	enc := func(k *rsa.PrivateKey) []byte {
		ct, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, &k.PublicKey, plain, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ct
	}
	mine, theirs := enc(key), enc(other)
	js := func(v any) []byte { b, _ := json.Marshal(v); return b }
	for _, tc := range []struct {
		name, pick string
		in         []byte
		ok         bool
	}{
		{"set response file", "", js(map[string]any{"RecoverySecrets": map[string][]byte{"a": theirs, "b": mine}}), true},
		{"update response (lower case)", "", js(map[string]any{"recoverySecrets": map[string][]byte{"b": mine}}), true},
		{"bare map", "", js(map[string][]byte{"b": mine, "a": theirs}), true},
		{"named", "b", js(map[string]any{"RecoverySecrets": map[string][]byte{"a": theirs, "b": mine}}), true},
		{"named, not mine", "a", js(map[string]any{"RecoverySecrets": map[string][]byte{"a": theirs, "b": mine}}), false},
		{"unknown name", "c", js(map[string][]byte{"b": mine}), false},
		{"none decrypts", "", js(map[string][]byte{"a": theirs}), false},
		{"empty object", "", []byte(`{}`), false},
		{"raw ciphertext", "", mine, true},
		{"base64 ciphertext", "", []byte(base64.StdEncoding.EncodeToString(mine) + "\n"), true},
		{"already decrypted", "", plain, true},
		{"name without JSON", "b", mine, false},
		{"empty", "", nil, false},
		{"garbage", "", []byte("not a secret at all, neither JSON nor a ciphertext"), false},
	} {
		got, err := recoverySecret(tc.in, tc.pick, key)
		if tc.ok && (err != nil || !bytes.Equal(got, plain)) {
			t.Errorf("%s: %x, %v", tc.name, got, err)
		}
		if !tc.ok && err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestParseSecretPEM(t *testing.T) {
	certPEM, keyPEM, key := selfSigned(t, "svc")
	ecDER, _ := x509.MarshalECPrivateKey(key)
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER})
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(key)
	pubDER, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})

	us, err := parseSecretPEM(append(append([]byte{}, certPEM...), keyPEM...))
	if err != nil || us.Cert == nil || !bytes.Equal(us.Private, pkcs8) || us.Public != nil {
		t.Fatalf("cert + PKCS #8: %+v, %v", us, err)
	}
	// SEC 1 keys are converted to PKCS #8, which the Coordinator expects.
	us, err = parseSecretPEM(append(append(append([]byte{}, ecPEM...), certPEM...), pubPEM...))
	if err != nil || !bytes.Equal(us.Private, pkcs8) || !bytes.Equal(us.Public, pubDER) {
		t.Fatalf("EC key + cert + public: %+v, %v", us, err)
	}
	if us, err := parseSecretPEM(certPEM); err != nil || us.Private != nil {
		t.Fatalf("cert only: %v", err)
	}
	for name, bad := range map[string][]byte{
		"no certificate": keyPEM,
		"two certs":      append(append([]byte{}, certPEM...), certPEM...),
		"two keys":       append(append(append([]byte{}, certPEM...), keyPEM...), keyPEM...),
		"encrypted":      append(append([]byte{}, certPEM...), pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}})...),
		"bad cert":       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}),
		"not PEM":        []byte("hello"),
	} {
		if _, err := parseSecretPEM(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestParseSecretsJSON(t *testing.T) {
	m, err := parseSecretsJSON([]byte(`{"a": {"Key": "AQI="}, "b": {"cert": "AQ==", "private": "Ag==", "public": "Aw=="}}`))
	if err != nil || string(m["a"].Key) != "\x01\x02" || string(m["b"].Public) != "\x03" {
		t.Fatalf("%+v, %v", m, err)
	}
	for _, bad := range []string{`{"a": {"keys": "AQI="}}`, `{}`, `[]`, `{"a": {"key": "!!"}}`} {
		if _, err := parseSecretsJSON([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestSecretFiles(t *testing.T) {
	files := secretFiles("tls", v2.Secret{Type: "cert-ecdsa", Cert: []byte{1}, Private: []byte{2}, Public: []byte{3}})
	if len(files) != 3 || !strings.Contains(string(files["tls.crt"]), "CERTIFICATE") ||
		!strings.Contains(string(files["tls.key"]), "PRIVATE KEY") || !strings.Contains(string(files["tls.pub"]), "PUBLIC KEY") {
		t.Fatalf("cert files %v", files)
	}
	files = secretFiles("k", v2.Secret{Type: "symmetric-key", Private: []byte{9}, Public: []byte{9}})
	if len(files) != 1 || !bytes.Equal(files["k"], []byte{9}) {
		t.Fatalf("key files %v", files)
	}
	for _, bad := range []string{"", ".", "..", "a/b", `a\b`} {
		if checkSecretName(bad) == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
}

// fakeCoordinator serves a root as TLS certificate, its chain on /quote
// (simulation: no quote), and handlers set by the test.
type fakeCoordinator struct {
	srv      *httptest.Server
	cert     tls.Certificate // the root, served as TLS certificate
	rootPEM  []byte
	chain    string
	mux      *http.ServeMux
	mu       sync.Mutex
	requests []string
}

func newFakeCoordinator(t *testing.T) *fakeCoordinator {
	t.Helper()
	rootKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	interKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	root := caCert(t, "root", nil, nil, rootKey)
	inter := caCert(t, "intermediate", root, rootKey, interKey)
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})
	chain := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: inter.Raw})) + string(rootPEM)
	return startFakeCoordinator(t, tls.Certificate{Certificate: [][]byte{root.Raw}, PrivateKey: rootKey}, rootPEM, chain)
}

// newFakeInstance starts another instance of f's deployment: the same root
// and chain, its own handlers.
func newFakeInstance(t *testing.T, f *fakeCoordinator) *fakeCoordinator {
	t.Helper()
	return startFakeCoordinator(t, f.cert, f.rootPEM, f.chain)
}

func startFakeCoordinator(t *testing.T, cert tls.Certificate, rootPEM []byte, chain string) *fakeCoordinator {
	t.Helper()
	f := &fakeCoordinator{mux: http.NewServeMux(), cert: cert, rootPEM: rootPEM, chain: chain}
	f.mux.HandleFunc("GET /api/v2/quote", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.QuoteResponse{Cert: chain}, "")
	})
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		f.mux.ServeHTTP(w, r)
	}))
	f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert}
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeCoordinator) addr() string { return strings.TrimPrefix(f.srv.URL, "https://") }

func reply(w http.ResponseWriter, status int, js string, data any, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(jsend.Response[any]{Status: js, Data: data, Message: msg})
}

func caCert(t *testing.T, cn string, parent *x509.Certificate, parentKey, key *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	if parent == nil {
		return testpki.NewCA(t, cn, testpki.Key(key)).Cert
	}
	return (&testpki.Cert{Cert: parent, Key: parentKey}).Issue(t, cn, testpki.CA(), testpki.Key(key)).Cert
}

// selfSigned returns a client certificate and key as PEM.
func selfSigned(t *testing.T, cn string) (certPEM, keyPEM []byte, key *ecdsa.PrivateKey) {
	t.Helper()
	c := testpki.SelfSigned(t, cn, testpki.ClientAuth())
	return c.CertPEM(), c.KeyPEM(t), c.ECDSA(t)
}

// run runs quarry in-process and returns the exit code and output. Tests
// t.Chdir to their directory first.
func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), Params{
		Args: args, Stdout: &stdout, Stderr: &stderr,
		Getenv: func(k string) string { return env[k] },
	})
	return code, stdout.String(), stderr.String()
}

// TestUpdateCommandsAgainstFake checks the update commands' output and files
// against a fake that speaks the wire contract.
func TestUpdateCommandsAgainstFake(t *testing.T) {
	f := newFakeCoordinator(t)
	dir := t.TempDir()
	t.Chdir(dir)
	certPEM, keyPEM, _ := selfSigned(t, "alice")
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("alice.crt", certPEM)
	write("alice.key", keyPEM)
	write("root.pem", f.rootPEM)
	write("m.yaml", []byte("Packages:\n  backend:\n    SecurityVersion: 2\n"))
	env := map[string]string{EnvCoordinator: f.addr()}
	user := []string{"--root", "root.pem", "--cert", "alice.crt", "--key", "alice.key"}

	var got v2.UpdateRequest
	var mu sync.Mutex
	updateResp := v2.UpdateResponse{MissingAcknowledgments: 2, MissingUsers: []string{"bob", "carol"}}
	f.mux.HandleFunc("POST /api/v2/update", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		json.NewDecoder(r.Body).Decode(&got)
		if len(r.TLS.PeerCertificates) != 1 {
			reply(w, 401, "fail", nil, "unauthorized user")
			return
		}
		reply(w, 200, "success", updateResp, "")
	})
	code, out, errOut := run(t, env, append([]string{"manifest", "update", "apply", "m.yaml"}, user...)...)
	if code != 0 || out != "Update pending: 2 acknowledgements missing (users who may acknowledge: bob, carol).\n" {
		t.Fatalf("apply: %d %q %q", code, out, errOut)
	}
	mu.Lock()
	if string(got.Manifest) != `{"Packages":{"backend":{"SecurityVersion":2}}}` {
		t.Fatalf("uploaded %q", got.Manifest)
	}
	// An applied update with new recovery secrets and no file: standard
	// output holds only the secrets (as the file would), the status goes to
	// standard error.
	updateResp = v2.UpdateResponse{RecoverySecrets: map[string][]byte{"owner": {4}}}
	mu.Unlock()
	code, out, errOut = run(t, env, append([]string{"manifest", "update", "apply", "m.yaml"}, user...)...)
	var rsOut recoverySecretsFile
	if code != 0 || json.Unmarshal([]byte(out), &rsOut) != nil || string(rsOut.RecoverySecrets["owner"]) != "\x04" ||
		!strings.HasPrefix(errOut, "Update applied.\n") {
		t.Fatalf("apply with secrets: %d %q %q", code, out, errOut)
	}
	// Without a client certificate: a usage error before any request.
	if code, _, _ := run(t, env, "manifest", "update", "apply", "m.yaml", "--root", "root.pem"); code != ExitUsage {
		t.Fatalf("apply without certificate: %d", code)
	}

	f.mux.HandleFunc("POST /api/v2/update-manifest", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.UpdateAckResponse{Message: "All users have acknowledged the update manifest. Update successfully applied",
			RecoverySecrets: map[string][]byte{"owner": {1, 2, 3}}}, "")
	})
	code, out, errOut = run(t, env, append([]string{"manifest", "update", "acknowledge", "m.yaml", "--recovery-secrets-file", "rs.json"}, user...)...)
	if code != 0 || !strings.HasPrefix(out, "All users have acknowledged") || !strings.Contains(out, "Recovery secrets for owner written to rs.json.") {
		t.Fatalf("acknowledge: %d %q %q", code, out, errOut)
	}
	rs, err := os.ReadFile(filepath.Join(dir, "rs.json"))
	if err != nil || !strings.Contains(string(rs), `"owner": "AQID"`) {
		t.Fatalf("recovery secrets file %q, %v", rs, err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "rs.json")); st.Mode().Perm() != 0o600 {
		t.Fatalf("recovery secrets file mode %v", st.Mode())
	}

	f.mux.HandleFunc("GET /api/v2/update-manifest", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.PendingUpdateResponse{Manifest: []byte(`{"x":1}`), MissingUsers: []string{"bob"}, Message: "1 user still needs to acknowledge"}, "")
	})
	code, out, errOut = run(t, env, "manifest", "update", "get", "--root", "root.pem")
	if code != 0 || out != `{"x":1}` || errOut != "1 user still needs to acknowledge (missing: bob)\n" {
		t.Fatalf("get: %d %q %q", code, out, errOut)
	}

	f.mux.HandleFunc("POST /api/v2/update-cancel", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 404, "fail", nil, "no pending update")
	})
	code, _, errOut = run(t, env, append([]string{"manifest", "update", "cancel"}, user...)...)
	if code != ExitNotFound || errOut != "quarry: cancelling the update: no pending update (HTTP 404 Not Found; POST /api/v2/update-cancel)\n" {
		t.Fatalf("cancel: %d %q", code, errOut)
	}
	code, out, _ = run(t, env, append([]string{"manifest", "update", "cancel", "--format", "json"}, user...)...)
	if code != ExitNotFound || out != "" {
		t.Fatalf("cancel json: %d %q", code, out)
	}

	// The log in JSON embeds the entries as objects.
	f.mux.HandleFunc("GET /api/v2/update", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.UpdateLogResponse{UpdateLog: []string{`{"update":"Initial manifest set"}`, "not json"}}, "")
	})
	code, out, _ = run(t, env, "manifest", "log", "--root", "root.pem", "--format", "json")
	var logOut struct {
		UpdateLog []any `json:"updateLog"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &logOut) != nil || len(logOut.UpdateLog) != 2 {
		t.Fatalf("log json: %d %q", code, out)
	}
	if m, ok := logOut.UpdateLog[0].(map[string]any); !ok || m["update"] != "Initial manifest set" || logOut.UpdateLog[1] != "not json" {
		t.Fatalf("log entries %v", logOut.UpdateLog)
	}
}

func TestGlobalFlags(t *testing.T) {
	f := newFakeCoordinator(t)
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile(filepath.Join(dir, "root.pem"), f.rootPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	f.mux.HandleFunc("GET /api/v2/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.StatusResponse{Code: 2, Status: 2, Message: "Coordinator is ready to accept a manifest."}, "")
	})
	// QUARRY_COORDINATOR and --coordinator.
	code, out, errOut := run(t, map[string]string{EnvCoordinator: f.addr()}, "status", "--root", "root.pem")
	if code != 0 || out != "2: Coordinator is ready to accept a manifest.\n" {
		t.Fatalf("status: %d %q %q", code, out, errOut)
	}
	code, out, _ = run(t, nil, "status", "--root", "root.pem", "--coordinator", f.addr(), "--format", "json")
	if code != 0 || !strings.Contains(out, `"code": 2`) {
		t.Fatalf("status json: %d %q", code, out)
	}
	// With --root, the quote is not even fetched.
	f.mu.Lock()
	requests := slices.Clone(f.requests)
	f.mu.Unlock()
	if slices.Contains(requests, "GET /api/v2/quote") {
		t.Fatal("--root fetched the quote")
	}
	// --cert without --key.
	if code, _, _ := run(t, nil, "status", "--root", "root.pem", "--coordinator", f.addr(), "--cert", "root.pem"); code != ExitUsage {
		t.Fatalf("--cert alone: %d", code)
	}
	// Help and version work without a Coordinator.
	code, out, _ = run(t, nil, "--help")
	if code != 0 || !strings.Contains(out, "Exit codes:") {
		t.Fatalf("help: %d %q", code, out)
	}
	code, out, _ = run(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "quarry ") || !strings.Contains(out, "/api/v2") {
		t.Fatalf("version: %d %q", code, out)
	}
	code, out, _ = run(t, nil, "completion", "bash")
	if code != 0 || !strings.Contains(out, "bash completion") {
		t.Fatalf("completion: %d", code)
	}
	// A timeout is a failure (exit 1).
	f.mux.HandleFunc("GET /api/v2/manifest", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	code, _, errOut = run(t, nil, "manifest", "get", "--root", "root.pem", "--coordinator", f.addr(), "--timeout", "200ms")
	if code != ExitFailure || !strings.Contains(errOut, "deadline exceeded") {
		t.Fatalf("timeout: %d %q", code, errOut)
	}
}

// TestRecoverSecretsCommand: 'recover secrets' fetches the secrets with the
// user's certificate and writes them in the recovery-secrets file format
// that 'recover' reads; the Coordinator's refusals become exit codes.
func TestRecoverSecretsCommand(t *testing.T) {
	f := newFakeCoordinator(t)
	dir := t.TempDir()
	t.Chdir(dir)
	certPEM, keyPEM, _ := selfSigned(t, "alice")
	os.WriteFile(filepath.Join(dir, "alice.crt"), certPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "alice.key"), keyPEM, 0o600)
	env := map[string]string{EnvCoordinator: f.addr()}
	user := []string{"--insecure", "--cert", "alice.crt", "--key", "alice.key"}
	k := rsaKey(t)
	plain := bytes.Repeat([]byte{7}, 32)
	ct, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, &k.PublicKey, plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	status := http.StatusOK
	f.mux.HandleFunc("GET /api/v2/recover/secrets", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case len(r.TLS.PeerCertificates) != 1:
			reply(w, 401, "fail", nil, "unauthorized user: client certificate did not match any users")
		case status != http.StatusOK:
			reply(w, status, "fail", nil, "refused")
		default:
			reply(w, 200, "success", v2.RecoverySecretsResponse{RecoverySecrets: map[string][]byte{"owner": ct, "other": {1}}}, "")
		}
	})

	code, out, errOut := run(t, env, append([]string{"recover", "secrets", "-f", "rs.json"}, user...)...)
	if code != 0 || out != "Recovery secrets for other, owner written to rs.json.\n" {
		t.Fatalf("to a file: %d %q %q", code, out, errOut)
	}
	if st, err := os.Stat(filepath.Join(dir, "rs.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("file: %v %v", st, err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "rs.json"))
	got, err := recoverySecret(raw, "owner", k)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("the written file does not give the secret back: %q %v", got, err)
	}
	// Standard output holds the same JSON; -o json the object.
	code, out, _ = run(t, env, append([]string{"recover", "secrets"}, user...)...)
	if code != 0 || out != string(raw) {
		t.Fatalf("to standard output: %d %q", code, out)
	}
	code, out, _ = run(t, env, append([]string{"recover", "secrets", "--format", "json"}, user...)...)
	var js struct {
		RecoverySecrets map[string][]byte `json:"recoverySecrets"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &js) != nil || !bytes.Equal(js.RecoverySecrets["owner"], ct) {
		t.Fatalf("json: %d %q", code, out)
	}
	// Without a certificate: a usage error before any request.
	if code, _, _ := run(t, env, "recover", "secrets", "--insecure"); code != ExitUsage {
		t.Fatalf("without certificate: exit %d", code)
	}
	for st, want := range map[int]int{http.StatusForbidden: ExitRejected, http.StatusNotFound: ExitNotFound, http.StatusConflict: ExitConflict} {
		status = st
		if code, _, errOut := run(t, env, append([]string{"recover", "secrets"}, user...)...); code != want || !strings.Contains(errOut, "fetching the recovery secrets: refused") {
			t.Errorf("HTTP %d: exit %d %q, want %d", st, code, errOut, want)
		}
	}
}
