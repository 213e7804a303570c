package core

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/internal/vault"
)

// hookStore is a store whose Saves first call hook with their number
// (from 1, counted from when hook is set); a hook error fails the Save
// before it writes.
type hookStore struct {
	store.Store
	mu   sync.Mutex
	n    int
	hook func(n int) error
}

func (h *hookStore) setHook(f func(n int) error) {
	h.mu.Lock()
	h.n, h.hook = 0, f
	h.mu.Unlock()
}

func (h *hookStore) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	h.mu.Lock()
	h.n++
	n, f := h.n, h.hook
	h.mu.Unlock()
	if f != nil {
		if err := f(n); err != nil {
			return "", err
		}
	}
	return h.Store.Save(ctx, blob, prev)
}

// uploadWorld is a Coordinator whose manifest has user-defined secrets
// u0…u(n-1) that user alice may write, on a data store with a hook.
type uploadWorld struct {
	c       *Core
	data    *hookStore
	key     store.Store
	alice   []*x509.Certificate
	commits atomic.Int64
	n       int
}

func newUploadWorld(t *testing.T, n int) *uploadWorld {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	defs := map[string]any{}
	var names []string
	for i := range n {
		name := fmt.Sprintf("u%d", i)
		defs[name] = map[string]any{"Type": "plain", "UserDefined": true}
		names = append(names, name)
	}
	raw, _ := json.Marshal(map[string]any{
		"Packages": map[string]any{"p": map[string]any{"Debug": true}},
		"Marbles":  map[string]any{"m": map[string]any{"Package": "p"}},
		"Secrets":  defs,
		"Users":    map[string]any{"alice": map[string]any{"Certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), "Roles": []string{"w"}}},
		"Roles":    map[string]any{"w": map[string]any{"ResourceType": "Secrets", "ResourceNames": names, "Actions": []string{"WriteSecret"}}},
	})
	w := &uploadWorld{data: &hookStore{Store: memstore.New()}, key: memstore.New(), alice: []*x509.Certificate{cert}, n: n}
	w.c = w.open(t)
	if _, err := w.c.SetManifest(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	w.commits.Store(0)
	return w
}

// open starts a Coordinator on the world's stores.
func (w *uploadWorld) open(t *testing.T) *Core {
	t.Helper()
	c, err := New(context.Background(), Options{Data: w.data, Key: w.key, KeySealer: seal.SimulationKeySealer{},
		OnCommit: func(CommitResult) { w.commits.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// values returns the stored value of each secret u0…, read by a fresh
// Coordinator on the stores ("" when unset).
func (w *uploadWorld) values(t *testing.T, c *Core) []string {
	t.Helper()
	out := make([]string, w.n)
	st := c.snap.Load().persisted
	for i := range w.n {
		out[i] = string(st.Secrets[fmt.Sprintf("u%d", i)].Private)
	}
	return out
}

// queued runs first, then, while first's commit is held at the data
// store, the uploads of rest concurrently, and returns each call's error
// (first's at index 0). fail, if set, is the error of the commit after
// first's.
func (w *uploadWorld) queued(t *testing.T, first map[string]secrets.Upload, rest []map[string]secrets.Upload, fail error) []error {
	t.Helper()
	entered, gate := make(chan struct{}), make(chan struct{})
	w.data.setHook(func(n int) error {
		switch n {
		case 1:
			close(entered)
			<-gate
		case 2:
			return fail
		}
		return nil
	})
	defer w.data.setHook(nil)
	errs := make([]error, 1+len(rest))
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = w.c.SetSecrets(context.Background(), w.alice, first) })
	<-entered
	for i, u := range rest {
		wg.Go(func() { errs[1+i] = w.c.SetSecrets(context.Background(), w.alice, u) })
	}
	// Let them reach the state lock, which first's commit holds.
	time.Sleep(300 * time.Millisecond)
	close(gate)
	wg.Wait()
	return errs
}

func plain(v string) secrets.Upload { return secrets.Upload{Key: []byte(v)} }

// Uploads that queue behind a commit all land, each answered with
// success, stored by fewer commits than uploads; a restart sees them all.
func TestQueuedUploadsAllLand(t *testing.T) {
	const n = 8
	w := newUploadWorld(t, n)
	var rest []map[string]secrets.Upload
	for i := 1; i < n; i++ {
		rest = append(rest, map[string]secrets.Upload{fmt.Sprintf("u%d", i): plain(fmt.Sprintf("v%d", i))})
	}
	errs := w.queued(t, map[string]secrets.Upload{"u0": plain("v0")}, rest, nil)
	for i, err := range errs {
		if err != nil {
			t.Errorf("upload %d: %v", i, err)
		}
	}
	if got := w.commits.Load(); got > n/2 {
		t.Errorf("%d uploads that queued took %d commits; want them stored together (at most %d)", n, got, n/2)
	}
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprintf("v%d", i)
	}
	for _, c := range []*Core{w.c, w.open(t)} {
		if got := w.values(t, c); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("stored secrets %v, want %v", got, want)
		}
	}
	log, err := w.open(t).UpdateLog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	set := 0
	for _, e := range log {
		var m map[string]any
		if json.Unmarshal([]byte(e), &m) == nil && m["secret"] != nil {
			set++
		}
	}
	if set != n {
		t.Errorf("the update log has %d secret entries, want %d:\n%v", set, n, log)
	}
}

// One bad upload among queued ones is refused alone, with the error it
// gets on its own; an upload of the same secret after it in the queue
// sees the value of the upload before it.
func TestQueuedBadUploadRefusedAlone(t *testing.T) {
	w := newUploadWorld(t, 3)
	alone := w.c.SetSecrets(context.Background(), w.alice, map[string]secrets.Upload{"nope": plain("x")})
	if !errors.Is(alone, ErrNotFound) {
		t.Fatalf("an upload of an undefined secret answers %v, want ErrNotFound", alone)
	}
	w.commits.Store(0)
	errs := w.queued(t, map[string]secrets.Upload{"u0": plain("a")}, []map[string]secrets.Upload{
		{"u1": plain("b")},
		{"nope": plain("x"), "u2": plain("lost")},
		{"u2": plain("c")},
	}, nil)
	if errs[0] != nil || errs[1] != nil || errs[3] != nil {
		t.Fatalf("good uploads answer %v", errs)
	}
	if errs[2] == nil || errs[2].Error() != alone.Error() || !errors.Is(errs[2], ErrNotFound) {
		t.Fatalf("the bad upload answers %v, want %v as alone", errs[2], alone)
	}
	if got := w.values(t, w.open(t)); fmt.Sprint(got) != fmt.Sprint([]string{"a", "b", "c"}) {
		t.Errorf("stored %v, want [a b c]", got)
	}
	if got := w.commits.Load(); got > 2 {
		t.Errorf("took %d commits, want the queued uploads stored together", got)
	}
}

// A commit that fails fails every upload it carried, with the error class
// one upload alone gets, and changes nothing; the next upload works.
func TestQueuedUploadsFailedWrite(t *testing.T) {
	w := newUploadWorld(t, 4)
	boom := errors.New("disk on fire")
	// One upload alone with a failing data write, for the error class.
	w.data.setHook(func(int) error { return boom })
	alone := w.c.SetSecrets(context.Background(), w.alice, map[string]secrets.Upload{"u3": plain("alone")})
	w.data.setHook(nil)
	if alone == nil {
		t.Fatal("a failed write answered success")
	}
	before := w.values(t, w.c)
	errs := w.queued(t, map[string]secrets.Upload{"u0": plain("a")}, []map[string]secrets.Upload{
		{"u1": plain("b")}, {"u2": plain("c")}, {"u3": plain("d")},
	}, boom)
	if errs[0] != nil {
		t.Fatalf("the first upload (its own commit) answers %v", errs[0])
	}
	before[0] = "a"
	for i, err := range errs[1:] {
		if err == nil || !errors.Is(err, boom) {
			t.Fatalf("upload %d of the failed commit answers %v, want the write's error", i+1, err)
		}
		for _, class := range append(ErrorClasses(), vault.ErrUnconfirmed, vault.ErrOutcomeUnknown) {
			if errors.Is(err, class) != errors.Is(alone, class) {
				t.Errorf("upload %d answers %v; alone the same failure answers %v (class %v differs)", i+1, err, alone, class)
			}
		}
	}
	for _, c := range []*Core{w.c, w.open(t)} {
		if got := w.values(t, c); fmt.Sprint(got) != fmt.Sprint(before) {
			t.Errorf("after the failed commit the state holds %v, want %v", got, before)
		}
	}
	if err := w.c.SetSecrets(context.Background(), w.alice, map[string]secrets.Upload{"u1": plain("later")}); err != nil {
		t.Fatalf("the next upload fails: %v", err)
	}
	if got := w.values(t, w.open(t))[1]; got != "later" {
		t.Errorf("the next upload stored %q", got)
	}
}
