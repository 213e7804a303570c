// Package storetest is the conformance suite every store.Store backend runs:
// a backend's tests call Run with a constructor for fresh, empty stores.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/quarry-cc/quarry/internal/store"
)

// Run checks that the stores made by newStore follow the store.Store
// contract, and the store.Mover and store.Stager contracts when they
// implement them. Every subtest calls newStore once and expects an empty
// store.
//
// Revisions may be derived from content (two saves of equal bytes may yield
// the same revision), so the suite writes distinct blobs wherever it needs
// distinct revisions. Backends must honour a context cancelled before a call
// by returning an error that wraps ctx.Err() and changing nothing.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"LoadEmpty", testLoadEmpty},
		{"CreateAndLoad", testCreateAndLoad},
		{"CreateWithRevision", testCreateWithRevision},
		{"StaleRevision", testStaleRevision},
		{"SequentialUpdates", testSequentialUpdates},
		{"NoAliasing", testNoAliasing},
		{"EmptyBlob", testEmptyBlob},
		{"LargeBlob", testLargeBlob},
		{"RacingCAS", testRacingCAS},
		{"ConcurrentIncrements", testConcurrentIncrements},
		{"CancelledContext", testCancelledContext},
		{"MoveAside", testMoveAside},
		{"MoveAsideEmpty", testMoveAsideEmpty},
		{"MoveAsideCancelled", testMoveAsideCancelled},
		{"CopyAside", testCopyAside},
		{"Stage", testStage},
		{"StageDiscard", testStageDiscard},
		{"StageReplaced", testStageReplaced},
		{"StageStale", testStageStale},
		{"StageCancelled", testStageCancelled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newStore(t))
		})
	}
}

func mustSave(t *testing.T, s store.Store, blob []byte, prev store.Revision) store.Revision {
	t.Helper()
	rev, err := s.Save(t.Context(), blob, prev)
	if err != nil {
		t.Fatalf("Save(%d bytes, %q): %v", len(blob), prev, err)
	}
	if rev == "" {
		t.Fatalf("Save(%d bytes, %q) returned the empty revision", len(blob), prev)
	}
	return rev
}

// expect checks that the store holds want at revision rev.
func expect(t *testing.T, s store.Store, want []byte, rev store.Revision) {
	t.Helper()
	got, gotRev, err := s.Load(t.Context())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Load = %q (%d bytes), want %q (%d bytes)", trim(got), len(got), trim(want), len(want))
	}
	if gotRev != rev {
		t.Fatalf("Load revision = %q, want %q", gotRev, rev)
	}
}

// expectEmpty checks that the store holds nothing.
func expectEmpty(t *testing.T, s store.Store) {
	t.Helper()
	blob, rev, err := s.Load(t.Context())
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Load = %q, %q, %v; want ErrNotFound", trim(blob), rev, err)
	}
}

func trim(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

func testLoadEmpty(t *testing.T, s store.Store) {
	blob, rev, err := s.Load(t.Context())
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Load on an empty store: err = %v, want ErrNotFound", err)
	}
	if blob != nil || rev != "" {
		t.Errorf("Load on an empty store = %q, %q; want nil, empty revision", blob, rev)
	}
}

func testCreateAndLoad(t *testing.T, s store.Store) {
	blob := []byte("sealed state v1")
	rev := mustSave(t, s, blob, "")
	expect(t, s, blob, rev)
	expect(t, s, blob, rev) // Load does not consume anything
}

func testCreateWithRevision(t *testing.T, s store.Store) {
	for _, prev := range []store.Revision{"1", "garbage", "0000000000000000000000000000000000000000000000000000000000000000"} {
		if _, err := s.Save(t.Context(), []byte("x"), prev); !errors.Is(err, store.ErrConflict) {
			t.Errorf("Save(prev %q) on an empty store: err = %v, want ErrConflict", prev, err)
		}
	}
	expectEmpty(t, s)
}

func testStaleRevision(t *testing.T, s store.Store) {
	rev1 := mustSave(t, s, []byte("one"), "")
	rev2 := mustSave(t, s, []byte("two"), rev1)
	if rev2 == rev1 {
		t.Fatalf("different content, same revision %q", rev1)
	}
	for _, prev := range []store.Revision{rev1, "", "garbage", rev2 + "x"} {
		_, err := s.Save(t.Context(), []byte("three"), prev)
		if !errors.Is(err, store.ErrConflict) {
			t.Errorf("Save(prev %q) with stored %q: err = %v, want ErrConflict", prev, rev2, err)
		}
		expect(t, s, []byte("two"), rev2)
	}
}

