package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/quarry-cc/quarry/internal/vault"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// sharedEnv is one etcd prefix that several Coordinator instances share.
type sharedEnv struct {
	t         *testing.T
	endpoints []string
	prefix    string
	w         *faultWorld
}

var sharedPrefixes atomic.Int64

func newSharedEnv(t *testing.T, cluster *etcdtest.Cluster) *sharedEnv {
	return &sharedEnv{t: t, endpoints: cluster.Endpoints(), prefix: fmt.Sprintf("/core/%d/", sharedPrefixes.Add(1)),
		w: &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second")}}
}

// stores opens the pair of stores an instance uses.
func (e *sharedEnv) stores() (*etcdstore.Store, *etcdstore.Store) {
	t := e.t
	t.Helper()
	cli, err := etcdstore.Connect(t.Context(), etcdstore.Options{Endpoints: e.endpoints, Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	data, err := cli.Store("sealed_data")
	if err != nil {
		t.Fatal(err)
	}
	key, err := cli.Store("sealed_key")
	if err != nil {
		t.Fatal(err)
	}
	return data, key
}

// instance starts a Coordinator on the shared prefix.
func (e *sharedEnv) instance() *Core {
	e.t.Helper()
	return e.instanceWrapped(func(s store.Store) store.Store { return s })
}

// instanceWrapped is instance with the data store wrapped by wrap.
func (e *sharedEnv) instanceWrapped(wrap func(store.Store) store.Store) *Core {
	e.t.Helper()
	data, key := e.stores()
	c, err := New(e.t.Context(), Options{Data: wrap(data), Key: key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		e.t.Fatal(err)
	}
	if !c.Shared() {
		e.t.Fatal("a Coordinator on etcd does not know its state is shared")
	}
	return c
}

func (e *sharedEnv) upload(c *Core, name, value string) error {
	return c.SetSecrets(e.t.Context(), e.w.admin.peer(), map[string]secrets.Upload{name: {Key: []byte(value)}})
}

func (e *sharedEnv) secret(c *Core, name string) string {
	e.t.Helper()
	got, err := c.Secrets(e.t.Context(), e.w.admin.peer(), []string{name})
	if err != nil {
		e.t.Fatal(err)
	}
	return string(got[name].Private)
}

func mustSync(t *testing.T, c *Core) {
	t.Helper()
	if err := c.Sync(t.Context()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

func TestSharedInstancesFollowEachOther(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a, b := e.instance(), e.instance()
	if a.TLSCertificate().Leaf.Equal(b.TLSCertificate().Leaf) {
		t.Fatal("two fresh instances share a certificate before any manifest")
	}
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b)
	if b.Status() != StateAcceptingMarbles {
		t.Fatalf("b's state after a's manifest: %d", b.Status())
	}
	ma, _ := a.Manifest()
	mb, err := b.Manifest()
	if err != nil || mb.Fingerprint != ma.Fingerprint {
		t.Fatalf("b's manifest = %v, %v; want a's %s", mb.Fingerprint, err, ma.Fingerprint)
	}
	qa, _ := a.Quote(t.Context(), nil)
	qb, _ := b.Quote(t.Context(), nil)
	if !bytes.Equal(qa.ChainPEM, qb.ChainPEM) {
		t.Fatal("b serves another certificate chain than a after following a's manifest")
	}
	// b writes, a reads b's write after syncing.
	if err := e.upload(b, "uploaded", "from b"); err != nil {
		t.Fatal(err)
	}
	mustSync(t, a)
	if got := e.secret(a, "uploaded"); got != "from b" {
		t.Fatalf("a reads %q after b's upload", got)
	}
	// A third instance started now opens the shared state at once.
	c := e.instance()
	if c.Status() != StateAcceptingMarbles || e.secret(c, "uploaded") != "from b" {
		t.Fatalf("a new instance: state %d", c.Status())
	}
}

// TestLostSwapRunsAgainAfterTheOther: b has not seen a's write; its own
// write loses the swap, reloads and is applied on top (never lost, never a
// 500), and the update log holds both.
func TestLostSwapRunsAgainAfterTheOther(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	var bs *beforeSwap
	a, b := e.instance(), e.instanceWrapped(func(s store.Store) store.Store {
		bs = &beforeSwap{SharedStore: s.(*etcdstore.Store), ChunkStore: s.(*etcdstore.Store), Store: s}
		return bs
	})
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b)
	// a writes after b has synced and computed its change, right before
	// b's swap: b's swap loses, reloads and runs again.
	bs.hook = func() {
		if err := e.upload(a, "uploaded", "first, at a"); err != nil {
			t.Error(err)
		}
	}
	if err := e.upload(b, "followup", "second, at b"); err != nil {
		t.Fatalf("b's write after a lost swap: %v", err)
	}
	if n := bs.swaps; n != 2 {
		t.Fatalf("b swapped %d times, want 2 (one lost, one after reloading)", n)
	}
	mustSync(t, a)
	for _, c := range []*Core{a, b} {
		if e.secret(c, "uploaded") != "first, at a" || e.secret(c, "followup") != "second, at b" {
			t.Fatal("a write was lost")
		}
		log, err := c.UpdateLog(t.Context())
		if err != nil || len(log) != 3 { // manifest set, two secret sets
			t.Fatalf("update log has %d entries (%v), want 3", len(log), err)
		}
	}
}

// TestRacingManifestSets: two instances in state 2 set a manifest at once:
// exactly one wins, the other answers as if it came second (wrong state),
// never a conflict or an internal error.
func TestRacingManifestSets(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	inst := []*Core{e.instance(), e.instance(), e.instance()}
	errs := make([]error, len(inst))
	var wg sync.WaitGroup
	for i, c := range inst {
		wg.Go(func() { _, errs[i] = c.SetManifest(context.Background(), e.w.manifest(manifestOpts{})) })
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrWrongState):
			t.Errorf("instance %d: %v, want success or ErrWrongState", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d instances set the manifest, want exactly 1", won)
	}
	var fps []string
	for _, c := range inst {
		mustSync(t, c)
		m, err := c.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		fps = append(fps, m.Fingerprint)
		if c.TLSCertificate().Leaf.Equal(inst[0].TLSCertificate().Leaf) != true {
			t.Error("the instances serve different certificates")
		}
	}
	if fps[0] != fps[1] || fps[1] != fps[2] {
		t.Fatalf("fingerprints differ: %v", fps)
	}
}

// TestConcurrentCountersAcrossInstances: concurrent counter raises through
// several instances never lose a raise; MaxActivations-style counting
// holds across instances.
func TestConcurrentCountersAcrossInstances(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	inst := []*Core{e.instance(), e.instance(), e.instance()}
	if _, err := inst[0].SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	const each = 5
	var wg sync.WaitGroup
	errs := make(chan error, len(inst)*each)
	for i, c := range inst {
		wg.Go(func() {
			for j := range each {
				if err := e.upload(c, "uploaded", fmt.Sprintf("%d-%d", i, j)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent upload: %v", err)
	}
	mustSync(t, inst[0])
	log, _ := inst[0].UpdateLog(t.Context())
	if want := 1 + len(inst)*each; len(log) != want {
		t.Fatalf("update log has %d entries, want %d: writes were lost or applied twice", len(log), want)
	}
}

// TestForeignBlobEntersRecovery: a blob under the prefix that this
// instance cannot open puts it into recovery mode; nothing is overwritten.
func TestForeignBlobEntersRecovery(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	data, key := e.stores()
	rev, err := data.SavePair(t.Context(), []byte("not a sealed state"), "", key, []byte("not a key file"), "")
	if err != nil {
		t.Fatal(err)
	}
	c := e.instance()
	if c.Status() != StateRecovery {
		t.Fatalf("state with a foreign blob: %d, want recovery", c.Status())
	}
	// A running instance that follows a foreign blob enters recovery too.
	e2 := newSharedEnv(t, cluster)
	a := e2.instance()
	if _, err := a.SetManifest(t.Context(), e2.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	d2, k2 := e2.stores()
	_, drev, _, krev, err := d2.LoadPair(t.Context(), k2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d2.SavePair(t.Context(), []byte("garbage"), drev, k2, []byte("garbage key"), krev); err != nil {
		t.Fatal(err)
	}
	mustSync(t, a)
	if a.Status() != StateRecovery {
		t.Fatalf("a running instance after a foreign blob: state %d, want recovery", a.Status())
	}
	for _, s := range []struct {
		st   *etcdstore.Store
		want string
		rev  store.Revision
	}{{data, "not a sealed state", rev}, {key, "not a key file", rev}} {
		got, grev, err := s.st.Load(t.Context())
		if err != nil || string(got) != s.want || grev != s.rev {
			t.Errorf("%s = %q at %q, %v; want it untouched", s.st.Key(), got, grev, err)
		}
	}
}

// TestFollowWithoutRequests: Follow picks up another instance's change
// without a request arriving.
func TestFollowWithoutRequests(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a, b := e.instance(), e.instance()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go b.Follow(ctx)
	time.Sleep(200 * time.Millisecond)
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.Status() != StateAcceptingMarbles {
		if time.Now().After(deadline) {
			t.Fatal("b did not follow a's manifest within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNewWithEtcdGone: a start that cannot read the shared store fails as
// unavailable (so that it may be tried again), not in recovery mode and not
// with an error of another class.
func TestNewWithEtcdGone(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	data, key := e.stores()
	cluster.Stop(0)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	c, err := New(ctx, Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("New with etcd gone: %v (core %v), want ErrUnavailable", err, c)
	}
	for _, class := range ErrorClasses() {
		if class != ErrUnavailable && errors.Is(err, class) {
			t.Errorf("New with etcd gone: %v is also %v", err, class)
		}
	}
}

// TestSyncWithEtcdGone: with etcd unreachable Sync fails as unavailable and
// the instance keeps its state.
func TestSyncWithEtcdGone(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a := e.instance()
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	cluster.Stop(0)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := a.Sync(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Sync with etcd gone: %v, want ErrUnavailable", err)
	}
	if a.Status() != StateAcceptingMarbles {
		t.Fatalf("state %d after a failed sync", a.Status())
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer wcancel()
	if err := a.SetSecrets(wctx, e.w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: []byte("x")}}); err == nil {
		t.Fatal("a write with etcd gone succeeded")
	}
	if err := cluster.Restart(0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := e.upload(a, "uploaded", "after restart")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write after etcd came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	b := e.instance()
	if got := e.secret(b, "uploaded"); got != "after restart" {
		t.Fatalf("stored %q", got)
	}
}

// beforeSwap runs hook once before the first SavePair or SaveHead after
// hook is set, and counts the swaps from then on.
type beforeSwap struct {
	vault.SharedStore
	vault.ChunkStore
	store.Store
	hook  func()
	swaps int
}

func (b *beforeSwap) SaveHead(ctx context.Context, blob []byte, prev store.Revision, other store.Store, otherBlob []byte, otherPrev store.Revision, puts map[string][]byte, deletes []string) (store.Revision, error) {
	if b.hook == nil {
		return b.ChunkStore.SaveHead(ctx, blob, prev, other, otherBlob, otherPrev, puts, deletes)
	}
	b.swaps++
	if b.swaps == 1 {
		b.hook()
	}
	return b.ChunkStore.SaveHead(ctx, blob, prev, other, otherBlob, otherPrev, puts, deletes)
}

func (b *beforeSwap) Load(ctx context.Context) ([]byte, store.Revision, error) {
	return b.Store.Load(ctx)
}

func (b *beforeSwap) SavePair(ctx context.Context, blob []byte, prev store.Revision, other store.Store, otherBlob []byte, otherPrev store.Revision) (store.Revision, error) {
	b.swaps++
	if b.swaps == 1 {
		b.hook()
	}
	return b.SharedStore.SavePair(ctx, blob, prev, other, otherBlob, otherPrev)
}
