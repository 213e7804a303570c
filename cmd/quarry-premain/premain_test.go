package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// execCall is what the premain would have exec'd.
type execCall struct {
	path string
	argv []string
	env  []string
}

// harness runs the premain in-process with a fake exec.
type harness struct {
	t      *testing.T
	dir    string // a temporary working directory
	self   string // the fake premain executable
	env    []string
	args   []string
	stderr bytes.Buffer
	calls  []execCall
	// execErr is returned by the fake exec.
	execErr error
}

func newHarness(t *testing.T, coordAddr string) *harness {
	// Its real path: a pinned Marble writes absolute paths beneath "/"
	// through no symbolic link.
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	h := &harness{t: t, dir: dir}
	h.self = h.executable("bin/quarry-premain")
	h.args = []string{h.self}
	h.env = []string{
		"HOME=/home/marble",
		"PATH=" + filepath.Join(dir, "bin"),
		"EDG_MARBLE_TYPE=backend",
		"EDG_MARBLE_COORDINATOR_ADDR=" + coordAddr,
		"EDG_MARBLE_UUID_FILE=" + filepath.Join(dir, "uuid"),
		"QUARRY_GRAMINE_ATTESTATION_DIR=" + filepath.Join(dir, "no-attestation"),
		"QUARRY_TSM_REPORT_DIR=" + filepath.Join(dir, "no-tsm"),
		"QUARRY_ACTIVATION_RETRY_DELAY=10ms",
	}
	return h
}

// executable creates an executable file at rel in the working directory.
func (h *harness) executable(rel string) string {
	p := filepath.Join(h.dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		h.t.Fatal(err)
	}
	return p
}

func (h *harness) setenv(kv ...string) { h.env = append(h.env, kv...) }

// pin pins the Coordinator whose root is root, by a PEM file.
func (h *harness) pin(root *x509.Certificate) {
	h.setenv("QUARRY_COORDINATOR_ROOT=" + writePEM(h.t, filepath.Join(h.t.TempDir(), "root.pem"), root))
}

// writePEM writes the certificates as PEM to path and returns path.
func writePEM(t *testing.T, path string, certs ...*x509.Certificate) string {
	t.Helper()
	var b []byte
	for _, c := range certs {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (h *harness) run() int {
	p := premain{
		environ: h.env,
		args:    h.args,
		stderr:  &h.stderr,
		self:    h.self,
		exec: func(path string, argv, env []string) error {
			h.calls = append(h.calls, execCall{path, argv, env})
			return h.execErr
		},
	}
	return p.run(context.Background())
}

// answer returns params to every request whose credentials check out.
func answer(t *testing.T, params *marblepb.Parameters) marbletest.Handler {
	return func(req marbletest.Request) (*marblepb.Parameters, error) {
		if _, err := req.Check(); err != nil {
			t.Errorf("request: %v", err)
			return nil, status.Error(codes.PermissionDenied, err.Error())
		}
		return params, nil
	}
}

func TestConfigErrors(t *testing.T) {
	coord := marbletest.New(t, marbletest.Refuse(codes.Internal, "must not be reached"))
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"no type", []string{"EDG_MARBLE_TYPE="}, "EDG_MARBLE_TYPE"},
		{"bad attestation", []string{"QUARRY_ATTESTATION=sgx"}, "QUARRY_ATTESTATION"},
		{"gramine without device", []string{"QUARRY_ATTESTATION=gramine"}, "QUARRY_ATTESTATION"},
		{"gramine and OE_SIMULATION", []string{"QUARRY_ATTESTATION=gramine", "OE_SIMULATION=1"}, "OE_SIMULATION=1"},
		{"bad OE_SIMULATION", []string{"OE_SIMULATION=yes"}, "OE_SIMULATION"},
		{"bad attempts", []string{"QUARRY_ACTIVATION_ATTEMPTS=0"}, "QUARRY_ACTIVATION_ATTEMPTS"},
		{"bad attempts text", []string{"QUARRY_ACTIVATION_ATTEMPTS=many"}, "QUARRY_ACTIVATION_ATTEMPTS"},
		{"bad delay", []string{"QUARRY_ACTIVATION_RETRY_DELAY=5"}, "QUARRY_ACTIVATION_RETRY_DELAY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, coord.Addr)
			h.setenv(tc.env...)
			if code := h.run(); code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", code, h.stderr.String())
			}
			if !strings.Contains(h.stderr.String(), tc.want) {
				t.Errorf("stderr %q does not name %s", h.stderr.String(), tc.want)
			}
			if len(h.calls) != 0 {
				t.Error("exec'd despite a configuration error")
			}
		})
	}
	if n := len(coord.Requests()); n != 0 {
		t.Errorf("%d activations despite configuration errors", n)
	}
}

