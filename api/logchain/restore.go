package logchain

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// A restore from a backup (`coordinator restore`, docs/backup.md) puts an
// older state back: the entries the backup does not have are discarded,
// and the Coordinator signs new ones in their place under the same root.
// The next start records it in the log (docs/update-log.md):
//
//	{"time":"…","update":"quarry: restored from backup","user":"restore",
//	 "backupCreated":"…","restoredCount":N,"restoredHead":"<hash(N), hex>",
//	 "replacedState":"checkpoint"|"none"|"unknown","replaced":<checkpoint>|null}
//
// so that a client holding a checkpoint of the discarded history can tell
// the restore from tampering. The record is a courtesy for honest
// restores: a host can roll the seal directory back by copying files
// without one (docs/threat-model.md).
const (
	// RestoreUpdate is the "update" of the record.
	RestoreUpdate = "quarry: restored from backup"
	// RestoreUser is its "user".
	RestoreUser = "restore"
	// ReplacedCheckpoint: "replaced" is the checkpoint of the state the
	// restore replaced, signed by this log's root.
	ReplacedCheckpoint = "checkpoint"
	// ReplacedNone: the seal directory held no state.
	ReplacedNone = "none"
	// ReplacedUnknown: it held a state whose checkpoint could not be read
	// (written by an earlier version, MarbleRun's, or not signed by this
	// root).
	ReplacedUnknown = "unknown"
)

// RestoreRecord is a restore record as read from the log.
type RestoreRecord struct {
	// Seq is the record's own sequence number.
	Seq           uint64      `json:"-"`
	Update        string      `json:"update"`
	BackupCreated string      `json:"backupCreated"`
	RestoredCount uint64      `json:"restoredCount"`
	RestoredHead  Hash        `json:"restoredHead"`
	ReplacedState string      `json:"replacedState"`
	Replaced      *Checkpoint `json:"replaced"`
}

// ParseRestore returns r as a restore record; false when it is not one
// (or not well formed).
func ParseRestore(r Record) (RestoreRecord, bool) {
	if !strings.Contains(r.Entry, `"update":"`+RestoreUpdate+`"`) {
		return RestoreRecord{}, false
	}
	var rr RestoreRecord
	if err := json.Unmarshal([]byte(r.Entry), &rr); err != nil || rr.Update != RestoreUpdate {
		return RestoreRecord{}, false
	}
	switch {
	case rr.ReplacedState == ReplacedCheckpoint && rr.Replaced != nil:
	case (rr.ReplacedState == ReplacedNone || rr.ReplacedState == ReplacedUnknown) && rr.Replaced == nil:
	default:
		return RestoreRecord{}, false
	}
	rr.Seq = r.Seq
	return rr, true
}

// ErrRestored means the log does not extend a checkpoint because it was
// restored from a backup that discarded entries after it (a
// *RestoreError says where). It is still not an extension.
var ErrRestored = errors.New("update log restored from a backup")

// RestoreError explains why a log does not extend a saved checkpoint: a
// restore recorded in the log (Restore) discarded entries from
// Restore.RestoredCount+1 on. Exact reports that the restore names the
// saved checkpoint itself as the head it replaced. It wraps
// ErrNotExtension and ErrRestored.
type RestoreError struct {
	Restore RestoreRecord
	Saved   Checkpoint
	Exact   bool
}

func (e *RestoreError) Error() string {
	r, n, k := e.Restore, e.Restore.RestoredCount, e.Saved.Count
	var b strings.Builder
	fmt.Fprintf(&b, "%s: the log was restored from a backup at entry %d", ErrRestored, n)
	switch {
	case e.Exact:
		fmt.Fprintf(&b, ", discarding %s of your checkpoint", span(n+1, k))
	case r.Replaced != nil:
		fmt.Fprintf(&b, ", discarding %s of the log it replaced (head %s); your checkpoint (%d entries, head %s) is not that head, so whether its %s were among the discarded ones cannot be checked",
			span(n+1, r.Replaced.Count), r.Replaced.Head, k, e.Saved.Head, span(n+1, k))
	case r.ReplacedState == ReplacedNone:
		fmt.Fprintf(&b, " into an empty seal directory, so what it discarded is not known; your checkpoint's %s are not in this log", span(n+1, k))
	default:
		fmt.Fprintf(&b, " over a state whose update log head could not be read, so what it discarded is not known; your checkpoint's %s are not in this log", span(n+1, k))
	}
	fmt.Fprintf(&b, " (the restore is recorded at entry %d", r.Seq)
	if r.BackupCreated != "" {
		fmt.Fprintf(&b, "; the backup says it was taken at %s", r.BackupCreated)
	}
	b.WriteString("). The log does not extend your checkpoint: if you accept the restore, verify the whole log and save its checkpoint anew")
	return b.String()
}

// Unwrap makes errors.Is true for ErrNotExtension and ErrRestored.
func (e *RestoreError) Unwrap() []error { return []error{ErrNotExtension, ErrRestored} }

// span names entries a to b.
func span(a, b uint64) string {
	if a == b {
		return fmt.Sprintf("entry %d", a)
	}
	return fmt.Sprintf("entries %d..%d", a, b)
}

// ExplainNotExtension looks in records, the entries 1 to n of a log
// verified against root, for a restore that explains why the log does not
// extend saved (a checkpoint verified against root): one recorded after
// the restored entries, restored at an entry before saved's count, whose
// restored head is the log's own hash at that entry, and whose replaced
// checkpoint, if any, is signed by root. It prefers a restore that
// replaced exactly saved; then the last that replaced a log at least as
// long as saved; then the last whose replaced state is not known. It
// returns nil when none fits, or when the log does contain saved's head
// at saved's count (it extends saved).
func ExplainNotExtension(root *x509.Certificate, saved Checkpoint, records []Record) *RestoreError {
	for i, r := range records {
		if r.Seq != uint64(i)+1 {
			return nil // not the whole log from entry 1
		}
	}
	if saved.Count >= 1 && saved.Count <= uint64(len(records)) && records[saved.Count-1].Hash == saved.Head {
		return nil
	}
	var covering, unknown *RestoreError
	for _, r := range records {
		rr, ok := ParseRestore(r)
		if !ok || rr.RestoredCount < 1 || rr.RestoredCount >= rr.Seq || rr.RestoredCount >= saved.Count ||
			records[rr.RestoredCount-1].Hash != rr.RestoredHead {
			continue
		}
		if rr.Replaced != nil && rr.Replaced.Verify(root) != nil {
			continue
		}
		e := &RestoreError{Restore: rr, Saved: saved}
		switch {
		case rr.Replaced == nil:
			unknown = e
		case rr.Replaced.Count == saved.Count && rr.Replaced.Head == saved.Head:
			e.Exact = true
			return e
		case rr.Replaced.Count >= saved.Count:
			covering = e
		}
	}
	if covering != nil {
		return covering
	}
	return unknown
}