func testSequentialUpdates(t *testing.T, s store.Store) {
	seen := map[store.Revision]bool{}
	var rev store.Revision
	var blob []byte
	for i := range 20 {
		blob = fmt.Appendf(nil, "state %d", i)
		rev = mustSave(t, s, blob, rev)
		if seen[rev] {
			t.Fatalf("update %d: revision %q reused for different content", i, rev)
		}
		seen[rev] = true
		expect(t, s, blob, rev)
	}
}

func testNoAliasing(t *testing.T, s store.Store) {
	blob := []byte("original")
	rev := mustSave(t, s, blob, "")
	blob[0] = 'X' // the caller reuses its buffer
	expect(t, s, []byte("original"), rev)

	got, _, err := s.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got[0] = 'Y' // the caller scribbles on the result
	_ = append(got[:1], "ZZZZZZZZZZZZZZZZ"...)
	expect(t, s, []byte("original"), rev)
}

func testEmptyBlob(t *testing.T, s store.Store) {
	rev := mustSave(t, s, []byte{}, "")
	got, gotRev, err := s.Load(t.Context())
	if err != nil || len(got) != 0 || gotRev != rev {
		t.Fatalf("Load after saving an empty blob = %q, %q, %v; want empty, %q, nil", got, gotRev, err, rev)
	}
	rev2 := mustSave(t, s, []byte("not empty"), rev)
	expect(t, s, []byte("not empty"), rev2)
	rev3 := mustSave(t, s, nil, rev2) // nil saves an empty blob
	if got, gotRev, err := s.Load(t.Context()); err != nil || len(got) != 0 || gotRev != rev3 {
		t.Fatalf("Load after saving nil = %q, %q, %v; want empty, %q, nil", got, gotRev, err, rev3)
	}
}

func testLargeBlob(t *testing.T, s store.Store) {
	blob := make([]byte, 4<<20)
	rand.Read(blob)
	rev := mustSave(t, s, blob, "")
	expect(t, s, blob, rev)
	blob2 := bytes.Clone(blob)
	blob2[len(blob2)-1] ^= 1
	rev2 := mustSave(t, s, blob2, rev)
	expect(t, s, blob2, rev2)
}

// testRacingCAS starts goroutines that all update from the same revision:
// exactly one may win.
func testRacingCAS(t *testing.T, s store.Store) {
	base := mustSave(t, s, []byte("base"), "")
	const n = 16
	type result struct {
		blob []byte
		rev  store.Revision
		err  error
	}
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			blob := fmt.Appendf(nil, "writer %d", i)
			<-start
			rev, err := s.Save(context.Background(), blob, base)
			results[i] = result{blob, rev, err}
		})
	}
	close(start)
	wg.Wait()

	var winners []result
	for i, r := range results {
		switch {
		case r.err == nil:
			winners = append(winners, r)
		case !errors.Is(r.err, store.ErrConflict):
			t.Errorf("writer %d: err = %v, want nil or ErrConflict", i, r.err)
		}
	}
	if len(winners) != 1 {
		t.Fatalf("%d writers won a compare-and-swap from one revision, want exactly 1", len(winners))
	}
	expect(t, s, winners[0].blob, winners[0].rev)
}