func TestActivateAndExec(t *testing.T) {
	var h *harness
	params := &marblepb.Parameters{
		Env:  map[string][]byte{"GREETING": []byte("hello"), "HOME": []byte("/data")},
		Argv: []string{"app", "--port", "8080"},
	}
	coord := marbletest.New(t, func(req marbletest.Request) (*marblepb.Parameters, error) {
		return answer(t, params)(req)
	})
	h = newHarness(t, coord.Addr)
	params.Files = map[string][]byte{
		filepath.Join(h.dir, "etc/app/config.json"): []byte(`{"a":1}`),
		"relative/secret": []byte("s3cret"),
	}
	app := h.executable("bin/app")
	h.setenv("EDG_MARBLE_DNS_NAMES=backend.example, 10.1.2.3")
	h.pin(coord.CA.Root)

	if code := h.run(); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr.String())
	}
	if h.stderr.Len() != 0 {
		t.Errorf("stderr %q, want nothing on success", h.stderr.String())
	}
	if len(h.calls) != 1 {
		t.Fatalf("%d execs, want 1", len(h.calls))
	}
	c := h.calls[0]
	if c.path != app || !slices.Equal(c.argv, params.Argv) {
		t.Errorf("exec(%q, %q), want exec(%q, %q)", c.path, c.argv, app, params.Argv)
	}
	for _, kv := range []string{"GREETING=hello", "HOME=/data", "EDG_MARBLE_TYPE=backend"} {
		if !slices.Contains(c.env, kv) {
			t.Errorf("environment lacks %s: %q", kv, c.env)
		}
	}
	if slices.Contains(c.env, "HOME=/home/marble") {
		t.Error("the manifest's HOME did not replace the premain's")
	}
	for path, want := range params.Files {
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s = %q (%v), want %q", path, got, err, want)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v (%v)", path, fi.Mode(), err)
		}
	}

	req := coord.Requests()[0]
	if req.MarbleType != "backend" || len(req.Quote) != 0 {
		t.Errorf("request type %q quote %x, want backend and no quote", req.MarbleType, req.Quote)
	}
	cert := req.Peer[0]
	if !slices.Equal(cert.DNSNames, []string{"backend.example"}) || len(cert.IPAddresses) != 3 || cert.IPAddresses[0].String() != "10.1.2.3" {
		t.Errorf("SANs %q %v", cert.DNSNames, cert.IPAddresses)
	}
	uuid, err := os.ReadFile(filepath.Join(h.dir, "uuid"))
	if err != nil || string(uuid) != req.UUID {
		t.Errorf("UUID file %q (%v), request %q", uuid, err, req.UUID)
	}
}

