package loadgen

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseProcStatus(t *testing.T) {
	status := "Name:\tcoordinator\nVmPeak:\t 1300000 kB\nVmHWM:\t   45012 kB\nVmRSS:\t   38100 kB\nThreads:\t7\n"
	m, err := parseProcStatus(strings.NewReader(status))
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS != 38100*1024 || m.Peak != 45012*1024 {
		t.Errorf("got %+v", m)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\nVmHWM:\t12 kB\n", "VmRSS:\tx kB\nVmHWM:\t1 kB\n"} {
		if _, err := parseProcStatus(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestProcessMemorySelf(t *testing.T) {
	m, err := ProcessMemory(os.Getpid())
	if runtime.GOOS != "linux" {
		if err != ErrNoProcStatus {
			t.Fatalf("err = %v, want ErrNoProcStatus", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS <= 0 || m.Peak < m.RSS {
		t.Errorf("got %+v", m)
	}
}

func TestLogTailFindsAddress(t *testing.T) {
	l := &logTail{addr: make(chan string, 1)}
	// The line arrives in pieces, after other lines and a non-JSON one.
	for _, p := range []string{
		`{"level":"WARN","msg":"sealing in simulation mode"}` + "\nnot json\n" + `{"msg":"client API lis`,
		`tening","addr":"127.0.0.1:4`,
		"433\",\"state\":2}\n{\"msg\":\"client API listening\",\"addr\":\"127.0.0.1:9\"}\n",
	} {
		if n, err := l.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	select {
	case addr := <-l.addr:
		if addr != "127.0.0.1:4433" {
			t.Errorf("addr %q", addr)
		}
	default:
		t.Fatal("no address found")
	}
	if !strings.Contains(l.String(), "not json") {
		t.Error("the log lost a line")
	}
	// The tail stays bounded.
	l.Write([]byte(strings.Repeat("x", 3*maxLogTail)))
	if len(l.String()) != maxLogTail {
		t.Errorf("tail of %d bytes", len(l.String()))
	}
}

// fakeCoordinator writes a shell script that stands in for the binary.
func fakeCoordinator(t *testing.T, script string) string {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil || runtime.GOOS == "windows" {
		t.Skip("needs a POSIX shell")
	}
	path := filepath.Join(t.TempDir(), "coordinator")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestStartCoordinator(t *testing.T) {
	t.Setenv("EDG_COORDINATOR_DEV_MODE", "1") // not passed on
	bin := fakeCoordinator(t, `echo "seal=$EDG_COORDINATOR_SEAL_DIR client=$EDG_COORDINATOR_CLIENT_ADDR mesh=$EDG_COORDINATOR_MESH_ADDR dev=$EDG_COORDINATOR_DEV_MODE" >&2
echo '{"time":"x","level":"INFO","msg":"client API listening","addr":"127.0.0.1:40000","state":2}' >&2
exec sleep 60
`)
	c, err := StartCoordinator(context.Background(), bin, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if c.Addr != "127.0.0.1:40000" {
		t.Errorf("addr %q", c.Addr)
	}
	logs := c.Logs()
	if !strings.Contains(logs, "client=127.0.0.1:0 mesh=127.0.0.1:0 dev=\n") {
		t.Errorf("environment: %s", logs)
	}
	sealDir := c.sealDir
	if !strings.Contains(logs, "seal="+sealDir) {
		t.Errorf("seal dir %s not passed: %s", sealDir, logs)
	}
	if _, err := os.Stat(sealDir); err != nil {
		t.Errorf("seal dir: %v", err)
	}
	if runtime.GOOS == "linux" {
		if m, err := c.ResidentMemory(); err != nil || m.RSS <= 0 {
			t.Errorf("ResidentMemory = %+v, %v", m, err)
		}
	}
	start := time.Now()
	c.Stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Stop took %v", took)
	}
	if _, err := os.Stat(sealDir); !os.IsNotExist(err) {
		t.Errorf("seal dir left behind: %v", err)
	}
	c.Stop() // again: no effect
}

func TestStartCoordinatorFailures(t *testing.T) {
	exits := fakeCoordinator(t, "echo 'invalid configuration' >&2; exit 2\n")
	_, err := StartCoordinator(context.Background(), exits, nil, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "exited before listening") || !strings.Contains(err.Error(), "invalid configuration") {
		t.Errorf("exiting binary: %v", err)
	}
	silent := fakeCoordinator(t, "exec sleep 60\n")
	start := time.Now()
	_, err = StartCoordinator(context.Background(), silent, nil, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not log") {
		t.Errorf("silent binary: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("gave up after %v", took)
	}
	if _, err := StartCoordinator(context.Background(), filepath.Join(t.TempDir(), "missing"), nil, time.Second); err == nil {
		t.Error("a missing binary started")
	}
}
