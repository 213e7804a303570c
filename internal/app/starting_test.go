package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/metrics"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// TestStartStatusReason: the readiness reason of a start says what runs
// before the first failure, then the cause, the attempt and the wait left,
// and which attempt runs once the wait is over; the first 8 failures are
// each logged, then one a minute.
func TestStartStatusReason(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	st := newStartStatus()
	st.now = func() time.Time { return now }
	reason := func() string {
		t.Helper()
		state, err := st.Ready(t.Context())
		var nr *metrics.NotReadyError
		if state != core.StateUninitialized || !errors.As(err, &nr) {
			t.Fatalf("Ready = %d, %v: want not ready", state, err)
		}
		return nr.Reason
	}
	if got := reason(); got != "starting: connecting to etcd" {
		t.Errorf("before a failure: %q", got)
	}
	if n, log := st.fail("etcd did not answer in time", 2500*time.Millisecond); n != 1 || !log {
		t.Errorf("first failure: attempt %d, logged %v", n, log)
	}
	if got, want := reason(), "waiting for etcd: etcd did not answer in time; attempt 1, next in 3s"; got != want {
		t.Errorf("waiting: %q, want %q", got, want)
	}
	now = now.Add(3 * time.Second)
	st.set("loading the state from etcd")
	if got, want := reason(), "waiting for etcd: etcd did not answer in time; attempt 1, attempt 2 under way (loading the state from etcd)"; got != want {
		t.Errorf("under way: %q, want %q", got, want)
	}
	for i := 2; i <= 8; i++ {
		if _, log := st.fail("x", time.Second); !log {
			t.Errorf("failure %d not logged", i)
		}
		now = now.Add(5 * time.Second)
	}
	if n, log := st.fail("x", time.Second); n != 9 || log {
		t.Errorf("failure 9 within a minute of the last log: attempt %d, logged %v", n, log)
	}
	now = now.Add(time.Minute)
	if _, log := st.fail("x", time.Second); !log {
		t.Error("a failure a minute after the last log is not logged")
	}
}

// TestPublicCause: the reason shown on the unauthenticated readiness
// endpoints never carries etcd's endpoints, addresses or certificate
// details, whatever the error says.
func TestPublicCause(t *testing.T) {
	secret := "https://10.1.2.3:2379"
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("etcdstore: %w: %s: the server's certificate is not trusted: x509: CN=etcd-internal", etcdstore.ErrTLS, secret), "TLS with etcd failed"},
		{fmt.Errorf("etcdstore: %w (endpoints %s, 3 attempts): dial tcp 10.1.2.3:2379", etcdstore.ErrUnreachable, secret), "no etcd endpoint answered"},
		{fmt.Errorf("%w: joining the instances in etcd: etcdstore: member lease %s: %w", core.ErrUnavailable, secret, context.DeadlineExceeded), "did not answer in time"},
		{fmt.Errorf("load %s: %w", secret, rpctypes.ErrNoLeader), "etcd answered etcdserver: no leader"},
		{fmt.Errorf("rpc error: connection error: dial tcp %s: connection refused", secret), "etcd could not be used"},
	} {
		got := publicCause(tc.err)
		if !strings.Contains(got, tc.want) || strings.Contains(got, "10.1.2.3") || strings.Contains(got, "etcd-internal") {
			t.Errorf("publicCause(%q) = %q, want %q and no detail", tc.err, got, tc.want)
		}
	}
}

