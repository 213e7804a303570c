package etcdtest

import (
	"context"
	"encoding/json"
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

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BinaryEnv names an etcd binary to use instead of the one Binary builds
// (e.g. /usr/bin/etcd of Debian's etcd-server, to test against that
// version).
const BinaryEnv = "QUARRY_TEST_ETCD"

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// Binary returns the path of an etcd server binary built once per test
// process from the etcd module this repository requires (go.mod's tool
// block), so that the server is the version the client and the embedded
// servers are. Tests that honour BinaryEnv read it themselves (the
// environment is read only at the top: internal/archtest) and pass the
// path in ProcOptions.Binary.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "quarry-etcd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		bin := filepath.Join(dir, "etcd")
		// Static and -trimpath, as the tests build Quarry's binaries: the
		// packages both use (gRPC, protobuf, the etcd client) compile once.
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "go.etcd.io/etcd/server/v3")
		cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("building etcd (go build go.etcd.io/etcd/server/v3): %w\n%s", err, out)
			return
		}
		builtBin = bin
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// ProcOptions configure a cluster of etcd processes.
type ProcOptions struct {
	// Binary is the etcd server (default: Binary(t)).
	Binary string
	// HeartbeatMs and ElectionMs are etcd's --heartbeat-interval and
	// --election-timeout (default 50 and 500: elections within a second).
	HeartbeatMs, ElectionMs int
}

// Procs is a cluster of real etcd server processes on loopback ports,
// which a test can crash (SIGKILL), stop (SIGTERM), freeze (SIGSTOP) and
// thaw (SIGCONT), and start again on their data.
type Procs struct {
	t       testing.TB
	opts    ProcOptions
	dir     string
	members []*proc
}

type proc struct {
	mu        sync.Mutex
	name, dir string
	clientURL string
	peerURL   string
	cluster   string
	cmd       *exec.Cmd
	exited    chan struct{}
	frozen    bool
}

// StartProcs starts an n-member cluster of etcd processes, waits until it
// has a leader, and kills it when the test ends.
func StartProcs(t testing.TB, n int, opts ProcOptions) *Procs {
	t.Helper()
	if opts.Binary == "" {
		opts.Binary = Binary(t)
	}
	if opts.HeartbeatMs == 0 {
		opts.HeartbeatMs = 50
	}
	if opts.ElectionMs == 0 {
		opts.ElectionMs = 500
	}
	c := &Procs{t: t, opts: opts, dir: t.TempDir()}
	var peers []string
	for i := range n {
		m := &proc{
			name:      fmt.Sprintf("m%d", i),
			dir:       filepath.Join(c.dir, fmt.Sprintf("m%d", i)),
			clientURL: "http://" + freeAddr(t),
			peerURL:   "http://" + freeAddr(t),
		}
		peers = append(peers, m.name+"="+m.peerURL)
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.cluster = strings.Join(peers, ",")
	}
	t.Cleanup(c.Close)
	for i := range c.members {
		if err := c.start(i); err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
	}
	if err := c.WaitHealthy(60 * time.Second); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return c
}

func (c *Procs) start(i int) error {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return nil
	}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(m.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.opts.Binary,
		"--name", m.name,
		"--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", m.cluster,
		"--initial-cluster-token", "etcdtest-procs",
		"--initial-cluster-state", "new", // ignored once the data directory exists
		"--heartbeat-interval", strconv.Itoa(c.opts.HeartbeatMs),
		"--election-timeout", strconv.Itoa(c.opts.ElectionMs),
		"--max-request-bytes", strconv.Itoa(MaxRequestBytes),
		"--log-level", "warn",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The member dies with the test process, also when that is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting etcd member %s: %w", m.name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(exited)
	}()
	m.cmd, m.exited, m.frozen = cmd, exited, false
	return nil
}

// Endpoints returns the client URLs of all members (running or not).
func (c *Procs) Endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL)
	}
	return eps
}

// Size returns the number of members.
func (c *Procs) Size() int { return len(c.members) }

// Running reports whether member i's process runs (frozen or not).
func (c *Procs) Running(i int) bool {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd != nil
}