func TestProgramChoice(t *testing.T) {
	for _, tc := range []struct {
		name     string
		argv     []string // the manifest's
		args0    string   // the premain's argv[0]; "" for itself
		setup    []string // executables to create
		wantPath string   // relative to the working directory
		wantArgv []string
		wantErr  string
	}{
		{name: "no Argv", setup: []string{"marble"}, wantPath: "./marble", wantArgv: []string{"./marble"}},
		{name: "relative path", argv: []string{"./sub/app", "-x"}, setup: []string{"sub/app"}, wantPath: "./sub/app", wantArgv: []string{"./sub/app", "-x"}},
		{name: "PATH lookup", argv: []string{"app"}, setup: []string{"bin/app"}, wantPath: "bin/app", wantArgv: []string{"app"}},
		{name: "Gramine argv0", argv: []string{"server", "--flag"}, args0: "opt/server", setup: []string{"opt/server"},
			wantPath: "opt/server", wantArgv: []string{"server", "--flag"}},
		{name: "argv0 absent falls back", argv: []string{"app"}, args0: "quarry-premain", setup: []string{"bin/app"},
			wantPath: "bin/app", wantArgv: []string{"app"}},
		{name: "not found", argv: []string{"nothere"}, wantErr: "not in PATH"},
		{name: "not executable", argv: []string{"./README"}, wantErr: "not an executable"},
		{name: "itself", argv: []string{"quarry-premain"}, wantErr: "itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: tc.argv}))
			h := newHarness(t, coord.Addr)
			for _, s := range tc.setup {
				h.executable(s)
			}
			if err := os.WriteFile("README", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.args0 != "" {
				h.args = []string{tc.args0}
			}
			code := h.run()
			if tc.wantErr != "" {
				if code != 1 || !strings.Contains(h.stderr.String(), tc.wantErr) {
					t.Errorf("exit %d, stderr %q; want 1 and %q", code, h.stderr.String(), tc.wantErr)
				}
				if len(h.calls) != 0 {
					t.Errorf("exec'd %+v", h.calls)
				}
				return
			}
			if code != 0 || len(h.calls) != 1 {
				t.Fatalf("exit %d, %d execs: %s", code, len(h.calls), h.stderr.String())
			}
			want := tc.wantPath
			if !strings.HasPrefix(want, "./") {
				want = filepath.Join(h.dir, want)
			}
			got := h.calls[0].path
			if got != want && filepath.Join(h.dir, got) != want {
				t.Errorf("exec path %q, want %q", got, want)
			}
			if !slices.Equal(h.calls[0].argv, tc.wantArgv) {
				t.Errorf("argv %q, want %q", h.calls[0].argv, tc.wantArgv)
			}
		})
	}
}

func TestActivationFailures(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		const msg = "marble verification failed: unknown marble type requested"
		coord := marbletest.New(t, marbletest.Refuse(codes.PermissionDenied, msg))
		h := newHarness(t, coord.Addr)
		if code := h.run(); code != 1 || !strings.Contains(h.stderr.String(), msg) {
			t.Errorf("exit %d, stderr %q; want 1 with the Coordinator's message", code, h.stderr.String())
		}
		if len(coord.Requests()) != 1 || len(h.calls) != 0 {
			t.Errorf("%d requests, %d execs; want 1 and 0", len(coord.Requests()), len(h.calls))
		}
	})
	t.Run("not ready, attempts bounded", func(t *testing.T) {
		coord := marbletest.New(t, marbletest.Refuse(codes.FailedPrecondition, "cannot accept marbles in current state"))
		h := newHarness(t, coord.Addr)
		h.setenv("QUARRY_ACTIVATION_ATTEMPTS=2")
		if code := h.run(); code != 1 || !strings.Contains(h.stderr.String(), "cannot accept marbles") {
			t.Errorf("exit %d, stderr %q", code, h.stderr.String())
		}
		if n := len(coord.Requests()); n != 2 {
			t.Errorf("%d requests, want 2", n)
		}
	})
	t.Run("bad env from the Coordinator", func(t *testing.T) {
		coord := marbletest.New(t, answer(t, &marblepb.Parameters{Env: map[string][]byte{"BAD": []byte("a\x00b")}}))
		h := newHarness(t, coord.Addr)
		if code := h.run(); code != 1 || !strings.Contains(h.stderr.String(), "BAD") {
			t.Errorf("exit %d, stderr %q", code, h.stderr.String())
		}
	})
	t.Run("exec fails", func(t *testing.T) {
		coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
		h := newHarness(t, coord.Addr)
		h.executable("bin/app")
		h.execErr = errors.New("exec format error")
		if code := h.run(); code != 1 || !strings.Contains(h.stderr.String(), "exec format error") {
			t.Errorf("exit %d, stderr %q", code, h.stderr.String())
		}
	})
}