// TestTemporaryCertificate: the certificate presented while starting is a
// self-signed leaf that can sign nothing, for the configured names, with a
// new key at every start.
func TestTemporaryCertificate(t *testing.T) {
	a, err := temporaryCertificate([]string{"coordinator.example"}, []net.IP{net.ParseIP("10.0.0.1")}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := temporaryCertificate(nil, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	leaf := a.Leaf
	if leaf.IsCA || !leaf.BasicConstraintsValid || leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0 {
		t.Errorf("the temporary certificate may sign: CA %v, key usage %v", leaf.IsCA, leaf.KeyUsage)
	}
	if err := leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	if err := leaf.VerifyHostname("coordinator.example"); err != nil {
		t.Error(err)
	}
	if err := leaf.VerifyHostname("10.0.0.1"); err != nil {
		t.Error(err)
	}
	if string(a.Leaf.RawSubjectPublicKeyInfo) == string(b.Leaf.RawSubjectPublicKeyInfo) {
		t.Error("two temporary certificates share their key")
	}
}

// TestRunWaitsForEtcd: with store etcd unreachable Run listens at once,
// answers not ready (Client API and metrics) and refuses every other
// request under the temporary certificate; when etcd answers the same Run
// loads the state, applies the startup manifest and serves it; a cancel
// during the wait returns nil promptly.
func TestRunWaitsForEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	proxy := etcdtest.NewProxy(t, strings.TrimPrefix(cluster.Endpoints()[0], "http://"))
	proxy.DropRequests(true)
	manifestFile := filepath.Join(t.TempDir(), "manifest.json")
	if err := os.WriteFile(manifestFile, []byte(peerTestManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"EDG_STARTUP_MANIFEST": manifestFile,
		"QUARRY_STORE":         "etcd", "QUARRY_ETCD_ENDPOINTS": "http://" + proxy.Addr(), "QUARRY_ETCD_PREFIX": "/wait/",
		"QUARRY_INSECURE_PEER_TRUST": "1", "QUARRY_STORE_TIMEOUT": "300ms",
		"EDG_COORDINATOR_PROMETHEUS_ADDR": "127.0.0.1:0",
	}
	run := func(env map[string]string) (*App, *logBuffer, context.CancelFunc, chan error) {
		t.Helper()
		logs := &logBuffer{}
		ctx, cancel := context.WithCancel(context.Background())
		a, err := New(ctx, testConfig(t, env), slog.New(slog.NewJSONHandler(logs, nil)))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		return a, logs, cancel, done
	}
	get := func(url string) (int, string, *x509.Certificate) {
		t.Helper()
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var leaf *x509.Certificate
		if resp.TLS != nil {
			leaf = resp.TLS.PeerCertificates[0]
		}
		return resp.StatusCode, string(body), leaf
	}

	a, logs, cancel, done := run(env)
	defer cancel()
	client := "https://" + logs.addr(t, "client API listening")
	metricsURL := "http://" + logs.addr(t, "metrics listening")
	code, body, leaf := get(client + "/api/v2/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd") || !strings.Contains(leaf.Subject.CommonName, "temporary") {
		t.Fatalf("readyz while waiting: %d %s (certificate %q)", code, body, leaf.Subject)
	}
	if code, body, _ := get(metricsURL + "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd") {
		t.Fatalf("metrics readyz while waiting: %d %s", code, body)
	}
	if code, body, _ := get(client + "/api/v2/quote"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Fatalf("quote while waiting: %d %s", code, body)
	}

	proxy.DropRequests(false)
	proxy.Cut()
	logs.addr(t, "state loaded; serving") // waits for the line
	code, body, leaf = get(client + "/api/v2/status")
	var st struct{ Data struct{ Code int } }
	if json.Unmarshal([]byte(body), &st); code != http.StatusOK || st.Data.Code != int(core.StateAcceptingMarbles) {
		t.Fatalf("status once loaded: %d %s", code, body)
	}
	if !leaf.Equal(a.core.TLSCertificate().Leaf) {
		t.Fatal("the Client API does not present the Coordinator's root once loaded")
	}
	if code, _, _ := get(metricsURL + "/readyz"); code != http.StatusOK {
		t.Fatalf("metrics readyz once loaded: %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}

	// A cancel during the wait: Run returns nil, promptly.
	proxy.DropRequests(true)
	_, logs, cancel, done = run(env)
	logs.addr(t, "client API listening")
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run cancelled while waiting for etcd: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5 s of a cancel while waiting for etcd")
	}
	t.Logf("returned %v after the cancel", time.Since(start))
}
