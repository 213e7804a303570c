package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/quarry-cc/quarry/internal/vault"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

var (
	_ vault.ChunkStore        = (*etcdstore.Store)(nil)
	_ vault.CommittedNotifier = (*etcdstore.Store)(nil)
)

// TestSharedUploadWritesLittle: one 1 KiB secret upload into a state of
// 1,000 secrets sends at most 64 KiB to etcd (before: the whole sealed
// state, about 370 KB), and another instance reads it.
func TestSharedUploadWritesLittle(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a, p := proxiedInstance(t, cluster, e.prefix)
	if _, err := a.SetManifest(t.Context(), e.w.manyManifest(1000)); err != nil {
		t.Fatal(err)
	}
	if size := a.SealedStateSize(); size < 256<<10 {
		t.Fatalf("the state is only %d bytes: the test needs a large one", size)
	}
	value := []byte(strings.Repeat("v", 1024))
	for i := range 3 {
		value[0] = byte('a' + i)
		before, _ := p.Bytes()
		if err := e.upload(a, "uploaded", string(value)); err != nil {
			t.Fatal(err)
		}
		after, _ := p.Bytes()
		t.Logf("upload %d sent %d bytes to etcd (state %d bytes)", i, after-before, a.SealedStateSize())
		if after-before > 64<<10 {
			t.Fatalf("one 1 KiB upload sent %d bytes to etcd, want at most 64 KiB", after-before)
		}
	}
	b := e.instance()
	if got := e.secret(b, "uploaded"); got != string(value) {
		t.Fatal("another instance does not read the upload")
	}
	// A follower reloads only what changed, and still reads right.
	if err := e.upload(a, "uploaded", "last"); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b)
	if got := e.secret(b, "uploaded"); got != "last" {
		t.Fatalf("the follower reads %q", got)
	}
}

// limitsManifest is a manifest at the Coordinator's default limits: the
// default most secrets and, with a Marble's file, just under the default
// largest manifest (8 MiB).
func (w *faultWorld) limitsManifest(t *testing.T) []byte {
	var doc map[string]any
	if err := json.Unmarshal(w.manyManifest(secrets.DefaultMaxSecrets-4), &doc); err != nil {
		t.Fatal(err)
	}
	doc["Marbles"].(map[string]any)["m"].(map[string]any)["Parameters"] = map[string]any{"Files": map[string]any{"/big": ""}}
	raw, _ := json.Marshal(doc)
	// Random text: a file that repeats itself would be stored once.
	pad := make([]byte, (8<<20-len(raw)-1024)/2)
	if _, err := rand.Read(pad); err != nil {
		t.Fatal(err)
	}
	doc["Marbles"].(map[string]any)["m"].(map[string]any)["Parameters"] = map[string]any{"Files": map[string]any{"/big": hex.EncodeToString(pad)}}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestSharedStateAtLimitsOnDefaultEtcd: a state at the Coordinator's
// limits (the most secrets, the largest manifest, 20,000 monotonic
// counters) commits on an etcd with its default request limit (1.5 MiB;
// the whole sealed state was one request before, refused by etcd as too
// large), another instance opens it, and a change on top of it commits.
func TestSharedStateAtLimitsOnDefaultEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a state of about 20 MB")
	}
	t.Parallel() // its own etcd
	cluster := etcdtest.StartDefaults(t, 1)
	e := newSharedEnv(t, cluster)
	a := e.instance()
	if _, err := a.SetManifest(t.Context(), e.w.limitsManifest(t)); err != nil {
		t.Fatalf("a manifest at the limits on an etcd with default settings: %v", err)
	}
	// 20,000 counters (20 Marbles at the per-Marble limit), put into the
	// state directly.
	a.mu.Lock()
	s := a.snap.Load()
	st := *s.persisted
	st.MonotonicCounters = map[string]uint64{}
	for i := range 20_000 {
		id := MarbleIdentity{MarbleType: "m"}
		id.UUID[0], id.UUID[1] = byte(i/DefaultMaxCountersPerMarble), byte(i/DefaultMaxCountersPerMarble>>8)
		st.MonotonicCounters[counterKey(id, fmt.Sprintf("counter-%d", i))] = uint64(i)
	}
	err := a.persist(t.Context(), s, &st)
	a.mu.Unlock()
	if err != nil {
		t.Fatalf("20,000 counters: %v", err)
	}
	if size := a.SealedStateSize(); size < 3<<20 {
		t.Fatalf("the state is only %d bytes; the test needs one far above etcd's request limit", size)
	}
	t.Logf("state at the limits: %d bytes", a.SealedStateSize())
	if err := e.upload(a, "uploaded", "on top"); err != nil {
		t.Fatal(err)
	}
	b := e.instance()
	if got := e.secret(b, "uploaded"); got != "on top" {
		t.Fatalf("another instance reads %q", got)
	}
	if n := len(b.snap.Load().persisted.MonotonicCounters); n != 20_000 {
		t.Fatalf("another instance reads %d counters", n)
	}
	if n := len(b.snap.Load().persisted.Secrets); n != secrets.DefaultMaxSecrets {
		t.Fatalf("another instance reads %d secrets", n)
	}
}

