package dcaptest

import (
	"fmt"
	"testing"
)

// outcomeTB records whether a helper failed or skipped; both stop the
// helper as they would stop a test.
type outcomeTB struct {
	testing.TB
	outcome string
}

type stopped struct{}

func (o *outcomeTB) Helper()                   {}
func (o *outcomeTB) Fatal(args ...any)         { o.stop("fatal", fmt.Sprint(args...)) }
func (o *outcomeTB) Fatalf(f string, a ...any) { o.stop("fatal", fmt.Sprintf(f, a...)) }
func (o *outcomeTB) Skip(args ...any)          { o.stop("skip", fmt.Sprint(args...)) }
func (o *outcomeTB) Skipf(f string, a ...any)  { o.stop("skip", fmt.Sprintf(f, a...)) }
func (o *outcomeTB) SkipNow()                  { o.stop("skip", "") }
func (o *outcomeTB) FailNow()                  { o.stop("fatal", "") }
func (o *outcomeTB) stop(kind, _ string)       { o.outcome = kind; panic(stopped{}) }

func run(tb testing.TB, f func(testing.TB)) string {
	o := &outcomeTB{TB: tb}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(stopped); !ok {
					panic(r)
				}
			}
		}()
		f(o)
	}()
	return o.outcome
}

// TestMissingVectorFails: the vectors are part of the repository, so a
// missing one fails the test instead of skipping it (a skipped DCAP test
// passes CI without having verified anything).
func TestMissingVectorFails(t *testing.T) {
	for name, f := range map[string]func(testing.TB){
		"SGX": func(tb testing.TB) { SGXTestdata(tb, "phala-dcap-qvl/no-such-quote") },
		"TDX": func(tb testing.TB) { TDXVector(tb, "phala-dcap-qvl/no-such-quote", TDXCollateralA) },
	} {
		if got := run(t, f); got != "fatal" {
			t.Errorf("%s: a missing vector ended with %q, want a failure", name, got)
		}
	}
	// The vectors in the repository are found.
	if got := run(t, func(tb testing.TB) { Phala(tb) }); got != "" {
		t.Errorf("Phala: %q, want the vendored vector", got)
	}
	if got := run(t, func(tb testing.TB) { TDXVector(tb, TDXQuoteA, TDXCollateralA) }); got != "" {
		t.Errorf("TDX vector A: %q, want the vendored vector", got)
	}
}
