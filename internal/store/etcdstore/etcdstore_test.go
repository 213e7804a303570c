package etcdstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

// connect opens a client on endpoints under prefix, closed when the test
// ends.
func connect(t *testing.T, endpoints []string, prefix string) *etcdstore.Client {
	t.Helper()
	c, err := etcdstore.Connect(t.Context(), etcdstore.Options{Endpoints: endpoints, Prefix: prefix, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newStore(t *testing.T, c *etcdstore.Client, name string) *etcdstore.Store {
	t.Helper()
	s, err := c.Store(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		// A fresh prefix per subtest: an empty store on the shared etcd.
		c := connect(t, cluster.Endpoints(), fmt.Sprintf("/conformance/%d/", n.Add(1)))
		return newStore(t, c, "sealed_data")
	})
}

// TestConformanceCluster runs the suite against a three-member cluster
// through a client that knows every member.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member etcd cluster")
	}
	cluster := etcdtest.Start(t, 3)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		c := connect(t, cluster.Endpoints(), fmt.Sprintf("/cluster/%d/", n.Add(1)))
		return newStore(t, c, "sealed_data")
	})
}

// TestPrefixesAreSeparate: two deployments on one etcd never see each
// other's blobs.
func TestPrefixesAreSeparate(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	a := newStore(t, connect(t, cluster.Endpoints(), "/a/"), "sealed_data")
	b := newStore(t, connect(t, cluster.Endpoints(), "/b/"), "sealed_data")
	if _, err := a.Save(t.Context(), []byte("a's state"), ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Load(t.Context()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Load under another prefix: %v, want ErrNotFound", err)
	}
	if a.Key() != "/a/sealed_data" {
		t.Errorf("key = %q", a.Key())
	}
}

func TestBadNames(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	c := connect(t, cluster.Endpoints(), "/x/")
	for _, name := range []string{"", "a/b", "nul\x00"} {
		if _, err := c.Store(name); err == nil {
			t.Errorf("Store(%q) succeeded", name)
		}
	}
}

func TestPair(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	c := connect(t, cluster.Endpoints(), "/pair/")
	data, key := newStore(t, c, "sealed_data"), newStore(t, c, "sealed_key")
	ctx := t.Context()

	rev, err := data.SavePair(ctx, []byte("d1"), "", key, []byte("k1"), "")
	if err != nil {
		t.Fatal(err)
	}
	d, dr, k, kr, err := data.LoadPair(ctx, key)
	if err != nil || string(d) != "d1" || string(k) != "k1" || dr != rev || kr != rev {
		t.Fatalf("LoadPair = %q %q %q %q %v; want d1 %q k1 %q", d, dr, k, kr, err, rev, rev)
	}
	// A stale revision on either side changes neither.
	for _, tc := range []struct{ dp, kp store.Revision }{{"", rev}, {rev, ""}, {rev, "1"}, {"garbage", rev}} {
		if _, err := data.SavePair(ctx, []byte("d2"), tc.dp, key, []byte("k2"), tc.kp); !errors.Is(err, store.ErrConflict) {
			t.Errorf("SavePair(%q, %q): %v, want ErrConflict", tc.dp, tc.kp, err)
		}
	}
	if d, _, k, _, _ := data.LoadPair(ctx, key); string(d) != "d1" || string(k) != "k1" {
		t.Fatalf("after conflicts: %q %q", d, k)
	}
	// One side changed alone: the pair's old revisions conflict.
	r2, err := key.Save(ctx, []byte("k1b"), rev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := data.SavePair(ctx, []byte("d2"), rev, key, []byte("k2"), rev); !errors.Is(err, store.ErrConflict) {
		t.Errorf("SavePair with a stale key revision: %v", err)
	}
	r3, err := data.SavePair(ctx, []byte("d2"), rev, key, []byte("k2"), r2)
	if err != nil {
		t.Fatal(err)
	}
	dr, kr, err = data.Revisions(ctx, key)
	if err != nil || dr != r3 || kr != r3 {
		t.Fatalf("Revisions = %q %q %v, want %q twice", dr, kr, err, r3)
	}
	// Absent keys read as nil and the empty revision.
	other := newStore(t, c, "other")
	if d, dr, o, or, err := data.LoadPair(ctx, other); err != nil || string(d) != "d2" || o != nil || or != "" || dr != r3 {
		t.Fatalf("LoadPair with an absent key = %q %q %q %q %v", d, dr, o, or, err)
	}
	// A store of another client cannot pair.
	c2 := connect(t, cluster.Endpoints(), "/pair/")
	if _, err := data.SavePair(ctx, nil, r3, newStore(t, c2, "sealed_key"), nil, r3); !errors.Is(err, etcdstore.ErrOtherClient) {
		t.Errorf("SavePair across clients: %v", err)
	}
	if _, err := data.SavePair(ctx, nil, r3, data, nil, r3); err == nil {
		t.Error("SavePair with itself succeeded")
	}
}

func TestChangesFollowsOtherWriters(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	a := newStore(t, connect(t, cluster.Endpoints(), "/w/"), "sealed_data")
	b := newStore(t, connect(t, cluster.Endpoints(), "/w/"), "sealed_data")
	ch := a.Changes(t.Context())
	time.Sleep(100 * time.Millisecond) // let the watch start
	if _, err := b.Save(t.Context(), []byte("from b"), ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no change signalled within 10 s")
	}
}

// TestUnreachableAtStart: Connect retries with growing waits and then fails
// naming the endpoints.
func TestUnreachableAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	var waits []time.Duration
	start := time.Now()
	_, err = etcdstore.Connect(t.Context(), etcdstore.Options{
		Endpoints: []string{endpoint}, Prefix: "/q/",
		DialTimeout: 300 * time.Millisecond, ConnectAttempts: 4, Backoff: 50 * time.Millisecond,
		OnRetry: func(_ int, _ error, wait time.Duration) { waits = append(waits, wait) },
	})
	if !errors.Is(err, etcdstore.ErrUnreachable) {
		t.Fatalf("Connect to nothing: %v, want ErrUnreachable", err)
	}
	if !strings.Contains(err.Error(), endpoint) || !strings.Contains(err.Error(), "4 attempts") {
		t.Errorf("error %q does not name the endpoint and the attempts", err)
	}
	want := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}
	if fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Errorf("waits = %v, want %v", waits, want)
	}
	t.Logf("gave up after %v", time.Since(start))
}

