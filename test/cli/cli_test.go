// Package cli runs scenario scripts (testdata/*.txtar, testscript format)
// that drive the real quarry binary against the real coordinator binary on
// loopback. Both are built once in TestMain.
//
// Custom script commands:
//
//	coordinator start [SEALDIR]   start a coordinator (seal dir default $WORK/seal) on a free
//	                              loopback port; exports QUARRY_COORDINATOR and SEAL_DIR
//	coordinator stop|kill|restart SIGTERM, SIGKILL, or SIGKILL and start on the same seal dir
//	exits CODE PROG ARGS...       run PROG and require exit code CODE; stdout/stderr as exec
//	genrsa NAME [pkcs1]           RSA-2048 key: NAME.key (PKCS #8, or PKCS #1), NAME.pub;
//	                              env NAME_PUB = the public key PEM as a JSON string
//	usercert NAME                 ECDSA P-256 certificate: NAME.crt, NAME.key (PKCS #8), NAME.pem (both);
//	                              env NAME_CERT = the certificate PEM as a JSON string
//	subst [-n] IN OUT             copy IN to OUT, replacing ${VAR} with the script's env;
//	                              -n drops the final newline (txtar files always end in one)
//	ciphertext JSONFILE NAME OUT  write the base64 recovery secret NAME of JSONFILE to OUT, raw
//	sha256 FILE VAR               VAR = the hex SHA-256 of FILE
//	sigstruct KIND PATH           an SGX enclave signed with a test key (compat_test.go)
package cli

import (
	"bufio"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
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
	"github.com/rogpeppe/go-internal/testscript"
)

// binDir holds the quarry and coordinator binaries built in TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "quarry-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Static and -trimpath, as the Dockerfile builds (deploy/container's
	// test builds the same packages that way): one build configuration
	// besides the race detector's, so the build cache serves both.
	build := exec.Command("go", "build", "-trimpath", "-o", dir+string(os.PathSeparator),
		"github.com/quarry-cc/quarry/cmd/quarry", "github.com/quarry-cc/quarry/cmd/coordinator")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building quarry and the coordinator:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestScripts(t *testing.T) {
	testscript.Run(t, scriptParams("testdata"))
}

func scriptParams(dir string) testscript.Params {
	return testscript.Params{
		Dir: dir,
		Setup: func(env *testscript.Env) error {
			env.Setenv("PATH", binDir+string(os.PathListSeparator)+env.Getenv("PATH"))
			c := &coordinator{}
			env.Values[coordinatorKey{}] = c
			env.Defer(c.kill)
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"coordinator": cmdCoordinator,
			"exits":       cmdExits,
			"genrsa":      cmdGenRSA,
			"usercert":    cmdUserCert,
			"subst":       cmdSubst,
			"ciphertext":  cmdCiphertext,
			"sha256":      cmdSHA256,
			"sigstruct":   cmdSigstruct,
		},
	}
}

type coordinatorKey struct{}

// coordinator is the coordinator process of one script.
type coordinator struct {
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	sealDir string
	logPath string
}

func cmdCoordinator(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! coordinator")
	}
	if len(args) == 0 {
		ts.Fatalf("usage: coordinator start [SEALDIR] | stop | kill | restart")
	}
	c := ts.Value(coordinatorKey{}).(*coordinator)
	switch args[0] {
	case "start":
		if len(args) > 2 {
			ts.Fatalf("usage: coordinator start [SEALDIR]")
		}
		sealDir := ts.MkAbs("seal")
		if len(args) == 2 {
			sealDir = ts.MkAbs(args[1])
		}
		c.start(ts, sealDir)
	case "stop":
		c.stop(ts, syscall.SIGTERM)
	case "kill":
		c.stop(ts, syscall.SIGKILL)
	case "restart":
		c.stop(ts, syscall.SIGKILL)
		c.start(ts, c.sealDir)
	default:
		ts.Fatalf("unknown coordinator subcommand %q", args[0])
	}
}

