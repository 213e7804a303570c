package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
)

// marbleBins holds quarry-premain and testapp, built once (with -race when
// the tests run with it) into the directory of the coordinator binary,
// which TestMain removes.
var marbleBins struct {
	once    sync.Once
	premain string
	appDir  string // the directory holding testapp, put first in PATH
	err     error
	out     []byte
}

// marbleBinaries builds quarry-premain and its test application once and
// returns the premain's path and the directory of testapp.
func marbleBinaries(t *testing.T) (premain, appDir string) {
	t.Helper()
	marbleBins.once.Do(func() {
		dir := filepath.Join(filepath.Dir(coordinatorBin), "marble-bin")
		if err := os.Mkdir(dir, 0o700); err != nil {
			marbleBins.err = err
			return
		}
		// With the race detector when the tests run with it (the
		// configuration of their compiled packages), else -trimpath as
		// the release build of the coordinator.
		config := "-trimpath"
		if raceEnabled {
			config = "-race"
		}
		args := []string{"build", config, "-o", dir + string(filepath.Separator),
			"github.com/quarry-cc/quarry/cmd/quarry-premain",
			"github.com/quarry-cc/quarry/cmd/quarry-premain/internal/testapp"}
		marbleBins.out, marbleBins.err = exec.Command("go", args...).CombinedOutput()
		marbleBins.premain = filepath.Join(dir, "quarry-premain")
		marbleBins.appDir = dir
	})
	if marbleBins.err != nil {
		t.Fatalf("building quarry-premain and testapp: %v\n%s", marbleBins.err, marbleBins.out)
	}
	return marbleBins.premain, marbleBins.appDir
}

// marbleRun is one start of a Marble: quarry-premain activating at a
// Coordinator and execing testapp (the manifest's Argv names "testapp",
// found in PATH).
type marbleRun struct {
	typ string // EDG_MARBLE_TYPE
	// uuidFile is EDG_MARBLE_UUID_FILE; "" leaves the default, ./uuid in
	// the run's own working directory.
	uuidFile string
	// gramineDir, if set, makes the premain obtain Gramine DCAP quotes
	// from this (fake) attestation directory; otherwise it runs in
	// simulation and sends no quote.
	gramineDir string
	// env are further variables of the premain (a pin, file roots).
	env []string
}

// marbleResult is how a Marble run ended.
type marbleResult struct {
	code   int    // the exit status of the premain (or of testapp it became)
	stderr string // everything written to stderr
	dir    string // the run's working directory
}

// command prepares the premain for m against c (the Marble API address c
// has now). The run gets a new working directory of its own; stderr is
// collected in the returned buffer (read it after Wait).
func (m marbleRun) command(t *testing.T, c *coordinator) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	premain, appDir := marbleBinaries(t)
	// A bound on a hung run, not a timed assertion.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, premain)
	cmd.WaitDelay = 10 * time.Second
	cmd.Dir = t.TempDir()
	cmd.Env = []string{
		"PATH=" + appDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"EDG_MARBLE_TYPE=" + m.typ,
		"EDG_MARBLE_COORDINATOR_ADDR=" + c.meshAddr,
		// Refusals end at once anyway; a Coordinator that is down must not
		// be waited for.
		"QUARRY_ACTIVATION_ATTEMPTS=1",
	}
	if m.uuidFile != "" {
		cmd.Env = append(cmd.Env, "EDG_MARBLE_UUID_FILE="+m.uuidFile)
	}
	if m.gramineDir != "" {
		cmd.Env = append(cmd.Env, "QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+m.gramineDir)
	} else {
		cmd.Env = append(cmd.Env, "QUARRY_ATTESTATION=simulation")
	}
	cmd.Env = append(cmd.Env, m.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	return cmd, &stderr
}

// run runs the premain until it (or testapp) exits.
func (m marbleRun) run(t *testing.T, c *coordinator) marbleResult {
	t.Helper()
	cmd, stderr := m.command(t, c)
	err := cmd.Run()
	return marbleResult{code: exitCode(t, err), stderr: stderr.String(), dir: cmd.Dir}
}

// exitCode returns the exit status of a finished command.
func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("running quarry-premain: %v", err)
	return -1
}

