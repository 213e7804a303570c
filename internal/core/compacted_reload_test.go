package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// hookedChunks is an etcd store whose LoadChunks runs a hook first (once).
type hookedChunks struct {
	*etcdstore.Store
	hook atomic.Pointer[func()]
}

func (h *hookedChunks) LoadChunks(ctx context.Context, at store.Revision, names []string) (map[string][]byte, error) {
	if f := h.hook.Swap(nil); f != nil {
		(*f)()
	}
	return h.Store.LoadChunks(ctx, at, names)
}

// TestReloadBehindCompaction: an instance reads a newer head, and before
// it reads that head's chunks another instance replaces the head twice
// (deleting those chunks) and etcd's history is compacted past it. The
// reload must fail as "store unavailable" (the head is outdated; the next
// sync reads the newest), never take the state for damaged and enter
// recovery mode.
func TestReloadBehindCompaction(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a := e.instance()
	if _, err := a.SetManifest(t.Context(), e.w.manyManifest(200)); err != nil {
		t.Fatal(err)
	}
	data, key := e.stores()
	hooked := &hookedChunks{Store: data}
	b, err := New(t.Context(), Options{Data: hooked, Key: key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	big := func(i int) string { return fmt.Sprintf("value %d %s", i, strings.Repeat(fmt.Sprint(i), 4096)) }
	if err := e.upload(a, "uploaded", big(1)); err != nil {
		t.Fatal(err)
	}
	ran := false
	f := func() {
		ran = true
		for i := 2; i <= 3; i++ {
			if err := e.upload(a, "uploaded", big(i)); err != nil {
				t.Error(err)
			}
		}
		resp, err := raw.Get(context.Background(), e.prefix+"sealed_data")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := raw.Compact(context.Background(), resp.Header.Revision); err != nil {
			t.Error(err)
		}
	}
	hooked.hook.Store(&f)
	err = b.Sync(t.Context())
	if !ran {
		t.Fatal("the reload read no chunk from the store")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Sync with the head's chunks gone behind a compaction: %v, want ErrUnavailable", err)
	}
	if b.Status() == StateRecovery {
		t.Fatal("an outdated head whose chunks a newer head deleted put the instance into recovery mode")
	}
	mustSync(t, b)
	if got := e.secret(b, "uploaded"); got != big(3) {
		t.Fatalf("after the next sync the instance reads %.20q..., want the newest upload", got)
	}
}
