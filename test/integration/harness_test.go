// Package integration builds the real coordinator binary once and drives it
// over HTTPS on free loopback ports, with client certificates, SIGKILL and
// restarts.
package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/testpki"
)

// coordinatorBin is the binary built once in TestMain, as the release
// build is (static, -trimpath: the Dockerfile's configuration, whose
// compiled packages the other tests' builds share). raceCoordinatorBin is
// the same program built with the race detector: the runs that drive
// concurrent clients through faults (the linearizability and chaos runs,
// the torture test) start it, so that a data race in the real process
// under that load fails them. The other tests check behaviour, not
// concurrency, and a race-instrumented process costs them several times
// the CPU.
//
// The race detector's build does not depend on how this test binary is
// built: scripts/test runs this package without the race detector (its
// own code is a harness of processes) and the Coordinator under load with
// it. It needs cgo and a C compiler; without one it is coordinatorBin,
// except under CI=true, where that fails the run (raceBuild).
var coordinatorBin, raceCoordinatorBin string

// defaultParallel is how many tests of this package run at once unless
// -test.parallel is given: most of their time is spent waiting for a
// process (a start, a timeout, etcd), so more than the cores (the
// default) pay off; the tests that measure time or memory stay serial.
const defaultParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(defaultParallel))
	}
	dir, err := os.MkdirTemp("", "quarry-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	coordinatorBin = filepath.Join(dir, "coordinator")
	release := exec.Command("go", "build", "-trimpath", "-o", coordinatorBin, "github.com/quarry-cc/quarry/cmd/coordinator")
	release.Env = append(os.Environ(), "CGO_ENABLED=0")
	builds := []*exec.Cmd{release}
	raceCoordinatorBin = coordinatorBin
	if ok, why := raceBuild(); ok {
		raceCoordinatorBin = filepath.Join(dir, "coordinator-race")
		race := exec.Command("go", "build", "-race", "-o", raceCoordinatorBin, "github.com/quarry-cc/quarry/cmd/coordinator")
		race.Env = append(os.Environ(), "CGO_ENABLED=1")
		builds = append(builds, race)
	} else if os.Getenv("CI") == "true" {
		fmt.Fprintln(os.Stderr, "the race detector's build of the coordinator cannot be made:", why)
		os.Exit(1)
	} else {
		fmt.Fprintln(os.Stderr, "note: the concurrent-fault runs use the release build of the coordinator:", why)
	}
	for _, b := range builds {
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "building the coordinator:", err)
			os.Exit(1)
		}
	}
	for _, b := range builds {
		if err := b.Wait(); err != nil {
			fmt.Fprintf(os.Stderr, "building the coordinator (%s): %v\n", strings.Join(b.Args, " "), err)
			os.Exit(1)
		}
	}
	code := m.Run()
	reportContract() // contract_test.go
	os.RemoveAll(dir)
	os.Exit(code)
}

// raceBuild reports whether the race detector's build of the coordinator
// can be made here, and if not why: it needs cgo, hence the C compiler
// go env names.
func raceBuild() (bool, string) {
	if raceEnabled {
		return true, ""
	}
	cc := "gcc"
	if out, err := exec.Command("go", "env", "CC").Output(); err == nil && strings.TrimSpace(string(out)) != "" {
		cc = strings.Fields(string(out))[0]
	}
	if _, err := exec.LookPath(cc); err != nil {
		return false, fmt.Sprintf("no C compiler (%v)", err)
	}
	return true, ""
}

