// Package etcdtest starts real etcd servers inside the test process (etcd's
// own embed package) on free loopback ports: one member or a cluster whose
// members a test can stop and start again; StartTLS serves the client URLs
// over TLS with client-certificate authentication.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// MaxRequestBytes is the request limit the test servers accept (above the
// largest blob etcdstore sends).
const MaxRequestBytes = 20 << 20

// Cluster is a running embedded etcd cluster.
type Cluster struct {
	t   testing.TB
	tls *TLSFiles // nil: plain HTTP
	// defaults keeps etcd's own request limit (StartDefaults).
	defaults bool
	mu       sync.Mutex
	members  []*member
}

type member struct {
	name, dir      string
	clientURL      url.URL
	peerURL        url.URL
	initialCluster string
	etcd           *embed.Etcd
	startedOnce    bool
}

// Start starts an n-member cluster and stops it when the test ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, false, false)
}

// StartDefaults is Start with etcd's own default limits, as an operator's
// etcd has them unless told otherwise: --max-request-bytes 1.5 MiB (Start
// raises it to MaxRequestBytes) and --max-txn-ops 128.
func StartDefaults(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, false, true)
}

// StartTLS starts an n-member cluster whose client URLs (https://) serve
// TLS with a throwaway CA's server certificate (for 127.0.0.1 and
// localhost) and accept only clients with a certificate signed by that CA;
// the members talk to each other over plain HTTP. TLS returns the files.
func StartTLS(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, true, false)
}

func start(t testing.TB, n int, withTLS, defaults bool) *Cluster {
	t.Helper()
	c := &Cluster{t: t, defaults: defaults}
	dir := t.TempDir()
	scheme := "http"
	if withTLS {
		pki := filepath.Join(dir, "pki")
		if err := os.Mkdir(pki, 0o700); err != nil {
			t.Fatal(err)
		}
		c.tls, scheme = newTLSFiles(t, pki), "https"
	}
	var peers []string
	for i := range n {
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       filepath.Join(dir, fmt.Sprintf("m%d", i)),
			clientURL: url.URL{Scheme: scheme, Host: freeAddr(t)},
			peerURL:   url.URL{Scheme: "http", Host: freeAddr(t)},
		}
		peers = append(peers, m.name+"="+m.peerURL.String())
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.initialCluster = strings.Join(peers, ",")
	}
	errs := make(chan error, n)
	for i := range c.members {
		go func() { errs <- c.start(i) }()
	}
	for range n {
		if err := <-errs; err != nil {
			c.Close()
			t.Fatalf("etcdtest: %v", err)
		}
	}
	t.Cleanup(c.Close)
	return c
}

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (c *Cluster) start(i int) error {
	c.mu.Lock()
	m := c.members[i]
	c.mu.Unlock()
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = m.initialCluster
	if c.tls != nil {
		cfg.ClientTLSInfo.CertFile = c.tls.ServerCertFile
		cfg.ClientTLSInfo.KeyFile = c.tls.ServerKeyFile
		cfg.ClientTLSInfo.TrustedCAFile = c.tls.CAFile
		cfg.ClientTLSInfo.ClientCertAuth = true
	}
	cfg.InitialClusterToken = "etcdtest"
	if m.startedOnce {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	if !c.defaults {
		cfg.MaxRequestBytes = MaxRequestBytes
	}
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("starting member %s: %w", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("member %s: %w", m.name, err)
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("member %s did not become ready within 60 s", m.name)
	}
	c.mu.Lock()
	m.etcd, m.startedOnce = e, true
	c.mu.Unlock()
	return nil
}

// Endpoints returns the client URLs of all members (running or not).
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL.String())
	}
	return eps
}

// TLS returns the CA and client certificate files of a StartTLS cluster
// (nil for Start).
func (c *Cluster) TLS() *TLSFiles { return c.tls }

// Size returns the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Stop stops member i (its data stays for Restart).
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	e := c.members[i].etcd
	c.members[i].etcd = nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Running reports whether member i runs.
func (c *Cluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].etcd != nil
}

// Restart starts a stopped member i again with its data. A member of a
// multi-member cluster becomes ready only when it reaches a quorum.
func (c *Cluster) Restart(i int) error {
	if c.Running(i) {
		return nil
	}
	return c.start(i)
}

// Close stops every member.
func (c *Cluster) Close() {
	for i := range c.members {
		c.Stop(i)
	}
}