// signalAndWait sends sig to member i and waits until it exits.
func (c *Procs) signalAndWait(i int, sig syscall.Signal) error {
	m := c.members[i]
	m.mu.Lock()
	cmd, exited, frozen := m.cmd, m.exited, m.frozen
	m.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return err
	}
	if frozen && sig != syscall.SIGKILL {
		cmd.Process.Signal(syscall.SIGCONT) // a stopped process acts on SIGTERM only once it runs
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		return fmt.Errorf("etcd member %s did not exit within 30 s after %v", m.name, sig)
	}
	m.mu.Lock()
	m.cmd, m.frozen = nil, false
	m.mu.Unlock()
	return nil
}

// Kill crashes member i (SIGKILL) and waits until it is gone; its data
// stays for Restart.
func (c *Procs) Kill(i int) {
	if err := c.signalAndWait(i, syscall.SIGKILL); err != nil {
		c.t.Errorf("etcdtest: %v", err)
	}
}

// Term stops member i gracefully (SIGTERM: a leader hands over first) and
// waits until it is gone.
func (c *Procs) Term(i int) {
	if err := c.signalAndWait(i, syscall.SIGTERM); err != nil {
		c.t.Errorf("etcdtest: %v", err)
	}
}

// Freeze stops member i's process (SIGSTOP): its sockets stay open and
// accept connections, but nothing answers — a hung machine or a long GC
// pause, as the clients see it.
func (c *Procs) Freeze(i int) {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil || m.frozen {
		return
	}
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		c.t.Errorf("etcdtest: freezing %s: %v", m.name, err)
		return
	}
	m.frozen = true
}

// Thaw lets a frozen member i run again (SIGCONT).
func (c *Procs) Thaw(i int) {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil || !m.frozen {
		return
	}
	if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		c.t.Errorf("etcdtest: thawing %s: %v", m.name, err)
		return
	}
	m.frozen = false
}

// Frozen reports whether member i is frozen.
func (c *Procs) Frozen(i int) bool {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.frozen
}

// Restart starts a killed or stopped member i again on its data (a frozen
// one is thawed). It does not wait for the member to join a quorum.
func (c *Procs) Restart(i int) error {
	c.Thaw(i)
	return c.start(i)
}

// Healthy reports whether member i answers /health with a leader (which a
// member reaches only with a quorum).
func (c *Procs) Healthy(i int) bool {
	m := c.members[i]
	hc := &http.Client{Timeout: time.Second}
	resp, err := hc.Get(m.clientURL + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return json.Unmarshal(body, &h) == nil && h.Health == "true"
}

// WaitHealthy waits until every running, unfrozen member is healthy.
func (c *Procs) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		bad := ""
		for i, m := range c.members {
			if c.Running(i) && !c.Frozen(i) && !c.Healthy(i) {
				bad = m.name
				break
			}
		}
		if bad == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd member %s is not healthy after %v; its log: %s", bad, timeout, filepath.Join(c.dir, bad, "etcd.log"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// MemberStatus is what one member says of itself.
type MemberStatus struct {
	// Leader reports whether the member is the leader.
	Leader bool
	// DBSize and DBSizeInUse are the backend database's size on disk and
	// the part of it in use, in bytes.
	DBSize, DBSizeInUse int64
	// Revision is the member's current store revision.
	Revision int64
}

// Status asks member i (which must run and not be frozen) for its status.
func (c *Procs) Status(i int) (MemberStatus, error) {
	ep := c.members[i].clientURL
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return MemberStatus{}, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := cli.Status(ctx, ep)
	if err != nil {
		return MemberStatus{}, fmt.Errorf("status of etcd member %s: %w", c.members[i].name, err)
	}
	return MemberStatus{Leader: s.Header.MemberId == s.Leader, DBSize: s.DbSize, DBSizeInUse: s.DbSizeInUse, Revision: s.Header.Revision}, nil
}

// Leader returns the index of the member that says it leads, or -1.
func (c *Procs) Leader() int {
	for i := range c.members {
		if !c.Running(i) || c.Frozen(i) {
			continue
		}
		if s, err := c.Status(i); err == nil && s.Leader {
			return i
		}
	}
	return -1
}

// LogTail returns the last n bytes of member i's log.
func (c *Procs) LogTail(i, n int) string {
	b, err := os.ReadFile(filepath.Join(c.members[i].dir, "etcd.log"))
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Close kills every member.
func (c *Procs) Close() {
	for i := range c.members {
		c.signalAndWait(i, syscall.SIGKILL)
	}
}