// TestConnectWithoutAttemptLimit: with a negative ConnectAttempts an
// unreachable etcd is tried past the default 8 attempts, with growing
// waits, until the context ends.
func TestConnectWithoutAttemptLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var waits []time.Duration
	_, err = etcdstore.Connect(ctx, etcdstore.Options{
		Endpoints: []string{endpoint}, Prefix: "/q/",
		DialTimeout: 50 * time.Millisecond, ConnectAttempts: -1, Backoff: time.Millisecond,
		OnRetry: func(attempt int, _ error, wait time.Duration) {
			waits = append(waits, wait)
			if attempt == 12 {
				cancel()
			}
		},
	})
	if !errors.Is(err, etcdstore.ErrUnreachable) || !strings.Contains(err.Error(), endpoint) {
		t.Fatalf("Connect cancelled after 12 attempts: %v, want ErrUnreachable naming the endpoint", err)
	}
	if len(waits) != 12 || waits[0] != time.Millisecond || waits[11] != 2048*time.Millisecond {
		t.Errorf("waits = %v, want 12 doubling from 1ms", waits)
	}
}

// TestConnectWaitsForLateEtcd: etcd that comes up during the retries is
// used.
func TestConnectWaitsForLateEtcd(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	proxy := etcdtest.NewProxy(t, strings.TrimPrefix(cluster.Endpoints()[0], "http://"))
	proxy.DropRequests(true)
	retried := make(chan struct{}, 16)
	c, err := etcdstore.Connect(t.Context(), etcdstore.Options{
		Endpoints: []string{"http://" + proxy.Addr()}, Prefix: "/late/",
		DialTimeout: 300 * time.Millisecond, ConnectAttempts: 20, Backoff: 50 * time.Millisecond,
		OnRetry: func(attempt int, _ error, _ time.Duration) {
			if attempt == 2 {
				proxy.DropRequests(false)
				proxy.Cut()
			}
			retried <- struct{}{}
		},
	})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	c.Close()
	if len(retried) < 2 {
		t.Errorf("connected after %d retries, want at least 2", len(retried))
	}
}

func TestConfigErrors(t *testing.T) {
	ctx := t.Context()
	for name, opts := range map[string]etcdstore.Options{
		"no endpoints":     {},
		"missing CA":       {Endpoints: []string{"https://127.0.0.1:1"}, CAFile: "/nonexistent/ca.pem"},
		"cert without key": {Endpoints: []string{"https://127.0.0.1:1"}, CertFile: "/nonexistent/c.pem"},
	} {
		if _, err := etcdstore.Connect(ctx, opts); err == nil {
			t.Errorf("%s: Connect succeeded", name)
		}
	}
}

// lostWrite sets up a store reached through a proxy.
func lostWrite(t *testing.T) (*etcdstore.Store, *etcdstore.Store, *etcdtest.Proxy) {
	cluster := etcdtest.Start(t, 1)
	proxy := etcdtest.NewProxy(t, strings.TrimPrefix(cluster.Endpoints()[0], "http://"))
	viaProxy := newStore(t, connect(t, []string{"http://" + proxy.Addr()}, "/lost/"), "sealed_data")
	direct := newStore(t, connect(t, cluster.Endpoints(), "/lost/"), "sealed_data")
	return viaProxy, direct, proxy
}

