package etcdstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

func rawClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	raw, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}

// TestChunksWithHead: chunks go with the head that references them and
// are deleted with the head that drops them; a reader of the older head
// still finds them at its revision until etcd compacts it.
func TestChunksWithHead(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	c := connect(t, cluster.Endpoints(), "/chunks/")
	data, key := newStore(t, c, "sealed_data"), newStore(t, c, "sealed_key")
	r1, err := data.SaveHead(t.Context(), []byte("head 1"), "", key, []byte("key 1"), "", map[string][]byte{"k.a": []byte("A"), "k.b": []byte("B")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A write of chunks on a stale revision changes nothing.
	if err := data.PutChunks(t.Context(), "1", map[string][]byte{"k.x": []byte("X")}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("PutChunks on a stale revision: %v", err)
	}
	if err := data.PutChunks(t.Context(), r1, map[string][]byte{"k.c": []byte("C")}); err != nil {
		t.Fatal(err)
	}
	r2, err := data.SaveHead(t.Context(), []byte("head 2"), r1, key, []byte("key 2"), r1, nil, []string{"k.a"})
	if err != nil {
		t.Fatal(err)
	}
	names, err := data.ListChunks(t.Context(), "k.")
	if err != nil || strings.Join(names, ",") != "k.b,k.c" {
		t.Fatalf("chunks after the second head: %v, %v", names, err)
	}
	old, err := data.LoadChunks(t.Context(), r1, []string{"k.a", "k.b", "k.x"})
	if err != nil || string(old["k.a"]) != "A" || string(old["k.b"]) != "B" || len(old) != 2 {
		t.Fatalf("chunks at the first head's revision: %q, %v", old, err)
	}
	now, err := data.LoadChunks(t.Context(), r2, []string{"k.a", "k.c"})
	if err != nil || len(now) != 1 || string(now["k.c"]) != "C" {
		t.Fatalf("chunks at the second head's revision: %q, %v", now, err)
	}
	// After a compaction past the first head, its chunks are read as
	// they are now (the deleted one is gone).
	n2, _ := strconvRev(r2)
	if err := c.Compact(t.Context(), n2); err != nil {
		t.Fatal(err)
	}
	if err := c.Compact(t.Context(), n2); err != nil {
		t.Fatalf("a second compaction to the same revision: %v", err)
	}
	old, err = data.LoadChunks(t.Context(), r1, []string{"k.b"})
	if err != nil || len(old) != 1 || string(old["k.b"]) != "B" {
		t.Fatalf("chunks at a compacted revision: %q, %v", old, err)
	}
	// One deleted since: the head read at r1 is outdated, which the
	// caller must learn (a missing chunk would otherwise read as a
	// damaged state).
	if old, err = data.LoadChunks(t.Context(), r1, []string{"k.a", "k.b"}); !errors.Is(err, etcdstore.ErrHistoryGone) {
		t.Fatalf("a chunk deleted behind a compacted revision: %q, %v; want ErrHistoryGone", old, err)
	}
	// A conflicting head writes none of its chunks.
	if _, err := data.SaveHead(t.Context(), []byte("head 3"), r1, key, []byte("key 3"), r2, map[string][]byte{"k.d": []byte("D")}, []string{"k.b"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a head on a stale revision: %v", err)
	}
	if names, _ := data.ListChunks(t.Context(), ""); strings.Join(names, ",") != "k.b,k.c" {
		t.Fatalf("a conflicting head changed the chunks: %v", names)
	}
	for _, bad := range []string{"", "a/b", "a b", strings.Repeat("x", 201)} {
		if _, err := data.LoadChunks(t.Context(), r2, []string{bad}); !errors.Is(err, etcdstore.ErrChunkName) {
			t.Errorf("chunk name %q: %v", bad, err)
		}
	}
	many := make([]string, etcdstore.MaxTxnOps)
	for i := range many {
		many[i] = "k.z" + strings.Repeat("z", i)
	}
	if _, err := data.SaveHead(t.Context(), []byte("head 3"), r2, key, []byte("key 3"), r2, nil, many); err == nil {
		t.Fatal("a head with more operations than MaxTxnOps was sent")
	}
	if n, err := data.Copies(t.Context()); err != nil || n != 0 {
		t.Fatalf("copies: %d, %v", n, err)
	}
	if _, err := data.CopyAside(t.Context(), "kept"); err != nil {
		t.Fatal(err)
	}
	if n, err := data.Copies(t.Context()); err != nil || n != 1 {
		t.Fatalf("copies after CopyAside: %d, %v", n, err)
	}
}

// TestCompactionKeepsRetention: compaction goes up to the newest commit
// older than the retention, never further: the history a lost write's
// read-back needs (FirstWriteAfter from a revision within the retention)
// stays; at most once per interval; two clients compacting is harmless.
func TestCompactionKeepsRetention(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	var mu sync.Mutex
	clock := time.Unix(1000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	done := make(chan int64, 16)
	var failures []error
	open := func(interval time.Duration) (*etcdstore.Store, *etcdstore.Store) {
		c := connect(t, cluster.Endpoints(), "/compact/")
		c.EnableCompaction(etcdstore.CompactionOptions{Retention: time.Minute, Interval: interval, Now: now, Done: func(rev int64, err error) {
			if err != nil {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			}
			done <- rev
		}})
		return newStore(t, c, "sealed_data"), newStore(t, c, "sealed_key")
	}
	data, key := open(10 * time.Minute)
	var revs []store.Revision
	prev, kprev := store.Revision(""), store.Revision("")
	commit := func(d *etcdstore.Store) store.Revision {
		r, err := d.SavePair(t.Context(), []byte("v"+string(rune('a'+len(revs)))), prev, key, []byte("k"), kprev)
		if err != nil {
			t.Fatal(err)
		}
		prev, kprev = r, r
		revs = append(revs, r)
		d.Committed(r)
		return r
	}
	commit(data) // t = 0
	advance(30 * time.Second)
	commit(data) // t = 30 s: nothing older than a minute yet
	select {
	case r := <-done:
		t.Fatalf("compacted to %d before anything was older than the retention", r)
	case <-time.After(100 * time.Millisecond):
	}
	advance(45 * time.Second)
	commit(data) // t = 75 s: the first commit is older than a minute, the second not
	target := <-done
	if n, _ := strconvRev(revs[0]); target != n {
		t.Fatalf("compacted to %d, want the first commit's revision %d", target, n)
	}
	raw := rawClient(t, cluster.Endpoints())
	if _, err := raw.Get(t.Context(), "/compact/sealed_data", clientv3.WithRev(target-1)); err == nil || !strings.Contains(err.Error(), "compacted") {
		t.Fatalf("a read before the compacted revision: %v", err)
	}
	// The read-back of a write based on the second commit still finds
	// the first write after it.
	got, err := data.FirstWriteAfter(t.Context(), revs[1])
	if err != nil || string(got) != "vc" {
		t.Fatalf("FirstWriteAfter within the retention: %q, %v", got, err)
	}
	// Within the interval no second compaction starts.
	advance(2 * time.Minute)
	commit(data)
	select {
	case r := <-done:
		t.Fatalf("compacted again (to %d) within the interval", r)
	case <-time.After(100 * time.Millisecond):
	}
	// Another client compacts further; this one then compacting to an
	// older or the same revision is no error.
	other, _ := open(-1)
	other.Committed(revs[3])
	advance(2 * time.Minute)
	other.Committed(revs[3])
	if r := <-done; r != mustRev(t, revs[3]) {
		t.Fatalf("the other client compacted to %d, want %s", r, revs[3])
	}
	advance(10 * time.Minute)
	commit(data)
	if r := <-done; r != mustRev(t, revs[3]) { // as far as the other one: no error
		t.Fatalf("compacted to %d, want %s", r, revs[3])
	}
	if _, err := data.FirstWriteAfter(t.Context(), revs[0]); !errors.Is(err, etcdstore.ErrHistoryGone) {
		t.Fatalf("FirstWriteAfter behind the compaction: %v, want ErrHistoryGone", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("compactions failed: %v", failures)
	}
}

// TestStatus: every endpoint reports its database size and quota.
func TestStatus(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	c := connect(t, cluster.Endpoints(), "/status/")
	st := c.Status(t.Context())
	if len(st) != 3 {
		t.Fatalf("%d statuses for 3 endpoints", len(st))
	}
	for _, s := range st {
		if s.Err != nil || s.DBSize <= 0 || s.DBSizeInUse <= 0 || s.Quota <= 0 {
			t.Errorf("%+v", s)
		}
	}
	cluster.Stop(2)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	st = c.Status(ctx)
	if st[2].Err == nil {
		t.Errorf("a stopped member answered: %+v", st[2])
	}
}

func mustRev(t *testing.T, r store.Revision) int64 {
	t.Helper()
	n, err := strconvRev(r)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func strconvRev(r store.Revision) (int64, error) {
	var n int64
	for _, ch := range string(r) {
		if ch < '0' || ch > '9' {
			return 0, errors.New("not a revision")
		}
		n = n*10 + int64(ch-'0')
	}
	return n, nil
}