func (c *coordinator) running() bool {
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

func (c *coordinator) start(ts *testscript.TestScript, sealDir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running() {
		ts.Fatalf("coordinator already running")
	}
	c.sealDir = sealDir
	c.logPath = ts.MkAbs("coordinator.log")
	logFile, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	ts.Check(err)
	cmd := exec.Command(filepath.Join(binDir, "coordinator"))
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_SEAL_DIR=" + sealDir,
	}
	// Attestation settings of the script (attest_test.go) reach the coordinator.
	for _, name := range coordinatorAttestEnv {
		if v := ts.Getenv(name); v != "" {
			cmd.Env = append(cmd.Env, name+"="+v)
		}
	}
	stderr, err := cmd.StderrPipe()
	ts.Check(err)
	ts.Check(cmd.Start())
	c.cmd = cmd
	c.exited = make(chan struct{})
	addrc := make(chan string, 1)
	go func() {
		defer logFile.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			logFile.Write(append(line, '\n'))
			var entry struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(line, &entry) == nil && entry.Msg == "client API listening" {
				select {
				case addrc <- entry.Addr:
				default:
				}
			}
		}
		io.Copy(logFile, stderr)
	}()
	exited := c.exited
	go func() {
		cmd.Wait()
		close(exited)
	}()
	select {
	case addr := <-addrc:
		ts.Setenv("QUARRY_COORDINATOR", addr)
		ts.Setenv("SEAL_DIR", sealDir)
	case <-exited:
		ts.Fatalf("coordinator exited before listening:\n%s", readLog(c.logPath))
	case <-time.After(30 * time.Second):
		ts.Fatalf("coordinator did not start listening:\n%s", readLog(c.logPath))
	}
}

func readLog(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// stop signals the coordinator and waits for it to end.
func (c *coordinator) stop(ts *testscript.TestScript, sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running() {
		ts.Fatalf("coordinator not running")
	}
	c.cmd.Process.Signal(sig)
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
		ts.Fatalf("coordinator did not stop after %v", sig)
	}
}

// kill ends a still-running coordinator at the end of the script.
func (c *coordinator) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running() {
		c.cmd.Process.Kill()
		<-c.exited
	}
}

func cmdExits(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exits CODE PROG ARGS...")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("running %s: %v", args[1], err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited with %d, want %d", args[1], got, want)
	}
}

func cmdGenRSA(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 || len(args) > 2 || (len(args) == 2 && args[1] != "pkcs1") {
		ts.Fatalf("usage: genrsa NAME [pkcs1]")
	}
	name := args[0]
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	ts.Check(err)
	var priv *pem.Block
	if len(args) == 2 {
		priv = &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}
	} else {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		ts.Check(err)
		priv = &pem.Block{Type: "PRIVATE KEY", Bytes: der}
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	ts.Check(err)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	ts.Check(os.WriteFile(ts.MkAbs(name+".key"), pem.EncodeToMemory(priv), 0o600))
	ts.Check(os.WriteFile(ts.MkAbs(name+".pub"), pubPEM, 0o644))
	ts.Setenv(name+"_PUB", jsonString(string(pubPEM)))
}

func cmdUserCert(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: usercert NAME")
	}
	name := args[0]
	c := testpki.SelfSigned(ts, name, testpki.Usage(x509.KeyUsageDigitalSignature), testpki.ClientAuth())
	certPEM, keyPEM := c.CertPEM(), c.KeyPEM(ts)
	ts.Check(os.WriteFile(ts.MkAbs(name+".crt"), certPEM, 0o644))
	ts.Check(os.WriteFile(ts.MkAbs(name+".key"), keyPEM, 0o600))
	ts.Check(os.WriteFile(ts.MkAbs(name+".pem"), append(certPEM, keyPEM...), 0o600))
	ts.Setenv(name+"_CERT", jsonString(string(certPEM)))
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func cmdSubst(ts *testscript.TestScript, neg bool, args []string) {
	trim := len(args) > 0 && args[0] == "-n"
	if trim {
		args = args[1:]
	}
	if neg || len(args) != 2 {
		ts.Fatalf("usage: subst [-n] IN OUT")
	}
	in := ts.ReadFile(args[0])
	if trim {
		in = strings.TrimSuffix(in, "\n")
	}
	var missing []string
	out := os.Expand(in, func(name string) string {
		v := ts.Getenv(name)
		if v == "" {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		ts.Fatalf("subst %s: unset variables %s", args[0], strings.Join(missing, ", "))
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), []byte(out), 0o644))
}

func cmdCiphertext(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: ciphertext JSONFILE NAME OUT")
	}
	var f struct {
		RecoverySecrets map[string][]byte
	}
	ts.Check(json.Unmarshal([]byte(ts.ReadFile(args[0])), &f))
	ct, ok := f.RecoverySecrets[args[1]]
	if !ok {
		ts.Fatalf("%s has no recovery secret %q", args[0], args[1])
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[2]), ct, 0o600))
}
