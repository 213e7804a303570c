package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/client"
)

// verifiedLog is a verified log of n entries after from (the records are
// only counted by the summary; their hashes are not looked at here).
func verifiedLog(from, n uint64) *client.VerifiedLog {
	v := &client.VerifiedLog{From: client.LogHead{Count: from}, Checkpoint: client.LogCheckpoint{Count: from + n, Time: "2026-01-02T03:04:05.678Z"}}
	for i := range n {
		v.Records = append(v.Records, client.LogRecord{Seq: from + i + 1, Entry: fmt.Sprintf(`{"time":"2026-01-02T03:04:05.%03dZ","update":"Secret set"}`, i%1000)})
	}
	return v
}

// The summary counts entries in English: "1 entry", "1142 entries", never
// "entrys", also for the saved checkpoint and the checkpoint line.
func TestVerifyLogPlurals(t *testing.T) {
	dir := t.TempDir()
	saved := func(count uint64) string {
		p := filepath.Join(dir, fmt.Sprintf("cp-%d.json", count))
		b, _ := json.Marshal(client.LogCheckpoint{Count: count, Time: "2026-01-02T03:04:05.678Z"})
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name  string
		flags logVerifyFlags
		log   *client.VerifiedLog
		want  []string
	}{
		{"many", logVerifyFlags{verify: true}, verifiedLog(0, 1142),
			[]string{"update log verified: 1142 entries\n", "checkpoint: 1142 entries, head "}},
		{"one", logVerifyFlags{verify: true}, verifiedLog(0, 1),
			[]string{"update log verified: 1 entry\n", "checkpoint: 1 entry, head "}},
		{"since one, by one", logVerifyFlags{verify: true, sinceFile: saved(1)}, verifiedLog(1, 1),
			[]string{"it extends the saved checkpoint (1 entry) by 1 entry, to 2 entries\n"}},
		{"since many, by many", logVerifyFlags{verify: true, sinceFile: saved(1142)}, verifiedLog(1142, 3),
			[]string{"it extends the saved checkpoint (1142 entries) by 3 entries, to 1145 entries\n"}},
		{"since many, by none", logVerifyFlags{verify: true, sinceFile: saved(7)}, verifiedLog(7, 0),
			[]string{"it extends the saved checkpoint (7 entries) by 0 entries, to 7 entries\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			a := &app{out: &out, errw: &out}
			err := a.verifyLog(tc.flags, func(*client.LogCheckpoint) (*client.VerifiedLog, error) { return tc.log, nil })
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if strings.Contains(out.String(), "entrys") {
				t.Errorf("output says \"entrys\":\n%s", out.String())
			}
		})
	}
}

func TestPlural(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{plural(0, "entry", "entries"), "0 entries"},
		{plural(1, "entry", "entries"), "1 entry"},
		{plural(uint64(2), "entry", "entries"), "2 entries"},
		{plural(1, "secret", "secrets"), "1 secret"},
		{plural(3, "acknowledgement", "acknowledgements"), "3 acknowledgements"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// A log that does not verify, or does not extend the saved checkpoint,
// exits with ExitVerification and says which; a restore recorded in the
// log is named first. A failure of the Coordinator keeps its own code.
func TestVerifyLogFailures(t *testing.T) {
	restored := &client.LogRestoredError{Exact: true, Saved: client.LogCheckpoint{Count: 15},
		Restore: logchain.RestoreRecord{Seq: 11, RestoredCount: 10, ReplacedState: logchain.ReplacedCheckpoint, Replaced: &client.LogCheckpoint{Count: 15}}}
	for _, tc := range []struct {
		name string
		err  error
		code int
		want string
	}{
		{"restored", restored, ExitVerification,
			"the update log does NOT extend the saved checkpoint: update log restored from a backup: the log was restored from a backup at entry 10, discarding entries 11..15 of your checkpoint"},
		{"not extended", fmt.Errorf("%w: the log has 3 entries, the saved checkpoint 5", client.ErrCheckpointNotExtends), ExitVerification,
			"the update log does NOT extend the saved checkpoint: update log checkpoint does not extend"},
		{"altered", fmt.Errorf("%w: entry 4 does not chain from entry 3", client.ErrLogEntryAltered), ExitVerification,
			"the update log does NOT verify: update log entry altered"},
		{"bad signature", client.ErrCheckpointSignature, ExitVerification, "the update log does NOT verify: "},
		{"server error", &client.Error{HTTPStatus: 500, Status: "error", Message: "the stored update log is damaged"}, ExitFailure, "the update log does NOT verify: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			a := &app{out: &out, errw: &out}
			err := a.verifyLog(logVerifyFlags{verify: true}, func(*client.LogCheckpoint) (*client.VerifiedLog, error) { return nil, tc.err })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if got := exitCode(runError{err}); got != tc.code {
				t.Fatalf("exit code %d, want %d", got, tc.code)
			}
		})
	}
}

// The summary names the restores from a backup that the verified entries
// record, also when the log extends the saved checkpoint.
func TestVerifyLogNamesRestores(t *testing.T) {
	v := verifiedLog(0, 3)
	v.Records = append(v.Records,
		client.LogRecord{Seq: 4, Entry: `{"time":"2026-02-01T00:00:00.000Z","update":"quarry: restored from backup","user":"restore","backupCreated":"2026-01-01T00:00:00Z","restoredCount":3,"restoredHead":"` + strings.Repeat("ab", 32) + `","replacedState":"checkpoint","replaced":{"count":9,"head":"` + strings.Repeat("cd", 32) + `","time":"2026-01-05T00:00:00.000Z","signature":"AA=="}}`},
		client.LogRecord{Seq: 5, Entry: `{"time":"2026-03-01T00:00:00.000Z","update":"quarry: restored from backup","user":"restore","backupCreated":"2026-02-15T00:00:00Z","restoredCount":4,"restoredHead":"` + strings.Repeat("ef", 32) + `","replacedState":"none","replaced":null}`})
	v.Checkpoint.Count = 5
	var out bytes.Buffer
	a := &app{out: &out, errw: &out}
	if err := a.verifyLog(logVerifyFlags{verify: true}, func(*client.LogCheckpoint) (*client.VerifiedLog, error) { return v, nil }); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"restored from a backup (taken 2026-01-01T00:00:00Z) at entry 3, recorded at entry 4: the log it replaced had 9 entries\n",
		"restored from a backup (taken 2026-02-15T00:00:00Z) at entry 4, recorded at entry 5: what it discarded is not known\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	a.output = "json"
	if err := a.verifyLog(logVerifyFlags{verify: true}, func(*client.LogCheckpoint) (*client.VerifiedLog, error) { return v, nil }); err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Restores []struct {
			Seq, RestoredCount uint64
			ReplacedCount      *uint64
		}
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil || len(sum.Restores) != 2 || sum.Restores[0].ReplacedCount == nil || *sum.Restores[0].ReplacedCount != 9 || sum.Restores[1].ReplacedCount != nil {
		t.Fatalf("json %s: %v", out.String(), err)
	}
}
