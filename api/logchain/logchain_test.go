package logchain_test

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/testpki"
)

// root returns a self-signed ECDSA root and its key.
func root(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	c := testpki.NewCA(t, "root")
	return c.Cert, c.ECDSA(t)
}

func entries(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"time":"2026-01-01T00:00:%02d.000Z","update":"Secret set","user":"alice","secret":"s%d","type":"plain"}`, i%60, i)
	}
	return out
}

func signed(t testing.TB, k *ecdsa.PrivateKey, recs []logchain.Record) logchain.Checkpoint {
	t.Helper()
	h := logchain.Head{}
	if len(recs) > 0 {
		h = logchain.Head{Count: recs[len(recs)-1].Seq, Hash: recs[len(recs)-1].Hash}
	}
	cp, err := logchain.Sign(rand.Reader, k, h, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

func TestVerifyPageAcceptsTheLog(t *testing.T) {
	r, k := root(t)
	recs := logchain.Chain(logchain.Head{}, entries(10))
	cp := signed(t, k, recs)
	h, err := logchain.VerifyPage(r, cp, logchain.Head{}, recs)
	if err != nil || h != cp.HeadOf() {
		t.Fatalf("whole log: %v, head %v want %v", err, h, cp.HeadOf())
	}
	// Two pages, the second from the first's head.
	h, err = logchain.VerifyPage(r, cp, logchain.Head{}, recs[:4])
	if err != nil || h.Count != 4 {
		t.Fatalf("first page: %v %v", err, h)
	}
	if h, err = logchain.VerifyPage(r, cp, h, recs[4:]); err != nil || h != cp.HeadOf() {
		t.Fatalf("second page: %v %v", err, h)
	}
}

// Every single-byte change of every stored entry is detected and named.
func TestEverySingleByteChangeIsDetected(t *testing.T) {
	r, k := root(t)
	recs := logchain.Chain(logchain.Head{}, entries(5))
	cp := signed(t, k, recs)
	n := 0
	for i := range recs {
		for j := range len(recs[i].Entry) {
			bad := slices.Clone(recs)
			b := []byte(bad[i].Entry)
			b[j] ^= 0x01
			bad[i].Entry = string(b)
			_, err := logchain.VerifyPage(r, cp, logchain.Head{}, bad)
			if !errors.Is(err, logchain.ErrEntryAltered) {
				t.Fatalf("entry %d byte %d changed: %v", i+1, j, err)
			}
			// With the hashes recomputed, the signed head tells.
			re := logchain.Chain(logchain.Head{}, entryStrings(bad))
			if _, err := logchain.VerifyPage(r, cp, logchain.Head{}, re); !errors.Is(err, logchain.ErrHeadMismatch) {
				t.Fatalf("entry %d byte %d changed, hashes recomputed: %v", i+1, j, err)
			}
			n++
		}
	}
	t.Logf("%d single-byte changes detected", n)
}

func entryStrings(recs []logchain.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Entry
	}
	return out
}

func TestRemovedAndReorderedEntriesAreNamed(t *testing.T) {
	r, k := root(t)
	recs := logchain.Chain(logchain.Head{}, entries(6))
	cp := signed(t, k, recs)
	removed := slices.Delete(slices.Clone(recs), 2, 3)
	if _, err := logchain.VerifyPage(r, cp, logchain.Head{}, removed); !errors.Is(err, logchain.ErrEntryMissing) {
		t.Fatalf("removed entry: %v", err)
	}
	// Removed and renumbered, hashes recomputed: the signed head tells.
	re := logchain.Chain(logchain.Head{}, entryStrings(removed))
	if _, err := logchain.VerifyPage(r, cp, logchain.Head{}, re); err != nil {
		// The page ends before the checkpoint's count, so it is only a
		// prefix; the whole-log check (client.VerifyUpdateLog) requires
		// reaching the checkpoint's count and head.
		t.Fatalf("renumbered prefix: %v", err)
	}
	swapped := slices.Clone(recs)
	swapped[1], swapped[2] = swapped[2], swapped[1]
	if _, err := logchain.VerifyPage(r, cp, logchain.Head{}, swapped); !errors.Is(err, logchain.ErrEntriesReordered) {
		t.Fatalf("reordered entries: %v", err)
	}
	// Reordered entries keeping their places' numbers: the hashes tell.
	relabeled := slices.Clone(swapped)
	relabeled[1].Seq, relabeled[2].Seq = 2, 3
	if _, err := logchain.VerifyPage(r, cp, logchain.Head{}, relabeled); !errors.Is(err, logchain.ErrEntryAltered) {
		t.Fatalf("reordered and renumbered entries: %v", err)
	}
	// Reordered with recomputed hashes: the head tells.
	re = logchain.Chain(logchain.Head{}, entryStrings(swapped))
	if _, err := logchain.VerifyPage(r, cp, logchain.Head{}, re); !errors.Is(err, logchain.ErrHeadMismatch) {
		t.Fatalf("reordered, hashes recomputed: %v", err)
	}
}

func TestCheckpointByAnotherRoot(t *testing.T) {
	r, _ := root(t)
	_, other := root(t)
	recs := logchain.Chain(logchain.Head{}, entries(3))
	cp := signed(t, other, recs)
	if _, err := logchain.VerifyPage(r, cp, logchain.Head{}, recs); !errors.Is(err, logchain.ErrCheckpointSignature) {
		t.Fatalf("checkpoint by another root: %v", err)
	}
	// A checkpoint changed after signing.
	_, k := root(t)
	r2 := mustRoot(t, k)
	cp = signed(t, k, recs)
	cp.Count++
	if err := cp.Verify(r2); !errors.Is(err, logchain.ErrCheckpointSignature) {
		t.Fatalf("changed checkpoint: %v", err)
	}
}

func mustRoot(t *testing.T, k *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	return testpki.SelfSigned(t, "", testpki.Key(k)).Cert
}

func TestExtension(t *testing.T) {
	r, k := root(t)
	all := entries(9)
	recs := logchain.Chain(logchain.Head{}, all)
	earlier := signed(t, k, recs[:4])
	later := signed(t, k, recs)
	if err := logchain.VerifyExtension(r, earlier, later, recs[4:]); err != nil {
		t.Fatalf("true extension: %v", err)
	}
	if err := logchain.VerifyExtension(r, earlier, earlier, nil); err != nil {
		t.Fatalf("a checkpoint extends itself: %v", err)
	}
	// A forked history: entry 3 differs, the rest rebuilt and re-signed.
	forked := slices.Clone(all)
	forked[2] = `{"time":"2026-01-01T00:00:02.000Z","update":"Secret set","user":"mallory","secret":"s2","type":"plain"}`
	frecs := logchain.Chain(logchain.Head{}, forked)
	flater := signed(t, k, frecs)
	if err := logchain.VerifyExtension(r, earlier, flater, frecs[4:]); !errors.Is(err, logchain.ErrNotExtension) {
		t.Fatalf("forked history: %v", err)
	}
	// A truncated log: the later checkpoint is shorter.
	if err := logchain.VerifyExtension(r, later, earlier, nil); !errors.Is(err, logchain.ErrNotExtension) {
		t.Fatalf("truncated log: %v", err)
	}
	// Same count, other head.
	if err := logchain.VerifyExtension(r, later, flater, nil); !errors.Is(err, logchain.ErrNotExtension) {
		t.Fatalf("same count, another head: %v", err)
	}
	_, other := root(t)
	if err := logchain.VerifyExtension(r, earlier, signed(t, other, recs), recs[4:]); !errors.Is(err, logchain.ErrCheckpointSignature) {
		t.Fatalf("later checkpoint by another root: %v", err)
	}
}

func TestParseHash(t *testing.T) {
	h := logchain.Next(logchain.Hash{}, 1, "x")
	got, err := logchain.ParseHash(h.String())
	if err != nil || got != h {
		t.Fatalf("round trip: %v", err)
	}
	for _, bad := range []string{"", "00", h.String() + "00", "zz" + h.String()[2:]} {
		if _, err := logchain.ParseHash(bad); !errors.Is(err, logchain.ErrBadHash) {
			t.Errorf("ParseHash(%q): %v", bad, err)
		}
	}
}

// FuzzVerifyRecords: a changed entry never verifies against the original
// hashes, and VerifyRecords never panics.
func FuzzVerifyRecords(f *testing.F) {
	f.Add(`{"update":"x"}`, uint8(0), uint8(1))
	f.Add("", uint8(3), uint8(255))
	base := entries(4)
	recs := logchain.Chain(logchain.Head{}, base)
	f.Fuzz(func(t *testing.T, entry string, pos, seqDelta uint8) {
		bad := slices.Clone(recs)
		i := int(pos) % len(bad)
		bad[i].Entry = entry
		bad[i].Seq += uint64(seqDelta % 3)
		_, err := logchain.VerifyRecords(logchain.Head{}, bad)
		if err == nil && (entry != base[i] || seqDelta%3 != 0) {
			t.Fatalf("changed record %d (%q, seq +%d) verified", i, entry, seqDelta%3)
		}
	})
}

// TestSplicedLogIsRefused: entries 65 on taken from a fork of the log (the
// same first 64 entries, then other ones, each part chained correctly in
// its own copy) are refused where the copies meet, whatever hashes the
// records carry, and a fork that is re-chained onto this log's entry 64 does
// not reach the signed head.
func TestSplicedLogIsRefused(t *testing.T) {
	r, k := root(t)
	mine := entries(128)
	theirs := slices.Clone(mine)
	theirs[70] = `{"time":"2026-01-01T00:00:00.000Z","update":"Secret set","user":"mallory","secret":"x","type":"plain"}`
	theirs[10] = `{"time":"2026-01-01T00:00:00.000Z","update":"Secret set","user":"mallory","secret":"y","type":"plain"}`
	a, b := logchain.Chain(logchain.Head{}, mine), logchain.Chain(logchain.Head{}, theirs)
	cp := signed(t, k, a)
	spliced := append(slices.Clone(a[:64]), b[64:]...)
	_, err := logchain.VerifyPage(r, cp, logchain.Head{}, spliced)
	if !errors.Is(err, logchain.ErrEntryAltered) || !strings.Contains(err.Error(), "entry 65 does not chain from entry 64") {
		t.Fatalf("spliced at 64: %v", err)
	}
	// The fork's entries re-chained from this log's entry 64: each hash
	// matches, the head does not.
	rechained := append(slices.Clone(a[:64]), logchain.Chain(logchain.Head{Count: 64, Hash: a[63].Hash}, theirs[64:])...)
	if _, err := logchain.VerifyPage(r, cp, logchain.Head{}, rechained); !errors.Is(err, logchain.ErrHeadMismatch) {
		t.Fatalf("fork re-chained onto entry 64: %v", err)
	}
}