// mustRun runs m, which must activate and run testapp successfully, and
// returns testapp's report (written to report.json in the run's directory).
func (m marbleRun) mustRun(t *testing.T, c *coordinator) (*testappReport, marbleResult) {
	t.Helper()
	res := m.run(t, c)
	if res.code != 0 {
		t.Fatalf("marble %q: exit status %d\n%s\ncoordinator log:\n%s", m.typ, res.code, res.stderr, c.Logs())
	}
	return readReport(t, filepath.Join(res.dir, "report.json")), res
}

// mustBeRefused runs m, whose activation must be refused: the premain exits
// with 1, naming want, and testapp never starts.
func (m marbleRun) mustBeRefused(t *testing.T, c *coordinator, want ...string) marbleResult {
	t.Helper()
	res := m.run(t, c)
	if res.code != 1 {
		t.Fatalf("marble %q: exit status %d, want 1 (refused)\n%s", m.typ, res.code, res.stderr)
	}
	for _, w := range want {
		if !strings.Contains(res.stderr, w) {
			t.Errorf("marble %q: the premain's message does not name %q:\n%s", m.typ, w, res.stderr)
		}
	}
	if !strings.HasPrefix(res.stderr, "quarry-premain: ") {
		t.Errorf("marble %q: stderr is not the premain's message: %q", m.typ, res.stderr)
	}
	if _, err := os.Stat(filepath.Join(res.dir, "report.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marble %q: refused, yet testapp ran (report.json: %v)", m.typ, err)
	}
	return res
}

// testappReport is the report testapp prints (its package comment).
type testappReport struct {
	Argv  []string           `json:"argv"`
	Cwd   string             `json:"cwd"`
	Env   map[string]*string `json:"env"`
	Files map[string]struct {
		Data  []byte `json:"data"`
		Mode  string `json:"mode"`
		Error string `json:"error"`
	} `json:"files"`
	Listen  string `json:"listen"`
	Connect *struct {
		Addr     string `json:"addr"`
		ServerCN string `json:"server_cn"`
		Reply    struct {
			Message  string `json:"message"`
			ServerCN string `json:"server_cn"`
			ClientCN string `json:"client_cn"`
		} `json:"reply"`
	} `json:"connect"`
}

// testappAccepted is a line of a testapp server for one connection.
type testappAccepted struct {
	Accepted *struct {
		Message        string `json:"message"`
		ClientCN       string `json:"client_cn"`
		ClientVerified bool   `json:"client_verified"`
	} `json:"accepted"`
}

func readReport(t *testing.T, path string) *testappReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("testapp's report: %v", err)
	}
	var r testappReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("testapp's report %q: %v", b, err)
	}
	return &r
}

// env returns a variable testapp reported, failing if it was not set.
func (r *testappReport) env(t *testing.T, name string) string {
	t.Helper()
	v, ok := r.Env[name]
	if !ok || v == nil {
		t.Fatalf("testapp did not see %s (reported: %v)", name, keys(r.Env))
	}
	return *v
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// activated returns the Marble's identity from MARBLE_PREDEFINED_* as
// testapp saw it (the report must list those variables).
func (r *testappReport) activated(t *testing.T) activated {
	t.Helper()
	env := map[string][]byte{}
	for _, name := range []string{"MARBLE_PREDEFINED_ROOT_CA", "MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN",
		"MARBLE_PREDEFINED_PRIVATE_KEY", "MARBLE_PREDEFINED_COORDINATOR_ROOT_CA"} {
		env[name] = []byte(r.env(t, name))
	}
	return parseActivated(t, &marblepb.Parameters{Env: env})
}

// serverMarble is a running testapp server behind quarry-premain.
type serverMarble struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	out    *bufio.Reader
	report testappReport // its first line, with the bound address
}