// coordinator is one running coordinator process.
type coordinator struct {
	t       testing.TB
	cmd     *exec.Cmd
	addr    string
	sealDir string
	env     []string
	// meshAddr is the Marble API's address (gRPC over TLS).
	meshAddr string
	// listenOnly: start returns once the APIs listen, without waiting
	// for the state to be loaded (store etcd, see startListening).
	listenOnly bool
	// served is closed when the process logs that it serves its loaded
	// state.
	served chan struct{}
	// race: the process is raceCoordinatorBin (startRaceCoordinator).
	race bool
	// launcher, if set, runs the binary (its path and arguments follow);
	// it must exec it, so that the process is the Coordinator's.
	launcher []string

	mu     sync.Mutex
	logs   bytes.Buffer
	exited chan struct{}
	err    error
}

// startCoordinator starts the binary with a seal directory (a new temporary
// one if empty) on a free loopback port and waits until it listens and
// serves its loaded state.
func startCoordinator(t testing.TB, sealDir string, env ...string) *coordinator {
	t.Helper()
	return launch(t, &coordinator{sealDir: sealDir, env: env})
}

// startRaceCoordinator is startCoordinator with the race detector's build
// of the coordinator (raceCoordinatorBin), for runs of concurrent clients.
func startRaceCoordinator(t testing.TB, sealDir string, env ...string) *coordinator {
	t.Helper()
	return launch(t, &coordinator{sealDir: sealDir, env: env, race: true})
}

// startListening is startCoordinator that returns as soon as the APIs
// listen: with store etcd the state may still be loading (the process then
// answers that it is starting).
func startListening(t testing.TB, sealDir string, env ...string) *coordinator {
	t.Helper()
	return launch(t, &coordinator{sealDir: sealDir, env: env, listenOnly: true})
}

// launch starts c for t (in a new temporary seal directory if c has none)
// and kills it when t ends.
func launch(t testing.TB, c *coordinator) *coordinator {
	t.Helper()
	if c.sealDir == "" {
		c.sealDir = t.TempDir()
	}
	c.t, c.exited = t, make(chan struct{}) // kill waits on exited, even if start fails early
	c.start()
	t.Cleanup(func() { c.kill() })
	return c
}

func (c *coordinator) start() {
	t := c.t
	t.Helper()
	bin := coordinatorBin
	if c.race {
		bin = raceCoordinatorBin
	}
	c.cmd = exec.Command(bin)
	if len(c.launcher) > 0 {
		c.cmd = exec.Command(c.launcher[0], append(c.launcher[1:], bin)...)
	}
	c.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_SEAL_DIR=" + c.sealDir,
		"EDG_DEBUG_LOGGING=1",
	}, c.env...)
	addrc, meshc := make(chan string, 1), make(chan string, 1)
	served := make(chan struct{})
	var servedOnce sync.Once
	c.served = served
	// stderr goes to a writer, not a pipe read here: os/exec copies it
	// and Wait returns only once the copy is done, so no read races the
	// end of the process (a pipe must be read to EOF before Wait).
	c.cmd.Stderr = &lineWriter{line: func(line []byte) {
		c.mu.Lock()
		c.logs.Write(line)
		c.logs.WriteByte('\n')
		c.mu.Unlock()
		var entry struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal(line, &entry) != nil {
			return
		}
		// Sends never block: a blocked writer would hold up Wait.
		switch entry.Msg {
		case "client API listening":
			select {
			case addrc <- entry.Addr:
			default:
			}
		case "marble API listening":
			select {
			case meshc <- entry.Addr:
			default:
			}
		case "state loaded; serving":
			servedOnce.Do(func() { close(served) })
		}
	}}
	// A bound on the copy after the process ended (a child that kept
	// stderr open), not expected to be reached.
	c.cmd.WaitDelay = 10 * time.Second
	c.exited = make(chan struct{})
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	select {
	case c.addr = <-addrc:
	case <-c.exited:
		t.Fatalf("coordinator exited before listening: %v\n%s", c.err, c.Logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("coordinator did not start listening\n%s", c.Logs())
	}
	// The Marble API's line comes before the Client API's.
	select {
	case c.meshAddr = <-meshc:
	case <-time.After(5 * time.Second):
		t.Fatalf("coordinator did not report the Marble API's address\n%s", c.Logs())
	}
	if c.listenOnly {
		return
	}
	select {
	case <-served:
	case <-c.exited:
		t.Fatalf("coordinator exited before serving its state: %v\n%s", c.err, c.Logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("coordinator did not load its state\n%s", c.Logs())
	}
}

// lineWriter calls line for each complete line written to it, without
// the newline (the process's log lines all end in one). Writes come from
// os/exec's one copying goroutine.
type lineWriter struct {
	line func([]byte)
	buf  []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// Logs returns everything the process has logged.
func (c *coordinator) Logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logs.String()
}

// kill sends SIGKILL and waits for the process to end.
func (c *coordinator) kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	c.cmd.Process.Kill()
	<-c.exited
}

