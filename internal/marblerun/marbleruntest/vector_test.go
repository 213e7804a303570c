package marbleruntest

import (
	"testing"
)

// failTB records whether ReadVector failed or skipped; both stop it as
// they would stop a test.
type failTB struct {
	testing.TB
	outcome string
}

type stopped struct{}

func (f *failTB) Helper()               {}
func (f *failTB) Fatal(...any)          { f.stop("fatal") }
func (f *failTB) Fatalf(string, ...any) { f.stop("fatal") }
func (f *failTB) Skip(...any)           { f.stop("skip") }
func (f *failTB) Skipf(string, ...any)  { f.stop("skip") }
func (f *failTB) SkipNow()              { f.stop("skip") }
func (f *failTB) FailNow()              { f.stop("fatal") }
func (f *failTB) stop(kind string)      { f.outcome = kind; panic(stopped{}) }
func (f *failTB) read(root, name string) (outcome string) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stopped); !ok {
				panic(r)
			}
		}
		outcome = f.outcome
	}()
	ReadVector(f, root, name)
	return
}

// TestMissingVectorFails: the MarbleRun state vectors are part of the
// repository (testdata/marblerun-state), so a missing one fails the test
// instead of skipping it; the vendored ones are all found.
func TestMissingVectorFails(t *testing.T) {
	const root = "../../../testdata/marblerun-state"
	if got := (&failTB{TB: t}).read(root, "no-such-scenario"); got != "fatal" {
		t.Errorf("a missing scenario ended with %q, want a failure", got)
	}
	for _, name := range VectorNames {
		if got := (&failTB{TB: t}).read(root, name); got != "" {
			t.Errorf("%s: %q, want the vendored vector", name, got)
		}
	}
}
