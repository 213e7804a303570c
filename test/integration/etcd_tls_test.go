package integration

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// tlsEnv is haEnv for a TLS etcd: https:// endpoints and the three PEM
// files.
func tlsEnv(endpoints []string, prefix, ca, cert, key string) []string {
	return append(haEnv(endpoints, prefix),
		"QUARRY_ETCD_CA="+ca, "QUARRY_ETCD_CERT="+cert, "QUARRY_ETCD_KEY="+key)
}

// TestEtcdTLSStateSurvivesRestart: the real binary on an etcd that serves
// TLS and requires a client certificate: set a manifest, SIGKILL,
// restart: the state is there (read back from etcd over TLS).
func TestEtcdTLSStateSurvivesRestart(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartTLS(t, 1)
	f := cluster.TLS()
	prefix := newPrefix()
	c := startCoordinator(t, "", tlsEnv(cluster.Endpoints(), prefix, f.CAFile, f.CertFile, f.KeyFile)...)
	hc := c.client(nil, nil)
	fx := newFixture(t)
	expect(t, setManifest(t, c, hc, fx.bytes(t)), http.StatusOK, "success")
	_, root := getChain(t, c, hc)
	c.restart()
	hc = c.client(nil, nil)
	expectState(t, c, hc, 3, "Coordinator is running correctly and ready to accept marbles.")
	if _, root2 := getChain(t, c, hc); !root2.Equal(root) {
		t.Fatal("another root certificate after the restart")
	}
	checkManifest(t, c, c.client(root, nil), root, fx.bytes(t))
	// The state is in that etcd, under the prefix.
	cli, err := etcdstore.Connect(t.Context(), etcdstore.Options{
		Endpoints: cluster.Endpoints(), Prefix: prefix, CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	d, _ := cli.Store("sealed_data")
	if _, _, err := d.Load(t.Context()); err != nil {
		t.Fatalf("sealed_data in the TLS etcd: %v", err)
	}
}

// TestEtcdTLSRefused: a start against the TLS etcd with a CA that did not
// sign its certificate exits 1 at once (no retries: waiting cannot cure it),
// naming etcd, TLS, the endpoint and the CA setting; a client certificate
// whose key is another one exits 1 at once too.
func TestEtcdTLSRefused(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartTLS(t, 1)
	f := cluster.TLS()
	other := etcdtest.NewCA(t, t.TempDir(), "other-ca")
	_, otherKey := other.Issue(t, "client", false)

	start := time.Now()
	code, out := runCoordinatorBounded(t, 120*time.Second,
		tlsEnv(cluster.Endpoints(), newPrefix(), other.CertFile, f.CertFile, f.KeyFile)...)
	took := time.Since(start)
	for _, want := range []string{etcdstore.ErrTLS.Error(), "certificate is not trusted", cluster.Endpoints()[0], "--etcd-ca (QUARRY_ETCD_CA)", `"msg":"cannot start"`} {
		if code != 1 || !strings.Contains(out, want) {
			t.Fatalf("start with the wrong etcd CA: exit %d, want 1 saying %q\n%s", code, want, out)
		}
	}
	if strings.Contains(out, "retrying") || strings.Contains(out, "state loaded; serving") {
		t.Errorf("want no retry and no service with a CA that did not sign etcd's certificate\n%s", out)
	}
	t.Logf("wrong CA: exit %d after %v: %s", code, took, lastLine(out))

	code, out = runCoordinatorBounded(t, 30*time.Second,
		tlsEnv(cluster.Endpoints(), newPrefix(), f.CAFile, f.CertFile, otherKey)...)
	if code != 1 || !strings.Contains(out, "client certificate") || strings.Contains(out, "retrying") {
		t.Fatalf("start with a key that is not the certificate's: exit %d, want 1 at once naming the client certificate\n%s", code, out)
	}
}

// runCoordinatorBounded runs the binary until it exits (killed after
// limit) and returns its exit code and output.
func runCoordinatorBounded(t *testing.T, limit time.Duration, env ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, coordinatorBin)
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_SEAL_DIR=" + t.TempDir(),
	}, env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the coordinator still ran after %v\n%s", limit, out)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("running the coordinator: %v", err)
	return -1, ""
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
