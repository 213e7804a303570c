package logchain_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
)

// restoreEntry writes a restore record by hand, as docs/update-log.md
// describes it.
func restoreEntry(t *testing.T, restored logchain.Head, state string, replaced *logchain.Checkpoint) string {
	t.Helper()
	rep := "null"
	if replaced != nil {
		b, err := json.Marshal(replaced)
		if err != nil {
			t.Fatal(err)
		}
		rep = string(b)
	}
	return fmt.Sprintf(`{"time":"2026-02-01T00:00:00.000Z","update":"quarry: restored from backup","user":"restore","backupCreated":"2026-01-01T00:00:00Z","restoredCount":%d,"restoredHead":"%s","replacedState":"%s","replaced":%s}`,
		restored.Count, restored.Hash, state, rep)
}

// A log of 10 entries, a checkpoint saved at 15, then a restore of the
// first 10 and new entries: the restore record explains why the saved
// checkpoint is not extended, exactly when it names that checkpoint.
func TestExplainNotExtension(t *testing.T) {
	r, k := root(t)
	old := logchain.Chain(logchain.Head{}, entries(15))
	saved := signed(t, k, old)
	at10 := logchain.Head{Count: 10, Hash: old[9].Hash}
	build := func(rec string) []logchain.Record {
		es := append(entries(10), rec)
		es = append(es, `{"time":"2026-02-01T00:00:01.000Z","update":"Secret set","user":"bob","secret":"x","type":"plain"}`)
		return logchain.Chain(logchain.Head{}, es)
	}
	longer := signed(t, k, logchain.Chain(logchain.Head{}, entries(20)))
	_, otherKey := root(t)
	forged, err := logchain.Sign(rand.Reader, otherKey, saved.HeadOf(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		recs  []logchain.Record
		exact bool
		want  string // "" for no explanation
	}{
		{"exact", build(restoreEntry(t, at10, "checkpoint", &saved)), true,
			"the log was restored from a backup at entry 10, discarding entries 11..15 of your checkpoint (the restore is recorded at entry 11; the backup says it was taken at 2026-01-01T00:00:00Z)"},
		{"a longer log replaced", build(restoreEntry(t, at10, "checkpoint", &longer)), false,
			"discarding entries 11..20 of the log it replaced"},
		{"empty directory", build(restoreEntry(t, at10, "none", nil)), false, "into an empty seal directory"},
		{"unknown", build(restoreEntry(t, at10, "unknown", nil)), false, "over a state whose update log head could not be read"},
		{"replaced checkpoint of another root", build(restoreEntry(t, at10, "checkpoint", &forged)), false, ""},
		{"restored head is not the log's", build(restoreEntry(t, logchain.Head{Count: 10, Hash: old[8].Hash}, "checkpoint", &saved)), false, ""},
		{"restored at the checkpoint's count", restoredAt15(t, &saved), false, ""},
		{"state and replaced disagree", build(restoreEntry(t, at10, "none", &saved)), false, ""},
		{"no restore", logchain.Chain(logchain.Head{}, entries(12)), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := logchain.ExplainNotExtension(r, saved, tc.recs)
			if tc.want == "" {
				if e != nil {
					t.Fatalf("explained: %v", e)
				}
				return
			}
			if e == nil {
				t.Fatal("not explained")
			}
			if e.Exact != tc.exact || !strings.Contains(e.Error(), tc.want) || !errors.Is(e, logchain.ErrNotExtension) || !errors.Is(e, logchain.ErrRestored) {
				t.Fatalf("exact %v: %v", e.Exact, e)
			}
		})
	}
	// A log that does hold the saved head is an extension, whatever it
	// records.
	ext := logchain.Chain(logchain.Head{}, append(entries(15), restoreEntry(t, at10, "checkpoint", &saved)))
	if e := logchain.ExplainNotExtension(r, saved, ext); e != nil {
		t.Fatalf("an extension explained as a restore: %v", e)
	}
}

// A checkpoint's time has one form: UTC, milliseconds, "Z".
func TestCheckpointTimeForm(t *testing.T) {
	r, k := root(t)
	cp, err := logchain.Sign(rand.Reader, k, logchain.Head{Count: 1}, time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.FixedZone("x", 3600)))
	if err != nil {
		t.Fatal(err)
	}
	if cp.Time != "2026-01-02T02:04:05.006Z" || cp.Verify(r) != nil {
		t.Fatalf("time %q: %v", cp.Time, cp.Verify(r))
	}
	for _, bad := range []string{"2026-01-02T03:04:05.006+01:00", "2026-01-02T02:04:05Z", "2026-01-02T02:04:05.006000Z"} {
		c := cp
		c.Time = bad
		// Signed over the exact bytes with the odd time: still refused.
		c.Signature = signBytes(t, k, c.SignedBytes())
		if err := c.Verify(r); !errors.Is(err, logchain.ErrCheckpointSignature) {
			t.Fatalf("time %q: %v", bad, err)
		}
	}
}

func signBytes(t *testing.T, k *ecdsa.PrivateKey, b []byte) []byte {
	t.Helper()
	d := sha256.Sum256(b)
	sig, err := ecdsa.SignASN1(rand.Reader, k, d[:])
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// restoredAt15 is a log of another 15 entries, then a restore record at
// its entry 15 naming saved: a restore there discards nothing of a
// checkpoint of 15 entries, so it explains nothing.
func restoredAt15(t *testing.T, saved *logchain.Checkpoint) []logchain.Record {
	es := entries(15)
	for i := range es {
		es[i] = strings.Replace(es[i], "alice", "carol", 1)
	}
	recs := logchain.Chain(logchain.Head{}, es)
	return logchain.Chain(logchain.Head{}, append(es, restoreEntry(t, logchain.Head{Count: 15, Hash: recs[14].Hash}, "checkpoint", saved)))
}

// The test vectors of docs/update-log.md (computed there independently of
// this package).
func TestDocumentedVectors(t *testing.T) {
	h := logchain.Head{}.Append(`{"time":"2026-01-01T00:00:00.000Z","update":"Initial manifest set"}`)
	if h.Hash.String() != "3342727169184defecc5cb2fcaa085fb5580bcfdfc03459742fa72e8bfb19c74" {
		t.Fatalf("hash(1) %s", h.Hash)
	}
	h = h.Append(`{"time":"2026-01-01T00:00:01.000Z","update":"Secret set","user":"alice","secret":"café","type":"plain"}`)
	if h.Hash.String() != "e89bb0790426987b93e6bc257f1db967f3cea9fcd62cc15e9cbeb63f24ed06fd" {
		t.Fatalf("hash(2) %s", h.Hash)
	}
	sb := logchain.Checkpoint{Count: 2, Head: h.Hash, Time: "2026-01-01T00:00:02.000Z"}.SignedBytes()
	if d := sha256.Sum256(sb); len(sb) != 140 || fmt.Sprintf("%x", d) != "345ebd74c90c27abda49b123b03f62b2a7e25f3ee6dd80b2cac368eb9f65a9be" {
		t.Fatalf("signed bytes %q", sb)
	}
}