// TestGramineQuote runs the premain against a fake Gramine attestation
// device: the quote sent is a DCAP quote, OE-wrapped, over SHA-256 of the
// TLS client certificate.
func TestGramineQuote(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte {
		return pl.Quote(t, dcaptest.QuoteOptions{Enclave: dcaptest.Enclave{ReportData: rd}})
	})
	for _, mode := range []string{"", "auto", "gramine"} {
		t.Run("mode "+mode, func(t *testing.T) {
			coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
			h := newHarness(t, coord.Addr)
			h.executable("bin/app")
			h.setenv("QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir, "QUARRY_ATTESTATION="+mode)
			if code := h.run(); code != 0 {
				t.Fatalf("exit %d: %s", code, h.stderr.String())
			}
			req := coord.Requests()[0]
			if !sgxquote.IsWrapped(req.Quote) {
				t.Fatal("quote is not OE-wrapped")
			}
			q, err := sgxquote.ParseAny(req.Quote)
			if err != nil {
				t.Fatal(err)
			}
			if q.Body.ReportData() != marbletest.ReportData(req.Peer[0].Raw) {
				t.Error("quote's report data is not SHA-256 of the client certificate")
			}
		})
	}
	t.Run("simulation and OE_SIMULATION ignore the device", func(t *testing.T) {
		for _, env := range [][]string{{"QUARRY_ATTESTATION=simulation"}, {"OE_SIMULATION=1"}} {
			coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
			h := newHarness(t, coord.Addr)
			h.executable("bin/app")
			h.setenv(append(env, "QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir)...)
			if code := h.run(); code != 0 {
				t.Fatalf("%v: exit %d: %s", env, code, h.stderr.String())
			}
			if q := coord.Requests()[0].Quote; len(q) != 0 {
				t.Errorf("%v: quote sent", env)
			}
		}
	})
	t.Run("auto without dcap", func(t *testing.T) {
		coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
		h := newHarness(t, coord.Addr)
		h.executable("bin/app")
		dir := filepath.Join(h.dir, "attestation")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "attestation_type"), []byte("none\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		h.setenv("QUARRY_GRAMINE_ATTESTATION_DIR=" + dir)
		if code := h.run(); code != 0 {
			t.Fatalf("exit %d: %s", code, h.stderr.String())
		}
		if !strings.Contains(h.stderr.String(), `"none"`) || len(coord.Requests()[0].Quote) != 0 {
			t.Errorf("stderr %q; want a notice and no quote", h.stderr.String())
		}
	})
	if errs := dev.Errors(); len(errs) > 0 {
		t.Errorf("device errors: %v", errs)
	}
}

// TestPinConfigErrors: a pin or file root that cannot be right ends the
// premain with exit status 2, naming the variable and what is wrong,
// before anything is sent.
func TestPinConfigErrors(t *testing.T) {
	coord := marbletest.New(t, marbletest.Refuse(codes.Internal, "must not be reached"))
	a := coord.CA
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "root.der")
	if err := os.WriteFile(notPEM, a.Root.Raw, 0o600); err != nil {
		t.Fatal(err)
	}
	serving, err := x509.ParseCertificate(a.MarbleTLSCertificate().Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  []string
		want []string
	}{
		{"root file missing", []string{"QUARRY_COORDINATOR_ROOT=" + filepath.Join(dir, "missing.pem")},
			[]string{"QUARRY_COORDINATOR_ROOT: ", "no such file"}},
		{"root file not PEM", []string{"QUARRY_COORDINATOR_ROOT=" + notPEM},
			[]string{"QUARRY_COORDINATOR_ROOT: ", "holds 0 PEM certificates"}},
		{"root file with the chain", []string{"QUARRY_COORDINATOR_ROOT=" + writePEM(t, filepath.Join(dir, "chain.pem"), a.Intermediate, a.Root)},
			[]string{"QUARRY_COORDINATOR_ROOT: ", "holds 2 PEM certificates", "alone"}},
		{"root file holding the Marble Root", []string{"QUARRY_COORDINATOR_ROOT=" + writePEM(t, filepath.Join(dir, "marbleroot.pem"), a.MarbleRoot)},
			[]string{"QUARRY_COORDINATOR_ROOT: ", "Marble Root", "MARBLE_PREDEFINED_COORDINATOR_ROOT_CA"}},
		{"root file holding the Marble API's serving certificate", []string{"QUARRY_COORDINATOR_ROOT=" + writePEM(t, filepath.Join(dir, "serving.pem"), serving)},
			[]string{"QUARRY_COORDINATOR_ROOT: ", "not a self-signed CA certificate", "pin the Coordinator root"}},
		{"both pins", []string{"QUARRY_COORDINATOR_ROOT=" + writePEM(t, filepath.Join(dir, "root.pem"), a.Root),
			"QUARRY_COORDINATOR_ROOT_SHA256=" + strings.Repeat("ab", 32)},
			[]string{"QUARRY_COORDINATOR_ROOT: ", "set one"}},
		{"bad fingerprint", []string{"QUARRY_COORDINATOR_ROOT_SHA256=" + strings.Repeat("ab", 31)},
			[]string{"QUARRY_COORDINATOR_ROOT_SHA256: ", "64 hex digits"}},
		{"relative file root", []string{"QUARRY_FILE_ROOTS=/srv:data"},
			[]string{"QUARRY_FILE_ROOTS: ", `"data" is not an absolute path`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, coord.Addr)
			h.setenv(tc.env...)
			if code := h.run(); code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", code, h.stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(h.stderr.String(), w) {
					t.Errorf("stderr %q does not say %q", h.stderr.String(), w)
				}
			}
			if len(h.calls) != 0 {
				t.Error("exec'd despite a configuration error")
			}
		})
	}
	if n := len(coord.Requests()); n != 0 {
		t.Errorf("%d activations despite configuration errors", n)
	}
}