// startServer starts m (whose Argv runs testapp -serve without -out) and
// waits for its first report line, which it prints once it listens.
func (m marbleRun) startServer(t *testing.T, c *coordinator) *serverMarble {
	t.Helper()
	cmd, stderr := m.command(t, c)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &serverMarble{cmd: cmd, stderr: stderr, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := s.out.ReadBytes('\n')
	if err != nil {
		code := exitCode(t, cmd.Wait())
		t.Fatalf("marble %q did not report listening (%v; exit status %d):\n%s", m.typ, err, code, stderr)
	}
	if err := json.Unmarshal(line, &s.report); err != nil || s.report.Listen == "" {
		t.Fatalf("marble %q: first line %q: %v", m.typ, line, err)
	}
	return s
}

// accepted reads the server's line for the next connection it answered.
func (s *serverMarble) accepted(t *testing.T) testappAccepted {
	t.Helper()
	line, err := s.out.ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		t.Fatalf("the server marble answered no connection (%v):\n%s", err, s.stderr)
	}
	var a testappAccepted
	if err := json.Unmarshal(line, &a); err != nil || a.Accepted == nil {
		t.Fatalf("server line %q: %v", line, err)
	}
	return a
}

// wait waits for the server to exit and checks that it succeeded.
func (s *serverMarble) wait(t *testing.T) {
	t.Helper()
	if code := exitCode(t, s.cmd.Wait()); code != 0 {
		t.Fatalf("the server marble exited with %d:\n%s", code, s.stderr)
	}
}

// freeLoopbackPorts returns n distinct TCP ports of 127.0.0.1 that were
// free a moment ago, for manifests that must name a Marble's port before it
// listens. They are taken below the kernel's ephemeral range where it can
// be read, so that no port-0 listener or outgoing connection of a parallel
// test takes one before the Marble listens.
func freeLoopbackPorts(t *testing.T, n int) []string {
	t.Helper()
	low := ephemeralLow()
	var ports []string
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			t.Fatalf("no free loopback port found (below %d)", low)
		}
		addr := "127.0.0.1:0"
		if low > minFixedPort+1000 {
			addr = "127.0.0.1:" + strconv.Itoa(minFixedPort+mrand.IntN(low-minFixedPort))
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		// Held until all are chosen, so they are distinct.
		defer ln.Close()
		_, port, err := net.SplitHostPort(ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, port)
	}
	return ports
}

// minFixedPort is the lowest port freeLoopbackPorts picks.
const minFixedPort = 10000

// ephemeralLow returns the lowest port the kernel assigns on its own, or 0
// if it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}

// quoteDevice is a fake Gramine attestation directory for a Marble on the
// platform s: it answers every report data the premain writes with a quote
// of enclave e over it, or, if bind is false, over other report data (a
// quote made for another certificate).
func (s *sgxPlatform) quoteDevice(t *testing.T, e dcaptest.Enclave, bind bool) *graminetest.Device {
	t.Helper()
	return graminetest.NewDevice(t, func(rd [64]byte) []byte {
		q := e
		q.ReportData = rd
		if !bind {
			q.ReportData[0] ^= 0xff
		}
		return s.pl.Quote(t, dcaptest.QuoteOptions{Enclave: q})
	})
}

// checkDevice checks that the device served exactly n quotes, each over
// SHA-256 of a certificate (32 bytes, then zeros), and met no bad
// exchanges.
func checkDevice(t *testing.T, d *graminetest.Device, n int) {
	t.Helper()
	if errs := d.Errors(); len(errs) > 0 {
		t.Errorf("the fake quoting device saw bad exchanges: %v", errs)
	}
	served := d.Served()
	if len(served) != n {
		t.Errorf("the fake quoting device served %d quotes, want %d", len(served), n)
	}
	for _, rd := range served {
		if [32]byte(rd[:32]) == [32]byte{} || [32]byte(rd[32:]) != [32]byte{} {
			t.Errorf("report data %x is not SHA-256 of a certificate followed by zeros", rd)
		}
	}
}
