package core

import (
	"errors"
	"testing"

	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// TestCheckStoreOnEtcdReadsNoBlobs: readiness probes on a shared store read
// the revisions only: what etcd sends back for a probe is far smaller than
// the sealed state (300 probes used to pull the whole state 300 times);
// a state missing from etcd still fails the check.
func TestCheckStoreOnEtcdReadsNoBlobs(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	c, proxy := e.proxiedInstance(cluster)
	if _, err := c.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	direct, _ := e.stores()
	blob, _, err := direct.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	const probes = 50
	_, before := proxy.Bytes()
	for range probes {
		if err := c.CheckStore(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	_, after := proxy.Bytes()
	perProbe := (after - before) / probes
	t.Logf("a probe reads %d bytes from etcd; the sealed state is %d bytes", perProbe, len(blob))
	if perProbe > int64(len(blob))/4 {
		t.Fatalf("a readiness probe reads %d bytes from etcd, the sealed state is %d: it loads the blobs", perProbe, len(blob))
	}

	// The state deleted behind the Coordinator's back fails the check.
	if _, err := direct.MoveAside(t.Context(), "gone"); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckStore(t.Context()); !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("CheckStore with the state gone = %v, want ErrStoreUnavailable", err)
	}
}