// restart kills the process (SIGKILL) and starts it again on the same seal
// directory.
func (c *coordinator) restart() {
	c.t.Helper()
	c.kill()
	c.start()
}

// stop sends SIGTERM and returns the exit error.
func (c *coordinator) stop() error {
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		c.t.Fatal("coordinator did not stop after SIGTERM")
	}
	return c.err
}

func (c *coordinator) url(path string) string { return "https://" + c.addr + path }

// client returns an HTTPS client that trusts only root (or, if root is nil,
// anything: used to fetch the chain first) and presents cert if given.
func (c *coordinator) client(root *x509.Certificate, cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if root == nil {
		cfg.InsecureSkipVerify = true
	} else {
		pool := x509.NewCertPool()
		pool.AddCert(root)
		cfg.RootCAs = pool
		cfg.ServerName = "localhost"
	}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	// Every exchange is checked against api/openapi.yaml (contract_test.go).
	return newHTTPClient(validating(c.t, &http.Transport{TLSClientConfig: cfg}, cert != nil), 60*time.Second)
}

// newHTTPClient makes the tests' HTTP clients of the Client API (the
// harness's own and the load loops of the HA and DoS tests) in this one
// place. The tests that send malformed requests on purpose
// (hardening_test.go, flood_bench_test.go) make their own.
func newHTTPClient(tr http.RoundTripper, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: tr}
}

// response is a decoded v2 JSend answer.
type response struct {
	HTTPStatus  int
	ContentType string
	Status      string          `json:"status"`
	Data        json.RawMessage `json:"data"`
	Message     string          `json:"message"`
	Raw         []byte
}

// do sends a request and decodes the JSend envelope, failing the test if the
// body is not JSON.
func do(t *testing.T, hc *http.Client, method, url string, body any) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := response{HTTPStatus: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Raw: raw}
	if method != http.MethodHead {
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s %s: body is not JSON (%v): %q", method, url, err, raw)
		}
	}
	return r
}

// expect checks the HTTP status and JSend status of r.
func expect(t *testing.T, r response, httpStatus int, jsendStatus string) {
	t.Helper()
	if r.HTTPStatus != httpStatus || r.Status != jsendStatus {
		t.Fatalf("got HTTP %d %q, want HTTP %d %q; body %s", r.HTTPStatus, r.Status, httpStatus, jsendStatus, r.Raw)
	}
	if r.ContentType != "application/json" {
		t.Fatalf("Content-Type = %q, want application/json", r.ContentType)
	}
	if jsendStatus != "success" && r.Message == "" {
		t.Fatalf("%s response without a message: %s", jsendStatus, r.Raw)
	}
}

// decode unmarshals the data of a success response.
func decode(t *testing.T, r response, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Data, v); err != nil {
		t.Fatalf("decoding data %s: %v", r.Data, err)
	}
}

// newUserCert creates a self-signed client certificate for a manifest user.
func newUserCert(t testing.TB, cn string) (tls.Certificate, string) {
	t.Helper()
	c := testpki.SelfSigned(t, cn, testpki.ClientAuth())
	return c.TLS(), string(c.CertPEM())
}