// testConcurrentIncrements runs load-modify-save loops in parallel: with
// correct compare-and-swap no increment is lost.
func testConcurrentIncrements(t *testing.T, s store.Store) {
	mustSave(t, s, []byte("0"), "")
	const workers, each = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for done := 0; done < each; {
				blob, rev, err := s.Load(context.Background())
				if err != nil {
					errs <- err
					return
				}
				var n int
				fmt.Sscan(string(blob), &n)
				_, err = s.Save(context.Background(), fmt.Append(nil, n+1), rev)
				switch {
				case err == nil:
					done++
				case !errors.Is(err, store.ErrConflict):
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	blob, _, err := s.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint(workers * each); string(blob) != want {
		t.Fatalf("counter = %s after %s increments: updates were lost", blob, want)
	}
}

func testCancelledContext(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	if _, err := s.Save(ctx, []byte("never"), ""); !errors.Is(err, context.Canceled) {
		t.Errorf("Save with a cancelled context on an empty store: err = %v, want context.Canceled", err)
	}
	expectEmpty(t, s)

	rev := mustSave(t, s, []byte("kept"), "")
	if _, err := s.Save(ctx, []byte("never"), rev); !errors.Is(err, context.Canceled) {
		t.Errorf("Save with a cancelled context: err = %v, want context.Canceled", err)
	}
	if _, _, err := s.Load(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Load with a cancelled context: err = %v, want context.Canceled", err)
	}
	expect(t, s, []byte("kept"), rev)
}

func mover(t *testing.T, s store.Store) store.Mover {
	m, ok := s.(store.Mover)
	if !ok {
		t.Skipf("%T does not implement store.Mover", s)
	}
	return m
}

func testMoveAside(t *testing.T, s store.Store) {
	m := mover(t, s)
	rev1 := mustSave(t, s, []byte("corrupt state"), "")
	where1, err := m.MoveAside(t.Context(), "broken")
	if err != nil {
		t.Fatalf("MoveAside: %v", err)
	}
	if where1 == "" {
		t.Error("MoveAside returned an empty location")
	}
	expectEmpty(t, s)
	if _, err := s.Save(t.Context(), []byte("x"), rev1); !errors.Is(err, store.ErrConflict) {
		t.Errorf("Save(prev = revision of the moved blob): err = %v, want ErrConflict", err)
	}

	rev2 := mustSave(t, s, []byte("second"), "")
	expect(t, s, []byte("second"), rev2)
	where2, err := m.MoveAside(t.Context(), "broken")
	if err != nil {
		t.Fatalf("second MoveAside: %v", err)
	}
	if where2 == where1 {
		t.Errorf("second MoveAside with the same suffix reused %q: the first moved blob was overwritten", where1)
	}
	expectEmpty(t, s)

	rev3 := mustSave(t, s, []byte("third"), "")
	expect(t, s, []byte("third"), rev3)

	if _, err := m.MoveAside(t.Context(), ""); err == nil {
		t.Error("MoveAside with an empty suffix succeeded")
	}
	expect(t, s, []byte("third"), rev3)
}

func testMoveAsideEmpty(t *testing.T, s store.Store) {
	m := mover(t, s)
	if where, err := m.MoveAside(t.Context(), "old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("MoveAside on an empty store = %q, %v; want ErrNotFound", where, err)
	}
	expectEmpty(t, s)
}

func testMoveAsideCancelled(t *testing.T, s store.Store) {
	m := mover(t, s)
	rev := mustSave(t, s, []byte("kept"), "")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := m.MoveAside(ctx, "old"); !errors.Is(err, context.Canceled) {
		t.Errorf("MoveAside with a cancelled context: err = %v, want context.Canceled", err)
	}
	expect(t, s, []byte("kept"), rev)
}

// testCopyAside checks the store.Copier contract: the copy is kept under a
// new name each time, the stored blob and its revision stay, an empty store
// is ErrNotFound.
func testCopyAside(t *testing.T, s store.Store) {
	c, ok := s.(store.Copier)
	if !ok {
		t.Skip("the store does not implement store.Copier")
	}
	if where, err := c.CopyAside(t.Context(), "old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CopyAside on an empty store = %q, %v; want ErrNotFound", where, err)
	}
	rev := mustSave(t, s, []byte("state"), "")
	where1, err := c.CopyAside(t.Context(), "old")
	if err != nil || where1 == "" {
		t.Fatalf("CopyAside = %q, %v", where1, err)
	}
	expect(t, s, []byte("state"), rev)
	where2, err := c.CopyAside(t.Context(), "old")
	if err != nil || where2 == where1 {
		t.Fatalf("second CopyAside = %q, %v (first %q): a copy was overwritten", where2, err, where1)
	}
	expect(t, s, []byte("state"), rev)
	if _, err := s.Save(t.Context(), []byte("next"), rev); err != nil {
		t.Fatalf("Save after CopyAside: %v", err)
	}
}

// stager returns s as a store.Stager, or skips a store that cannot stage
// (the capability is optional).
func stager(t *testing.T, s store.Store) store.Stager {
	t.Helper()
	st, ok := s.(store.Stager)
	if !ok {
		t.Skip("the store does not stage (store.Stager is optional)")
	}
	return st
}

// testStage: a staged blob is invisible until its Save, which stores it
// as Save would.
func testStage(t *testing.T, s store.Store) {
	st := stager(t, s)
	rev1, err := st.Stage(t.Context(), []byte("first")).Save(t.Context(), "")
	if err != nil {
		t.Fatalf("staged Save of the first blob: %v", err)
	}
	expect(t, s, []byte("first"), rev1)
	staged := st.Stage(t.Context(), []byte("second, staged"))
	expect(t, s, []byte("first"), rev1)
	rev2, err := staged.Save(t.Context(), rev1)
	if err != nil {
		t.Fatalf("staged Save: %v", err)
	}
	if rev2 == "" || rev2 == rev1 {
		t.Fatalf("staged Save returned revision %q (before: %q)", rev2, rev1)
	}
	expect(t, s, []byte("second, staged"), rev2)
	rev3 := mustSave(t, s, []byte("third"), rev2)
	expect(t, s, []byte("third"), rev3)
}

// testStageDiscard: a discarded blob changes nothing.
func testStageDiscard(t *testing.T, s store.Store) {
	st := stager(t, s)
	st.Stage(t.Context(), []byte("never stored")).Discard()
	expectEmpty(t, s)
	rev := mustSave(t, s, []byte("first"), "")
	st.Stage(t.Context(), []byte("never stored either")).Discard()
	expect(t, s, []byte("first"), rev)
}

// testStageReplaced: a Save between Stage and its Save wins; the staged
// blob is then refused and stores nothing.
func testStageReplaced(t *testing.T, s store.Store) {
	st := stager(t, s)
	staged := st.Stage(t.Context(), []byte("staged"))
	rev := mustSave(t, s, []byte("saved in between"), "")
	if _, err := staged.Save(t.Context(), rev); err == nil {
		t.Fatal("a staged blob was stored after another Save of the store")
	}
	expect(t, s, []byte("saved in between"), rev)
	// A second Stage replaces the first as well.
	first := st.Stage(t.Context(), []byte("first staged"))
	second := st.Stage(t.Context(), []byte("second staged"))
	if _, err := first.Save(t.Context(), rev); err == nil {
		t.Fatal("a staged blob was stored after another Stage of the store")
	}
	expect(t, s, []byte("saved in between"), rev)
	rev2, err := second.Save(t.Context(), rev)
	if err != nil {
		t.Fatalf("the last staged blob: %v", err)
	}
	expect(t, s, []byte("second staged"), rev2)
}

// testStageStale: a staged blob's Save from a stale revision is
// ErrConflict and changes nothing.
func testStageStale(t *testing.T, s store.Store) {
	st := stager(t, s)
	rev1 := mustSave(t, s, []byte("one"), "")
	rev2 := mustSave(t, s, []byte("two"), rev1)
	if _, err := st.Stage(t.Context(), []byte("stale")).Save(t.Context(), rev1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("staged Save from a stale revision: err = %v, want ErrConflict", err)
	}
	expect(t, s, []byte("two"), rev2)
	if _, err := st.Stage(t.Context(), []byte("stale")).Save(t.Context(), ""); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("staged Save as the first blob over a stored one: err = %v, want ErrConflict", err)
	}
	expect(t, s, []byte("two"), rev2)
}

// testStageCancelled: a context cancelled before Stage, or before the
// staged blob's Save, stores nothing.
func testStageCancelled(t *testing.T, s store.Store) {
	st := stager(t, s)
	rev := mustSave(t, s, []byte("kept"), "")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := st.Stage(ctx, []byte("cancelled")).Save(t.Context(), rev); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stage with a cancelled context, then Save: err = %v, want context.Canceled", err)
	}
	expect(t, s, []byte("kept"), rev)
	if _, err := st.Stage(t.Context(), []byte("cancelled")).Save(ctx, rev); !errors.Is(err, context.Canceled) {
		t.Fatalf("staged Save with a cancelled context: err = %v, want context.Canceled", err)
	}
	expect(t, s, []byte("kept"), rev)
	mustSave(t, s, []byte("goes on"), rev)
}

// Files lists the names in directory dir (a file store's), sorted.
func Files(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
