package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Coordinator is a Coordinator process started by StartCoordinator, with its
// own temporary seal directory, listening on a free loopback port.
type Coordinator struct {
	Addr string // host:port of the Client API

	cmd     *exec.Cmd
	sealDir string
	log     *logTail
	exited  chan struct{}
	waitErr error
}

// StartCoordinator runs bin with a fresh seal directory and free loopback
// ports and returns once it logs that the Client API listens (at most
// timeout). Its environment is only the Coordinator's own settings plus
// env (KEY=value; the command passes PATH, HOME and TMPDIR), so settings of
// the caller's shell do not change what is measured.
func StartCoordinator(ctx context.Context, bin string, env []string, timeout time.Duration) (*Coordinator, error) {
	sealDir, err := os.MkdirTemp("", "quarry-bench-seal-")
	if err != nil {
		return nil, err
	}
	env = append([]string{
		"EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_SEAL_DIR=" + sealDir,
		// All the load comes from one address: no per-source bound
		// below the Client API's connection limit (docs/http.md).
		"QUARRY_CLIENT_MAX_PER_SOURCE=1000000",
		// Every simulated Marble connects from 127.0.0.1: the per-source
		// limit (32 by default, docs/http.md) would cap -c, which measures
		// throughput, not fairness.
		"QUARRY_MESH_MAX_CONNECTIONS=65536",
		"QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE=65536",
	}, env...)
	c := &Coordinator{
		cmd:     exec.Command(bin),
		sealDir: sealDir,
		log:     &logTail{addr: make(chan string, 1)},
		exited:  make(chan struct{}),
	}
	c.cmd.Env = env
	c.cmd.Stderr = c.log
	c.cmd.Stdout = c.log
	if err := c.cmd.Start(); err != nil {
		os.RemoveAll(sealDir)
		return nil, fmt.Errorf("starting the coordinator: %w", err)
	}
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case c.Addr = <-c.log.addr:
		return c, nil
	case <-c.exited:
		err = fmt.Errorf("the coordinator exited before listening (%v); its log:\n%s", c.waitErr, c.Logs())
	case <-timer.C:
		err = fmt.Errorf("the coordinator did not log %q within %v; its log:\n%s", listeningMsg, timeout, c.Logs())
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.Stop()
	return nil, err
}

// PID returns the process id.
func (c *Coordinator) PID() int { return c.cmd.Process.Pid }

// Logs returns the end of what the process wrote (at most 64 KiB).
func (c *Coordinator) Logs() string { return c.log.String() }

// Stop ends the process (SIGTERM, then SIGKILL after 10 s), waits for it and
// removes its seal directory. It may be called more than once.
func (c *Coordinator) Stop() {
	select {
	case <-c.exited:
	default:
		if c.cmd.Process.Signal(syscall.SIGTERM) != nil {
			c.cmd.Process.Kill()
		}
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-c.exited
		}
	}
	os.RemoveAll(c.sealDir)
}

// Memory is a process's resident memory in bytes.
type Memory struct {
	RSS  int64 `json:"vmRSSBytes"` // VmRSS: resident now
	Peak int64 `json:"vmHWMBytes"` // VmHWM: highest resident so far
}

// ErrNoProcStatus is returned by ResidentMemory where /proc/<pid>/status does
// not exist (other systems than Linux).
var ErrNoProcStatus = errors.New("resident memory is read from /proc/<pid>/status, which only Linux has")

// ResidentMemory reads VmRSS and VmHWM of the running process.
func (c *Coordinator) ResidentMemory() (Memory, error) {
	return ProcessMemory(c.PID())
}

// ProcessMemory reads VmRSS and VmHWM of process pid from /proc.
func ProcessMemory(pid int) (Memory, error) {
	if runtime.GOOS != "linux" {
		return Memory{}, ErrNoProcStatus
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return Memory{}, err
	}
	defer f.Close()
	return parseProcStatus(f)
}

// parseProcStatus reads the VmRSS and VmHWM lines ("VmRSS:  1234 kB") of a
// /proc/<pid>/status file.
func parseProcStatus(r io.Reader) (Memory, error) {
	var m Memory
	var found int
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		fields := strings.Fields(val)
		if len(fields) != 2 || fields[1] != "kB" {
			return Memory{}, fmt.Errorf("unexpected %s line %q", key, sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("unexpected %s line %q", key, sc.Text())
		}
		if key == "VmRSS" {
			m.RSS = kb << 10
		} else {
			m.Peak = kb << 10
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return Memory{}, err
	}
	if found != 2 {
		return Memory{}, errors.New("no VmRSS and VmHWM lines in the process status")
	}
	return m, nil
}

// listeningMsg is the message of the Coordinator's JSON log line that carries
// the Client API address.
const listeningMsg = "client API listening"

// logTail keeps the last 64 KiB a process writes and reports the address of
// the first "client API listening" line. The process's output goes through
// Write, so it never blocks on a full pipe.
type logTail struct {
	mu      sync.Mutex
	buf     []byte // kept output
	partial []byte // current incomplete line
	addr    chan string
	found   bool
}

const (
	maxLogTail = 64 << 10
	maxLogLine = 64 << 10
)

func (t *logTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - maxLogTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	if t.found {
		return len(p), nil
	}
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		line := t.partial[:i]
		var entry struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal(line, &entry) == nil && entry.Msg == listeningMsg && entry.Addr != "" {
			t.found = true
			t.partial = nil
			t.addr <- entry.Addr
			break
		}
		t.partial = t.partial[i+1:]
	}
	if len(t.partial) > maxLogLine {
		t.partial = t.partial[:0]
	}
	return len(p), nil
}

func (t *logTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
