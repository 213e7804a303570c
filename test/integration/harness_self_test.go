package integration

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestHarnessKeepsEveryLogLine: a process that writes much to stderr and
// exits at once has every line in Logs once the harness saw it exit (its
// stderr is read to the end before Wait returns, as os/exec requires).
func TestHarnessKeepsEveryLogLine(t *testing.T) {
	t.Parallel()
	const lines = 20000
	script := `echo '{"msg":"marble API listening","addr":"127.0.0.1:1"}' >&2
echo '{"msg":"client API listening","addr":"127.0.0.1:2"}' >&2
i=0; while [ $i -lt ` + fmt.Sprint(lines) + ` ]; do echo "line $i padding padding padding padding padding" ; i=$((i+1)); done >&2
echo last >&2
exit 3`
	// The launcher runs the script instead of the binary (passed to it as $0).
	c := &coordinator{t: t, sealDir: t.TempDir(), listenOnly: true, launcher: []string{"sh", "-c", script}}
	c.start()
	<-c.exited
	logs := c.Logs()
	if got := strings.Count(logs, "\n"); got != lines+3 || !strings.HasSuffix(logs, "\nlast\n") {
		t.Fatalf("%d lines logged, want %d ending in \"last\" (exit: %v)", got, lines+3, c.err)
	}
}

// TestRaceCoordinatorIsTheRaceBuild: the binary the concurrent-fault runs
// start is built with the race detector, whether or not this test binary
// is (scripts/test runs this package without it); and the release build
// is not. Under CI=true there must be a race build.
func TestRaceCoordinatorIsTheRaceBuild(t *testing.T) {
	t.Parallel()
	race := func(path string) bool {
		t.Helper()
		info, err := buildinfo.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range info.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
		return false
	}
	if race(coordinatorBin) {
		t.Errorf("%s (the release build) has the race detector", coordinatorBin)
	}
	if raceCoordinatorBin == coordinatorBin {
		if os.Getenv("CI") == "true" {
			t.Fatal("no race detector's build of the coordinator under CI=true")
		}
		t.Skip("no race detector's build here (no C compiler)")
	}
	if !race(raceCoordinatorBin) {
		t.Errorf("%s is not built with the race detector", raceCoordinatorBin)
	}
}
