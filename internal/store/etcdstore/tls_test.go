package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

// TestConformanceTLS runs the suite against a member that serves TLS and
// requires a client certificate, through a client with the CA and one.
func TestConformanceTLS(t *testing.T) {
	cluster := etcdtest.StartTLS(t, 1)
	f := cluster.TLS()
	for _, ep := range cluster.Endpoints() {
		if !strings.HasPrefix(ep, "https://") {
			t.Fatalf("TLS member endpoint %s is not https://", ep)
		}
	}
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		c, err := etcdstore.Connect(t.Context(), etcdstore.Options{
			Endpoints: cluster.Endpoints(), Prefix: fmt.Sprintf("/tls/%d/", n.Add(1)),
			CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
		})
		if err != nil {
			t.Fatalf("Connect over TLS: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return newStore(t, c, "sealed_data")
	})
}

// TestTLSRefused: a client that cannot talk TLS with etcd is refused with
// an error that says why (never a hang): a definite trust failure (a CA
// that did not sign etcd's certificate, a client certificate etcd refuses)
// at once, naming the setting to change; a wrong scheme after the bounded
// connect retry, each retry reporting the TLS cause too.
func TestTLSRefused(t *testing.T) {
	cluster := etcdtest.StartTLS(t, 1)
	f := cluster.TLS()
	ep := cluster.Endpoints()
	other := etcdtest.NewCA(t, t.TempDir(), "other-ca")
	foreignCert, foreignKey := other.Issue(t, "client", false)
	for _, tc := range []struct {
		name      string
		endpoints []string
		ca        string
		cert, key string
		want      []string // in the error
		untrusted bool     // ErrUntrusted: refused at the first attempt
	}{
		{"CA of another authority", ep, other.CertFile, f.CertFile, f.KeyFile,
			[]string{"server's certificate is not trusted", "the etcd CA " + other.CertFile + " did not sign it", "--etcd-ca (QUARRY_ETCD_CA)"}, true},
		{"no CA (system roots)", ep, "", f.CertFile, f.KeyFile,
			[]string{"server's certificate is not trusted", "no etcd CA is set", "--etcd-ca (QUARRY_ETCD_CA)"}, true},
		{"no client certificate", ep, f.CAFile, "", "",
			[]string{"refused the client certificate: none is set", "--etcd-cert and --etcd-key"}, true},
		{"client certificate of another CA", ep, f.CAFile, foreignCert, foreignKey,
			[]string{"refused the client certificate: etcd does not trust it", "--etcd-cert and --etcd-key"}, true},
		{"http:// endpoint on a TLS member", []string{strings.Replace(ep[0], "https://", "http://", 1)}, f.CAFile, f.CertFile, f.KeyFile, []string{"serves TLS; use https://"}, false},
		{"http:// endpoint without TLS options", []string{strings.Replace(ep[0], "https://", "http://", 1)}, "", "", "", []string{"serves TLS; use https://"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The deadline only catches a hang; the retry ends first.
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			var retries []error
			start := time.Now()
			c, err := etcdstore.Connect(ctx, etcdstore.Options{
				Endpoints: tc.endpoints, Prefix: "/refused/",
				CAFile: tc.ca, CertFile: tc.cert, KeyFile: tc.key,
				DialTimeout: 500 * time.Millisecond, ConnectAttempts: 3, Backoff: 50 * time.Millisecond,
				OnRetry: func(_ int, err error, _ time.Duration) { retries = append(retries, err) },
			})
			if err == nil {
				c.Close()
				t.Fatal("Connect succeeded")
			}
			if ctx.Err() != nil {
				t.Fatalf("Connect ran into the test's deadline: %v", err)
			}
			if !errors.Is(err, etcdstore.ErrTLS) || !strings.Contains(err.Error(), tc.endpoints[0]) {
				t.Fatalf("error %q: want ErrTLS, naming the endpoint", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if errors.Is(err, etcdstore.ErrUntrusted) != tc.untrusted {
				t.Errorf("error %q: ErrUntrusted %v, want %v", err, !tc.untrusted, tc.untrusted)
			}
			want, wantRetries := "3 attempts", 2
			if tc.untrusted {
				want, wantRetries = "1 attempt)", 0
			}
			if !strings.Contains(err.Error(), want) || len(retries) != wantRetries {
				t.Errorf("gave up after %d retries (%q), want %s", len(retries), err, want)
			}
			for _, r := range retries {
				if !errors.Is(r, etcdstore.ErrTLS) {
					t.Errorf("retry reported %q, want the TLS cause", r)
				}
			}
			t.Logf("refused after %v: %v", time.Since(start), err)
		})
	}
}

// TestTLSRefusedWithoutAttemptLimit: a Connect that tries until its
// context ends (negative ConnectAttempts) still gives up on a TLS failure
// after TLSAttempts in a row, naming it.
func TestTLSRefusedWithoutAttemptLimit(t *testing.T) {
	cluster := etcdtest.StartTLS(t, 1)
	f := cluster.TLS()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	retries := 0
	c, err := etcdstore.Connect(ctx, etcdstore.Options{
		Endpoints: []string{strings.Replace(cluster.Endpoints()[0], "https://", "http://", 1)}, Prefix: "/refused/",
		CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
		DialTimeout: 300 * time.Millisecond, ConnectAttempts: -1, Backoff: 10 * time.Millisecond,
		OnRetry: func(int, error, time.Duration) { retries++ },
	})
	if err == nil {
		c.Close()
		t.Fatal("Connect succeeded")
	}
	if ctx.Err() != nil {
		t.Fatalf("Connect ran into the test's deadline: %v", err)
	}
	want := fmt.Sprintf("%d attempts", etcdstore.TLSAttempts)
	if !errors.Is(err, etcdstore.ErrTLS) || !strings.Contains(err.Error(), "serves TLS") || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q: want ErrTLS after %s", err, want)
	}
	if retries != etcdstore.TLSAttempts-1 {
		t.Errorf("%d retries, want %d", retries, etcdstore.TLSAttempts-1)
	}
}

// TestUntrustedEndsAtOnce: a Connect that would try until its context
// ends gives up at the first attempt when every endpoint's certificate is
// not signed by the CA (which waiting cannot cure); when only some are
// (another endpoint does not answer, and may yet), it keeps trying.
func TestUntrustedEndsAtOnce(t *testing.T) {
	cluster := etcdtest.StartTLS(t, 1)
	f := cluster.TLS()
	other := etcdtest.NewCA(t, t.TempDir(), "other-ca")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	retries := 0
	start := time.Now()
	c, err := etcdstore.Connect(ctx, etcdstore.Options{
		Endpoints: cluster.Endpoints(), Prefix: "/refused/",
		CAFile: other.CertFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
		ConnectAttempts: -1, OnRetry: func(int, error, time.Duration) { retries++ },
	})
	if err == nil {
		c.Close()
		t.Fatal("Connect succeeded")
	}
	if !errors.Is(err, etcdstore.ErrUntrusted) || !errors.Is(err, etcdstore.ErrTLS) || retries != 0 ||
		!strings.Contains(err.Error(), "--etcd-ca (QUARRY_ETCD_CA)") || !strings.Contains(err.Error(), "1 attempt)") {
		t.Fatalf("error %q after %d retries: want ErrUntrusted at the first attempt, naming --etcd-ca", err, retries)
	}
	t.Logf("refused after %v: %v", time.Since(start), err)

	// One endpoint untrusted, one that does not answer: not definite.
	down := "https://" + closedAddr(t)
	retries = 0
	c, err = etcdstore.Connect(ctx, etcdstore.Options{
		Endpoints: []string{cluster.Endpoints()[0], down}, Prefix: "/refused/",
		CAFile: other.CertFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
		DialTimeout: 300 * time.Millisecond, ConnectAttempts: 3, Backoff: 10 * time.Millisecond,
		OnRetry: func(int, error, time.Duration) { retries++ },
	})
	if err == nil {
		c.Close()
		t.Fatal("Connect succeeded")
	}
	if !errors.Is(err, etcdstore.ErrTLS) || retries != 2 || !strings.Contains(err.Error(), "3 attempts") {
		t.Fatalf("error %q after %d retries: want the TLS cause after 3 attempts", err, retries)
	}
}

// TestTLSFilesRefused: TLS files that cannot be used are refused at once,
// before any attempt to reach etcd.
func TestTLSFilesRefused(t *testing.T) {
	cluster := etcdtest.StartTLS(t, 1)
	f := cluster.TLS()
	other := etcdtest.NewCA(t, t.TempDir(), "other-ca")
	_, otherKey := other.Issue(t, "client", false)
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("this is no certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ca, cert, key, want string
	}{
		{"CA file holds no PEM", notPEM, f.CertFile, f.KeyFile, "holds no PEM certificate"},
		{"CA file is a key", f.KeyFile, f.CertFile, f.KeyFile, "holds no PEM certificate"},
		{"certificate and key do not match", f.CAFile, f.CertFile, otherKey, "private key does not match"},
		{"certificate file holds no PEM", f.CAFile, notPEM, f.KeyFile, "loading the client certificate"},
		{"key without certificate", f.CAFile, "", f.KeyFile, "both or neither"},
		{"missing CA file", filepath.Join(dir, "absent.pem"), f.CertFile, f.KeyFile, "reading the etcd CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			retried := false
			c, err := etcdstore.Connect(t.Context(), etcdstore.Options{
				Endpoints: cluster.Endpoints(), Prefix: "/files/",
				CAFile: tc.ca, CertFile: tc.cert, KeyFile: tc.key,
				OnRetry: func(int, error, time.Duration) { retried = true },
			})
			if err == nil {
				c.Close()
				t.Fatal("Connect succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) || retried {
				t.Fatalf("error %q (retried: %v): want %q without a retry", err, retried, tc.want)
			}
		})
	}
}

// TestHTTPSOnPlainMember: an https:// endpoint on a member without TLS is
// refused saying so.
func TestHTTPSOnPlainMember(t *testing.T) {
	plain := etcdtest.Start(t, 1)
	f := etcdtest.StartTLS(t, 1).TLS()
	ep := strings.Replace(plain.Endpoints()[0], "http://", "https://", 1)
	c, err := etcdstore.Connect(t.Context(), etcdstore.Options{
		Endpoints: []string{ep}, Prefix: "/plain/",
		CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
		DialTimeout: 500 * time.Millisecond, ConnectAttempts: 2, Backoff: 50 * time.Millisecond,
	})
	if err == nil {
		c.Close()
		t.Fatal("Connect succeeded")
	}
	if !errors.Is(err, etcdstore.ErrTLS) || !strings.Contains(err.Error(), "does not speak TLS") {
		t.Fatalf("error %q: want ErrTLS saying the member does not speak TLS", err)
	}
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
