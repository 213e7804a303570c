package core

import (
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// proxiedInstance starts a Coordinator on the shared prefix that reaches
// etcd through a proxy which can lose etcd's replies.
func (e *sharedEnv) proxiedInstance(cluster *etcdtest.Cluster) (*Core, *etcdtest.Proxy) {
	t := e.t
	t.Helper()
	proxy := etcdtest.NewProxy(t, strings.TrimPrefix(cluster.Endpoints()[0], "http://"))
	cli, err := etcdstore.Connect(t.Context(), etcdstore.Options{Endpoints: []string{"http://" + proxy.Addr()}, Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	data, _ := cli.Store("sealed_data")
	key, _ := cli.Store("sealed_key")
	c, err := New(t.Context(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	return c, proxy
}

// TestLostReplyThenAnotherInstanceBuiltOnIt: a's write reaches etcd but
// etcd's reply is lost; b then writes on top of a's state. a must answer
// success (its write is stored, and b's state holds it), not "nothing was
// changed" because the stored state is no longer its own.
func TestLostReplyThenAnotherInstanceBuiltOnIt(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a, proxy := e.proxiedInstance(cluster)
	b := e.instance()
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b)
	// The upload's own reads go through; etcd's answer to its write
	// (the sealed state, several KiB) is lost.
	proxy.DropRepliesAfterRequestOf(4096)
	done := make(chan error, 1)
	go func() { done <- e.upload(a, "uploaded", "from a") }()
	// Wait until a's write is in etcd, then let b write on top of it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mustSync(t, b)
		if e.secret(b, "uploaded") == "from a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a's write never reached etcd")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := e.upload(b, "followup", "from b, after a"); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplies(false)
	proxy.Cut()
	if err := <-done; err != nil {
		t.Fatalf("a's upload, stored and built upon by b, answered %v; want success", err)
	}
	mustSync(t, a)
	if got := e.secret(a, "uploaded"); got != "from a" {
		t.Fatalf("a reads %q", got)
	}
	if got := e.secret(a, "followup"); got != "from b, after a" {
		t.Fatalf("a reads followup %q after syncing", got)
	}
}
