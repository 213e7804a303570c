package core

import (
	"errors"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// TestSyncDoesNotStallBehindASlowWrite: while a change of this instance
// holds the state lock (a slow write, a read-back), Sync answers at once
// when the store still holds the state this instance serves, and within
// the store timeout with ErrUnavailable when another instance changed it;
// it never waits for the write to finish.
func TestSyncDoesNotStallBehindASlowWrite(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	data, key := e.stores()
	a, err := New(t.Context(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}, StoreTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b := e.instance()
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	mustSync(t, a) // a confirms it serves the stored state
	mustSync(t, b)

	a.mu.Lock() // a slow change of a is under way
	done := make(chan error, 1)
	go func() { done <- a.Sync(t.Context()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Sync with the store unchanged = %v, want nil at once", err)
		}
	case <-time.After(2 * time.Second):
		a.mu.Unlock()
		t.Fatal("Sync waited for a's write although the store still holds the state a serves")
	}

	if err := e.upload(b, "uploaded", "from b"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	go func() { done <- a.Sync(t.Context()) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Sync behind a slow write with a newer state stored = %v, want ErrUnavailable", err)
		}
		t.Logf("Sync gave up after %v", time.Since(start))
	case <-time.After(3 * time.Second):
		a.mu.Unlock()
		t.Fatal("Sync stalled behind a's write past its store timeout")
	}
	a.mu.Unlock()
	mustSync(t, a)
	if got := e.secret(a, "uploaded"); got != "from b" {
		t.Fatalf("a reads %q after the write ended", got)
	}
}
