package client_test

import (
	"crypto/rand"
	b64 "encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
)

// serveLog makes f serve entries as GET /api/v2/update-log, signed by the
// fake's root.
func serveLog(t *testing.T, f *fake, entries []string) logchain.Checkpoint {
	t.Helper()
	recs := logchain.Chain(logchain.Head{}, entries)
	cp, err := logchain.Sign(rand.Reader, f.rootKey, logchain.Head{Count: uint64(len(recs)), Hash: recs[len(recs)-1].Hash}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.handle("GET "+v2.PathUpdateLog, func(w http.ResponseWriter, r *http.Request) {
		after, _ := strconv.ParseUint(r.URL.Query().Get(v2.QueryAfter), 10, 64)
		limit, _ := strconv.ParseUint(r.URL.Query().Get(v2.QueryLimit), 10, 64)
		out := v2.UpdateLogPageResponse{Prev: logchain.Hash{}.String(),
			Checkpoint: v2.LogCheckpoint{Count: cp.Count, Head: cp.Head.String(), Time: cp.Time, Signature: cp.Signature}}
		if after > 0 {
			out.Prev = recs[after-1].Hash.String()
		}
		for _, r := range recs[after:min(after+limit, uint64(len(recs)))] {
			out.Entries = append(out.Entries, v2.LogRecord{Seq: r.Seq, Entry: r.Entry, Hash: r.Hash.String()})
		}
		success(out)(w, r)
	})
	return cp
}

func logEntries(n int, who string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"time":"2026-01-01T00:00:00.000Z","update":"Secret set","user":"%s","secret":"s%d","type":"plain"}`, who, i)
	}
	return out
}

// A saved checkpoint that a recorded restore discarded: VerifyUpdateLog
// says so (ErrLogRestored, with where), and still refuses it as an
// extension; without a record it is a plain ErrCheckpointNotExtends.
func TestVerifyUpdateLogExplainsRestore(t *testing.T) {
	f := newFake(t)
	c := pinned(t, f)
	ctx := t.Context()
	old := logEntries(15, "alice")
	saved := serveLog(t, f, old)
	if _, err := c.VerifyUpdateLog(ctx, &saved); err != nil {
		t.Fatalf("the saved checkpoint itself: %v", err)
	}
	at10 := logchain.Chain(logchain.Head{}, old[:10])[9].Hash
	rec := fmt.Sprintf(`{"time":"2026-02-01T00:00:00.000Z","update":"quarry: restored from backup","user":"restore","backupCreated":"2026-01-01T00:00:00Z","restoredCount":10,"restoredHead":"%s","replacedState":"checkpoint","replaced":{"count":%d,"head":"%s","time":"%s","signature":"%s"}}`,
		at10, saved.Count, saved.Head, saved.Time, b64.StdEncoding.EncodeToString(saved.Signature))

	// Restored, with the record, then one more entry.
	serveLog(t, f, append(append(append([]string{}, old[:10]...), rec), logEntries(1, "bob")...))
	_, err := c.VerifyUpdateLog(ctx, &saved)
	var re *client.LogRestoredError
	if !errors.As(err, &re) || !re.Exact || re.Restore.RestoredCount != 10 || re.Restore.Seq != 11 ||
		!errors.Is(err, client.ErrCheckpointNotExtends) || !errors.Is(err, client.ErrLogRestored) ||
		!strings.Contains(err.Error(), "the log was restored from a backup at entry 10, discarding entries 11..15 of your checkpoint") {
		t.Fatalf("restored log: %v", err)
	}
	// Restored to fewer entries than the checkpoint and nothing added yet.
	serveLog(t, f, append(append([]string{}, old[:10]...), rec))
	if _, err := c.VerifyUpdateLog(ctx, &saved); !errors.As(err, &re) || !re.Exact {
		t.Fatalf("restored log, shorter: %v", err)
	}

	// Cut back and rewritten without a record: not explained.
	serveLog(t, f, append(append([]string{}, old[:10]...), logEntries(8, "mallory")...))
	_, err = c.VerifyUpdateLog(ctx, &saved)
	if !errors.Is(err, client.ErrCheckpointNotExtends) || errors.Is(err, client.ErrLogRestored) {
		t.Fatalf("rewritten log: %v", err)
	}
	// The whole log verifies on its own, and is accepted from the start.
	if v, err := c.VerifyUpdateLog(ctx, nil); err != nil || v.Checkpoint.Count != 18 {
		t.Fatalf("whole log: %v", err)
	}
}