// TestLostDuringWriteLanded: etcd applies the write, the answer is lost.
// The client gets an error; the revision tells that the write happened,
// and the same Save repeated conflicts instead of applying twice.
func TestLostDuringWriteLanded(t *testing.T) {
	s, direct, proxy := lostWrite(t)
	rev1, err := s.Save(t.Context(), []byte("one"), "")
	if err != nil {
		t.Fatal(err)
	}
	proxy.DropReplies(true)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	_, err = s.Save(ctx, []byte("two"), rev1)
	cancel()
	if err == nil || errors.Is(err, store.ErrConflict) {
		t.Fatalf("Save with the answer lost: %v, want an error other than a conflict", err)
	}
	blob, rev2, err := direct.Load(t.Context())
	if err != nil || string(blob) != "two" || rev2 == rev1 {
		t.Fatalf("stored = %q %q %v; the write reached etcd, want two at a new revision", blob, rev2, err)
	}
	proxy.DropReplies(false)
	proxy.Cut()
	// The retry through the healed connection is safe: it conflicts.
	if _, err := retrySave(t, s, []byte("two"), rev1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("retried Save: %v, want ErrConflict (the first one landed)", err)
	}
	if blob, rev, _ := direct.Load(t.Context()); string(blob) != "two" || rev != rev2 {
		t.Fatalf("after the retry: %q %q, want two at %q (not applied twice)", blob, rev, rev2)
	}
}

// TestLostDuringWriteNotLanded: the request never reaches etcd; the client
// gets an error, nothing changed, the retry succeeds.
func TestLostDuringWriteNotLanded(t *testing.T) {
	s, direct, proxy := lostWrite(t)
	rev1, err := s.Save(t.Context(), []byte("one"), "")
	if err != nil {
		t.Fatal(err)
	}
	proxy.DropRequests(true)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	_, err = s.Save(ctx, []byte("two"), rev1)
	cancel()
	if err == nil || errors.Is(err, store.ErrConflict) {
		t.Fatalf("Save with the request lost: %v, want an error other than a conflict", err)
	}
	if blob, rev, err := direct.Load(t.Context()); err != nil || string(blob) != "one" || rev != rev1 {
		t.Fatalf("stored = %q %q %v; want one at %q (the write never arrived)", blob, rev, err, rev1)
	}
	proxy.DropRequests(false)
	proxy.Cut()
	rev2, err := retrySave(t, s, []byte("two"), rev1)
	if err != nil {
		t.Fatalf("retried Save: %v", err)
	}
	if blob, rev, _ := direct.Load(t.Context()); !bytes.Equal(blob, []byte("two")) || rev != rev2 {
		t.Fatalf("after the retry: %q %q", blob, rev)
	}
}

// retrySave repeats Save while the client reconnects (errors other than a
// conflict), for at most 20 s.
func retrySave(t *testing.T, s *etcdstore.Store, blob []byte, prev store.Revision) (store.Revision, error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		rev, err := s.Save(ctx, blob, prev)
		cancel()
		if err == nil || errors.Is(err, store.ErrConflict) || time.Now().After(deadline) {
			return rev, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestBlobTooLarge(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	s := newStore(t, connect(t, cluster.Endpoints(), "/big/"), "sealed_data")
	if _, err := s.Save(t.Context(), make([]byte, etcdstore.MaxBlobBytes+1), ""); err == nil {
		t.Fatal("Save of a blob over MaxBlobBytes succeeded")
	}
	if _, _, err := s.Load(t.Context()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Load: %v, want ErrNotFound", err)
	}
}

// TestFirstWriteAfter: etcd's history names the write that landed on a
// revision, even after later writes replaced it; nothing written since is
// ErrNotFound; compacted history is ErrHistoryGone.
func TestFirstWriteAfter(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := connect(t, cluster.Endpoints(), "/history/")
	s := newStore(t, cli, "sealed_data")
	rev1, err := s.Save(t.Context(), []byte("one"), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.FirstWriteAfter(t.Context(), rev1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("nothing written since: %v, want ErrNotFound", err)
	}
	rev2, err := s.Save(t.Context(), []byte("two"), rev1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(t.Context(), []byte("three"), rev2); err != nil {
		t.Fatal(err)
	}
	got, err := s.FirstWriteAfter(t.Context(), rev1)
	if err != nil || string(got) != "two" {
		t.Fatalf("first write after %s = %q, %v; want two", rev1, got, err)
	}
	// Compact past rev2: the history is gone.
	raw, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	n, _ := strconv.ParseInt(string(rev2), 10, 64)
	if _, err := raw.Compact(t.Context(), n+1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FirstWriteAfter(t.Context(), rev1); !errors.Is(err, etcdstore.ErrHistoryGone) {
		t.Fatalf("after compaction: %v, want ErrHistoryGone", err)
	}
}
