package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/client"
)

// logVerifyFlags are the options of manifest log --verify.
type logVerifyFlags struct {
	verify         bool
	sinceFile      string
	saveCheckpoint string
}

// logSummary is what manifest log --verify reports.
type logSummary struct {
	Verified bool `json:"verified"`
	// Entries is the number of entries verified (after Since, when set).
	Entries uint64 `json:"entries"`
	// Since is the count of the saved checkpoint the log extends.
	Since     *uint64 `json:"since,omitempty"`
	FirstTime string  `json:"firstTime,omitempty"`
	LastTime  string  `json:"lastTime,omitempty"`
	// Fingerprints are the manifest fingerprints the entries name, in
	// order of first appearance.
	Fingerprints []string `json:"fingerprints"`
	// Restores are the restores from a backup the verified entries record
	// (docs/update-log.md, "Restores").
	Restores   []logRestore         `json:"restores,omitempty"`
	Checkpoint client.LogCheckpoint `json:"checkpoint"`
}

// logRestore is a restore the log records: at entry Seq, back to
// RestoredCount entries, replacing a log of ReplacedCount entries (nil:
// not known).
type logRestore struct {
	Seq           uint64  `json:"seq"`
	RestoredCount uint64  `json:"restoredCount"`
	ReplacedCount *uint64 `json:"replacedCount,omitempty"`
	BackupCreated string  `json:"backupCreated"`
}

// maxCheckpointFile bounds a saved checkpoint file.
const maxCheckpointFile = 64 << 10

// verifyLog runs manifest log --verify: get fetches and verifies the log
// (from since, when a checkpoint file is given).
func (a *app) verifyLog(f logVerifyFlags, get func(since *client.LogCheckpoint) (*client.VerifiedLog, error)) error {
	var since *client.LogCheckpoint
	if f.sinceFile != "" {
		raw, err := readFile(f.sinceFile)
		if err != nil {
			return err
		}
		if len(raw) > maxCheckpointFile {
			return usagef("--since-checkpoint %s: larger than %d bytes", f.sinceFile, maxCheckpointFile)
		}
		since = &client.LogCheckpoint{}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(since); err != nil {
			return usagef("--since-checkpoint %s: not a saved checkpoint (JSON with count, head, time, signature): %w", f.sinceFile, err)
		}
	}
	v, err := get(since)
	if err != nil {
		return logFailure(err)
	}
	sum := summarize(v)
	if since != nil {
		n := since.Count
		sum.Since = &n
	}
	if f.saveCheckpoint != "" {
		raw, err := json.MarshalIndent(v.Checkpoint, "", "  ")
		if err != nil {
			return err
		}
		if err := writeFile(f.saveCheckpoint, append(raw, '\n'), 0o644); err != nil {
			return err
		}
	}
	if a.jsonOutput() {
		return a.printJSON(sum)
	}
	if since != nil {
		a.printf("update log verified: it extends the saved checkpoint (%s) by %s, to %s\n",
			plural(since.Count, "entry", "entries"), plural(sum.Entries, "entry", "entries"), plural(v.Checkpoint.Count, "entry", "entries"))
	} else {
		a.printf("update log verified: %s\n", plural(sum.Entries, "entry", "entries"))
	}
	if sum.FirstTime != "" {
		a.printf("first entry: %s\nlast entry:  %s\n", sum.FirstTime, sum.LastTime)
	}
	a.printf("checkpoint: %s, head %s, signed %s by the pinned root\n", plural(v.Checkpoint.Count, "entry", "entries"), v.Checkpoint.Head, v.Checkpoint.Time)
	if len(sum.Fingerprints) > 0 {
		a.printf("manifest fingerprints seen:\n  %s\n", strings.Join(sum.Fingerprints, "\n  "))
	}
	for _, r := range sum.Restores {
		replaced := "what it discarded is not known"
		if r.ReplacedCount != nil {
			replaced = fmt.Sprintf("the log it replaced had %s", plural(*r.ReplacedCount, "entry", "entries"))
		}
		a.printf("restored from a backup (taken %s) at entry %d, recorded at entry %d: %s\n", r.BackupCreated, r.RestoredCount, r.Seq, replaced)
	}
	return nil
}

// summarize reads the times and fingerprints of the verified entries.
func summarize(v *client.VerifiedLog) logSummary {
	sum := logSummary{Verified: true, Entries: uint64(len(v.Records)), Checkpoint: v.Checkpoint, Fingerprints: []string{}}
	for _, r := range v.Records {
		var e map[string]any
		if json.Unmarshal([]byte(r.Entry), &e) != nil {
			continue
		}
		if t, ok := e["time"].(string); ok {
			if sum.FirstTime == "" {
				sum.FirstTime = t
			}
			sum.LastTime = t
		}
		if rr, ok := logchain.ParseRestore(r); ok {
			lr := logRestore{Seq: rr.Seq, RestoredCount: rr.RestoredCount, BackupCreated: rr.BackupCreated}
			if rr.Replaced != nil {
				n := rr.Replaced.Count
				lr.ReplacedCount = &n
			}
			sum.Restores = append(sum.Restores, lr)
		}
		for _, k := range []string{"oldManifestFingerprint", "manifestFingerprint"} {
			if fp, ok := e[k].(string); ok && fp != "" && !slices.Contains(sum.Fingerprints, fp) {
				sum.Fingerprints = append(sum.Fingerprints, fp)
			}
		}
	}
	return sum
}

// logVerifyError is a failed check of the update log: it exits with
// ExitVerification (it wraps client.ErrVerification).
type logVerifyError struct {
	what string
	err  error
}

func (e logVerifyError) Error() string   { return e.what + ": " + e.err.Error() }
func (e logVerifyError) Unwrap() []error { return []error{client.ErrVerification, e.err} }

// logFailure names a failure of manifest log --verify: a log that does not
// extend the saved checkpoint (a recorded restore from a backup says so
// first) or a log that does not verify exit with ExitVerification;
// anything else (the network, the Coordinator's refusal) with its own code.
func logFailure(err error) error {
	switch {
	case errors.Is(err, client.ErrLogRestored), errors.Is(err, client.ErrCheckpointNotExtends):
		return logVerifyError{"the update log does NOT extend the saved checkpoint", err}
	case errors.Is(err, client.ErrLogEntryAltered), errors.Is(err, client.ErrLogEntryMissing),
		errors.Is(err, client.ErrLogEntriesReordered), errors.Is(err, client.ErrLogHeadMismatch),
		errors.Is(err, client.ErrCheckpointSignature):
		return logVerifyError{"the update log does NOT verify", err}
	}
	return fmt.Errorf("the update log does NOT verify: %w", err)
}