// TestStateLimitRefused: a change that would take the state beyond
// MaxStateBytes is refused with ErrTooLarge naming the setting; nothing
// changes.
func TestStateLimitRefused(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	data, key := e.stores()
	c, err := New(t.Context(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}, MaxStateBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	if err := e.upload(c, "uploaded", "small"); err != nil {
		t.Fatal(err)
	}
	err = e.upload(c, "uploaded", strings.Repeat("x", 300<<10))
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "QUARRY_MAX_STATE_SIZE") || !strings.Contains(err.Error(), "262144") {
		t.Fatalf("an upload beyond the state limit: %v; want ErrTooLarge naming the limit", err)
	}
	if got := e.secret(c, "uploaded"); got != "small" {
		t.Fatalf("after the refusal the secret is %q", got)
	}
	if got := e.secret(e.instance(), "uploaded"); got != "small" {
		t.Fatalf("after the refusal the stored secret is %q", got)
	}
}

// TestSharedHistoryCompacted: with compaction on, etcd's history behind
// the commits is compacted (a read at an old revision fails), and the
// database stops growing: after defragmentation it is no larger after
// many more commits. Two instances compact concurrently without harm.
func TestSharedHistoryCompacted(t *testing.T) {
	t.Parallel() // its own etcd
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	var failures []error
	instance := func() (*Core, *etcdstore.Client) {
		cli, err := etcdstore.Connect(t.Context(), etcdstore.Options{Endpoints: cluster.Endpoints(), Prefix: e.prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		cli.EnableCompaction(etcdstore.CompactionOptions{Retention: 50 * time.Millisecond, Interval: -1, Done: func(_ int64, err error) {
			if err != nil {
				failures = append(failures, err)
			}
		}})
		data, _ := cli.Store("sealed_data")
		key, _ := cli.Store("sealed_key")
		c, err := New(t.Context(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
		if err != nil {
			t.Fatal(err)
		}
		return c, cli
	}
	a, _ := instance()
	b, _ := instance()
	if _, err := a.SetManifest(t.Context(), e.w.manyManifest(200)); err != nil {
		t.Fatal(err)
	}
	raw, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	first, err := raw.Get(t.Context(), e.prefix+"sealed_data")
	if err != nil {
		t.Fatal(err)
	}
	firstRev := first.Kvs[0].ModRevision
	write := func(n int) {
		for i := range n {
			c := []*Core{a, b}[i%2]
			if err := e.upload(c, "uploaded", fmt.Sprintf("value %d %s", i, strings.Repeat("v", 2048))); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // the last compaction runs in the background
	}
	dbSize := func() int64 {
		ep := cluster.Endpoints()[0]
		if _, err := raw.Defragment(t.Context(), ep); err != nil {
			t.Fatal(err)
		}
		st, err := raw.Status(t.Context(), ep)
		if err != nil {
			t.Fatal(err)
		}
		return st.DbSize
	}
	write(40)
	if _, err := raw.Get(t.Context(), e.prefix+"sealed_data", clientv3.WithRev(firstRev)); err == nil || !strings.Contains(err.Error(), "compacted") {
		t.Fatalf("a read at the manifest's revision after 40 commits: %v; want the history compacted", err)
	}
	size1 := dbSize()
	write(120)
	size2 := dbSize()
	t.Logf("etcd database after 40 commits %d bytes, after 160 %d bytes (compacted and defragmented)", size1, size2)
	// Without compaction each commit here adds more than 10 KB of history.
	if size2 > size1+256<<10 || size2 > 4<<20 {
		t.Fatalf("etcd's database grew from %d to %d bytes over 120 commits: not bounded", size1, size2)
	}
	if len(failures) > 0 {
		t.Fatalf("compactions failed: %v", failures)
	}
	// Both read the last write.
	mustSync(t, a)
	mustSync(t, b)
	if !strings.HasPrefix(e.secret(a, "uploaded"), "value 119 ") || !strings.HasPrefix(e.secret(b, "uploaded"), "value 119 ") {
		t.Fatal("the instances do not read the last write")
	}
}

// singleBlobStore hides the chunk capability: the instance on it writes
// the state as one blob, as versions before the chunked layout did.
type singleBlobStore struct {
	vault.SharedStore
	vault.HistoryStore
	vault.ChangeNotifier
	*etcdstore.Store
}

func (s singleBlobStore) Load(ctx context.Context) ([]byte, store.Revision, error) {
	return s.Store.Load(ctx)
}

func (s singleBlobStore) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	return s.Store.Save(ctx, blob, prev)
}

// TestSharedSingleBlobStateConverted: a state stored as one blob (before
// the chunked layout) is read, and the next commit stores it as a head
// and chunks that every instance reads.
func TestSharedSingleBlobStateConverted(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	data, key := e.stores()
	old, err := New(t.Context(), Options{Data: singleBlobStore{data, data, data, data}, Key: key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	if err := e.upload(old, "uploaded", "single blob"); err != nil {
		t.Fatal(err)
	}
	if names, _ := data.ListChunks(t.Context(), ""); len(names) != 0 {
		t.Fatalf("the single-blob instance wrote chunks: %v", names)
	}
	a := e.instance()
	if got := e.secret(a, "uploaded"); got != "single blob" {
		t.Fatalf("the single-blob state reads %q", got)
	}
	if err := e.upload(a, "followup", "converted"); err != nil {
		t.Fatal(err)
	}
	if names, _ := data.ListChunks(t.Context(), ""); len(names) == 0 {
		t.Fatal("the commit after a single-blob state wrote no chunks")
	}
	blob, _, err := data.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, plain, err := seal.Open(a.dek, blob); err != nil || !vault.IsChunkedHead(plain) {
		t.Fatalf("sealed_data after the commit is not a head (%v)", err)
	}
	b := e.instance()
	if e.secret(b, "uploaded") != "single blob" || e.secret(b, "followup") != "converted" {
		t.Fatal("another instance does not read the converted state")
	}
}

// TestSharedDamagedChunks: a chunk that is missing, replaced by another
// chunk, or altered puts a new instance into recovery mode naming the
// chunk, and nothing is overwritten; with the chunk back it opens again.
// Chunks no head references are deleted by a later commit.
func TestSharedDamagedChunks(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a := e.instance()
	if _, err := a.SetManifest(t.Context(), e.w.manyManifest(100)); err != nil {
		t.Fatal(err)
	}
	raw, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	resp, err := raw.Get(t.Context(), e.prefix+"chunks/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) < 2 {
		t.Fatalf("chunks: %v, %v", resp, err)
	}
	victim, other := string(resp.Kvs[0].Key), resp.Kvs[1].Value
	good := resp.Kvs[0].Value
	altered := append([]byte{}, good...)
	altered[len(altered)-1] ^= 1
	for _, tc := range []struct {
		name   string
		damage func() error
	}{
		{"missing", func() error { _, err := raw.Delete(t.Context(), victim); return err }},
		{"another chunk under its name", func() error { _, err := raw.Put(t.Context(), victim, string(other)); return err }},
		{"altered", func() error { _, err := raw.Put(t.Context(), victim, string(altered)); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.damage(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if _, err := raw.Put(t.Context(), victim, string(good)); err != nil {
					t.Fatal(err)
				}
			}()
			// Until etcd compacts its history, a reader finds the chunks
			// as they were at the head's revision.
			now, _ := raw.Get(t.Context(), e.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if _, err := raw.Compact(t.Context(), now.Header.Revision); err != nil {
				t.Fatal(err)
			}
			before, _ := raw.Get(t.Context(), e.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			var logs bytes.Buffer
			data, key := e.stores()
			c, err := New(t.Context(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if c.Status() != StateRecovery {
				t.Fatalf("a damaged chunk: state %d, want recovery mode", c.Status())
			}
			if !strings.Contains(logs.String(), "a chunk of the sealed state in etcd is missing or damaged") || !strings.Contains(logs.String(), victim[len(e.prefix+"chunks/"):]) {
				t.Errorf("recovery mode without naming the chunk:\n%s", logs.String())
			}
			after, _ := raw.Get(t.Context(), e.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if after.Header.Revision != before.Header.Revision {
				t.Fatal("an instance in recovery mode wrote to etcd")
			}
			if _, err := raw.Put(t.Context(), victim, string(good)); err != nil {
				t.Fatal(err)
			}
			if c := e.instance(); c.Status() != StateAcceptingMarbles {
				t.Fatalf("with the chunk back: state %d", c.Status())
			}
		})
	}
	// A stray chunk of this data key, which no head references (a commit
	// that stopped after writing its chunks), goes with a later commit of
	// an instance (its first commit looks for such chunks).
	stray := victim[:strings.LastIndex(victim, ".")] + "." + strings.Repeat("0", 64)
	if _, err := raw.Put(t.Context(), stray, "stray"); err != nil {
		t.Fatal(err)
	}
	b := e.instance()
	if err := e.upload(b, "uploaded", "x"); err != nil {
		t.Fatal(err)
	}
	if r, _ := raw.Get(t.Context(), stray); len(r.Kvs) != 0 {
		t.Fatal("a chunk no head references was not deleted")
	}
	if got := e.secret(e.instance(), "uploaded"); got != "x" {
		t.Fatalf("after the sweep a new instance reads %q", got)
	}
}