// TestWarnsAboutIgnoredInput: the premain's own arguments after argv[0]
// and unknown EDG_MARBLE_* variables (a misspelt address would fall back
// to localhost:2001) are named on stderr; the known ones are not.
func TestWarnsAboutIgnoredInput(t *testing.T) {
	coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app", "--from-manifest"}}))
	h := newHarness(t, coord.Addr)
	h.executable("bin/app")
	h.args = []string{h.self, "--port", "8080"}
	h.setenv("EDG_MARBLE_COORDINATOR_ADDRESS=coordinator:2001", "EDG_MARBLE_DNS_NAMES=backend")
	if code := h.run(); code != 0 {
		t.Fatalf("exit %d: %s", code, h.stderr.String())
	}
	out := h.stderr.String()
	if !strings.Contains(out, `ignoring 2 command-line argument(s) ["--port" "8080"]`) || !strings.Contains(out, "manifest's Argv") {
		t.Errorf("stderr does not name the ignored arguments:\n%s", out)
	}
	if !strings.Contains(out, "ignoring EDG_MARBLE_COORDINATOR_ADDRESS: not one of EDG_MARBLE_TYPE, EDG_MARBLE_COORDINATOR_ADDR") {
		t.Errorf("stderr does not name the unknown variable:\n%s", out)
	}
	for _, known := range []string{"ignoring EDG_MARBLE_DNS_NAMES", "ignoring EDG_MARBLE_TYPE", "ignoring EDG_MARBLE_UUID_FILE"} {
		if strings.Contains(out, known) {
			t.Errorf("stderr warns about a known variable: %s", known)
		}
	}
	if len(h.calls) != 1 || !slices.Equal(h.calls[0].argv, []string{"app", "--from-manifest"}) {
		t.Errorf("exec'd %+v, want the manifest's Argv", h.calls)
	}
}
