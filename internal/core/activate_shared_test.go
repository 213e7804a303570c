package core

import (
	"errors"
	"testing"

	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// TestActivationCountSurvivesOtherInstancesCommits: an activation of a
// MaxActivations type prepared before another instance's unrelated commit
// (a secret upload, followed here by a reload that rebuilds the snapshot)
// is counted, not aborted as if the manifest or the certificates had
// changed; a package update in between (a new intermediate and Marble
// Root) still aborts it.
func TestActivationCountSurvivesOtherInstancesCommits(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	a, b := e.instance(), e.instance()
	if _, err := a.SetManifest(t.Context(), e.w.manifest(manifestOpts{})); err != nil {
		t.Fatal(err)
	}
	mustSync(t, b)

	prepared := a.snap.Load()
	if err := e.upload(b, "uploaded", "unrelated"); err != nil {
		t.Fatal(err)
	}
	mustSync(t, a)
	if a.snap.Load() == prepared {
		t.Fatal("a did not reload after b's commit; the test needs a new snapshot")
	}
	if err := a.countActivation(t.Context(), prepared, "m", 5); err != nil {
		t.Fatalf("an activation prepared before an unrelated commit elsewhere was refused: %v", err)
	}
	if got := a.snap.Load().persisted.Activations["m"]; got != 1 {
		t.Fatalf("activations of m = %d, want 1", got)
	}

	prepared = a.snap.Load()
	if _, err := b.Update(t.Context(), e.w.admin.peer(), []byte(`{"Packages":{"p":{"SecurityVersion":2}}}`)); err != nil {
		t.Fatal(err)
	}
	mustSync(t, a)
	if err := a.countActivation(t.Context(), prepared, "m", 5); !errors.Is(err, ErrConflict) {
		t.Fatalf("an activation prepared before a package update = %v, want ErrConflict", err)
	}
}
