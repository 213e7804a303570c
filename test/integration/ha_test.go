package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

var haPrefixes atomic.Int64

// haEnv is the environment of instances sharing one prefix of etcd.
func haEnv(endpoints []string, prefix string) []string {
	return []string{
		"QUARRY_STORE=etcd",
		"QUARRY_ETCD_ENDPOINTS=" + strings.Join(endpoints, ","),
		"QUARRY_ETCD_PREFIX=" + prefix,
		"QUARRY_INSECURE_PEER_TRUST=1",
	}
}

func newPrefix() string { return fmt.Sprintf("/ha%d/", haPrefixes.Add(1)) }

// etcdStores opens the prefix's blobs directly (what an operator with etcd
// access sees).
func etcdStores(t *testing.T, endpoints []string, prefix string) (*etcdstore.Store, *etcdstore.Store) {
	t.Helper()
	cli, err := etcdstore.Connect(t.Context(), etcdstore.Options{Endpoints: endpoints, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	d, _ := cli.Store("sealed_data")
	k, _ := cli.Store("sealed_key")
	return d, k
}

// TestHAStateSurvivesRestart: the real binary on etcd: set a manifest,
// SIGKILL, restart: the state is there, and nothing was written to the
// seal directory.
func TestHAStateSurvivesRestart(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	prefix := newPrefix()
	c := startCoordinator(t, "", haEnv(cluster.Endpoints(), prefix)...)
	hc := c.client(nil, nil)
	f := newFixture(t)
	expect(t, setManifest(t, c, hc, f.bytes(t)), http.StatusOK, "success")
	_, root := getChain(t, c, hc)
	c.restart()
	hc = c.client(nil, nil)
	expectState(t, c, hc, 3, "Coordinator is running correctly and ready to accept marbles.")
	if _, root2 := getChain(t, c, hc); !root2.Equal(root) {
		t.Fatal("another root certificate after the restart")
	}
	checkManifest(t, c, c.client(root, nil), root, f.bytes(t))
	// Only the instance id (its entry in the key file) is kept locally.
	if entries, _ := os.ReadDir(c.sealDir); len(entries) != 1 || entries[0].Name() != "instance_id" {
		t.Errorf("the seal directory holds %d entries with store etcd, want only instance_id", len(entries))
	}
	// The blobs in etcd are sealed: the manifest is not in them in clear.
	d, _ := etcdStores(t, cluster.Endpoints(), prefix)
	blob, _, err := d.Load(t.Context())
	if err != nil || bytes.Contains(blob, []byte("backend_first")) {
		t.Fatalf("sealed_data in etcd: %v; contains the manifest in clear: %v", err, bytes.Contains(blob, []byte("backend_first")))
	}
	if !strings.Contains(c.Logs(), "INSECURE: --insecure-peer-trust") {
		t.Error("the insecure peer trust warning is missing from the log")
	}
}

// TestHAThreeInstances: three processes on one prefix agree after every
// acknowledged write, whichever instance took it; a killed instance comes
// back with the writes made meanwhile.
func TestHAThreeInstances(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	env := haEnv(cluster.Endpoints(), newPrefix())
	inst := []*coordinator{startCoordinator(t, "", env...), startCoordinator(t, "", env...), startCoordinator(t, "", env...)}
	f := newFixture(t)
	expect(t, setManifest(t, inst[0], inst[0].client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	// Any instance now refuses a second manifest (state 3 everywhere).
	expect(t, setManifest(t, inst[2], inst[2].client(nil, nil), f.bytes(t)), http.StatusConflict, "fail")
	_, root := getChain(t, inst[0], inst[0].client(nil, nil))
	alice := f.users["alice"].cert
	clients := make([]*http.Client, len(inst))
	for i, c := range inst {
		clients[i] = c.client(root, &alice) // every instance serves the one root
		expectState(t, c, clients[i], 3, "Coordinator is running correctly and ready to accept marbles.")
	}
	key := func(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }
	for round := range 6 {
		w := inst[round%3]
		expect(t, postSecrets(t, w, clients[round%3], map[string]any{"userkey": map[string]any{"key": key(byte(round))}}), http.StatusOK, "success")
		for i, c := range inst { // read-your-writes at every instance
			got := getSecrets(t, c, clients[i], "userkey")["userkey"]
			if !bytes.Equal(got.Private, key(byte(round))) {
				t.Fatalf("round %d: instance %d reads %x after the write at instance %d", round, i, got.Private, round%3)
			}
		}
	}
	logs := make([]string, len(inst))
	for i, c := range inst {
		r := do(t, clients[i], http.MethodGet, c.url("/api/v2/update"), nil)
		expect(t, r, http.StatusOK, "success")
		logs[i] = string(r.Data)
	}
	if logs[0] != logs[1] || logs[1] != logs[2] {
		t.Fatal("the instances serve different update logs")
	}
	// SIGKILL one instance; the others go on; it comes back up to date.
	inst[0].kill()
	expect(t, postSecrets(t, inst[1], clients[1], map[string]any{"userkey": map[string]any{"key": key(0xee)}}), http.StatusOK, "success")
	start := time.Now()
	inst[0].start()
	t.Logf("a restarted instance serves after %v", time.Since(start))
	c0 := inst[0].client(root, &alice)
	if got := getSecrets(t, inst[0], c0, "userkey")["userkey"]; !bytes.Equal(got.Private, key(0xee)) {
		t.Fatalf("the restarted instance reads %x", got.Private)
	}
}

// TestHAForeignBlobEntersRecovery: a blob under the prefix that no key
// opens: recovery mode, nothing overwritten.
func TestHAForeignBlobEntersRecovery(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	prefix := newPrefix()
	d, k := etcdStores(t, cluster.Endpoints(), prefix)
	rev, err := d.SavePair(t.Context(), []byte("foreign blob"), "", k, []byte("foreign key"), "")
	if err != nil {
		t.Fatal(err)
	}
	c := startCoordinator(t, "", haEnv(cluster.Endpoints(), prefix)...)
	expectState(t, c, c.client(nil, nil), 1, "Coordinator is in recovery mode. Either upload a key to unseal the saved state, or set a new manifest. For more information on how to proceed, consult the documentation.")
	c.restart()
	expectState(t, c, c.client(nil, nil), 1, "Coordinator is in recovery mode. Either upload a key to unseal the saved state, or set a new manifest. For more information on how to proceed, consult the documentation.")
	for _, s := range []*etcdstore.Store{d, k} {
		blob, r, err := s.Load(t.Context())
		if err != nil || r != rev || !strings.HasPrefix(string(blob), "foreign") {
			t.Fatalf("%s = %q at %s (%v): changed", s.Key(), blob, r, err)
		}
	}
}

// TestHAEtcdLostWhileRunning: with etcd gone, requests get 503 (never a
// stale answer or a half-applied write); after it returns, they work.
func TestHAEtcdLostWhileRunning(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	prefix := newPrefix()
	c := startCoordinator(t, "", haEnv(cluster.Endpoints(), prefix)...)
	f := newFixture(t)
	expect(t, setManifest(t, c, c.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	alice := f.users["alice"].cert
	hc := c.client(nil, &alice)
	hc.Timeout = 30 * time.Second
	cluster.Stop(0)
	r := do(t, hc, http.MethodPost, c.url("/api/v2/secrets"), map[string]any{"secrets": map[string]any{"userkey": map[string]any{"key": bytes.Repeat([]byte{1}, 32)}}})
	expect(t, r, http.StatusServiceUnavailable, "error")
	expect(t, do(t, hc, http.MethodGet, c.url("/api/v2/status"), nil), http.StatusServiceUnavailable, "error")
	if err := cluster.Restart(0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := do(t, hc, http.MethodGet, secretsURL(c, "userkey"), nil)
		if r.HTTPStatus == http.StatusOK {
			if strings.Contains(string(r.Data), "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=") {
				t.Fatal("the write refused with 503 was applied")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not serving 30 s after etcd came back: %s", r.Raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHARefusals: start refused with a reason: simulation without
// --insecure-peer-trust, and a different binary beside a running one;
// bad store settings exit 2 naming the setting.
func TestHARefusals(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	prefix := newPrefix()
	env := haEnv(cluster.Endpoints(), prefix)

	code, out := runCoordinatorOnce(t, env[:3]...)
	if code != 1 || !strings.Contains(out, "--insecure-peer-trust") {
		t.Errorf("simulation on etcd without peer trust: exit %d\n%s", code, out)
	}
	code, out = runCoordinatorOnce(t, "QUARRY_STORE=etcd")
	if code != 2 || !strings.Contains(out, "etcd-endpoints [QUARRY_ETCD_ENDPOINTS]") {
		t.Errorf("store etcd without endpoints: exit %d\n%s", code, out)
	}
	code, out = runCoordinatorOnce(t, "QUARRY_STORE=etcd", "QUARRY_ETCD_ENDPOINTS=etcd:2379")
	if code != 2 || !strings.Contains(out, "etcd-endpoints [QUARRY_ETCD_ENDPOINTS]") {
		t.Errorf("endpoint without scheme: exit %d\n%s", code, out)
	}

	// A different binary (another hash) beside a running instance.
	startCoordinator(t, "", env...)
	other := filepath.Join(t.TempDir(), "coordinator")
	bin, err := os.ReadFile(coordinatorBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, append(bin, "another build"...), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, other)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0", "EDG_COORDINATOR_SEAL_DIR=" + t.TempDir()}, env...)
	outb, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(outb), "refusing to share state with a different instance") {
		t.Errorf("a different binary on the same prefix: %v\n%s", err, outb)
	}
}
