package core

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/logstore"
	"github.com/quarry-cc/quarry/internal/logstore/logstoretest"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

// failingStore fails Save while fail is set.
type failingStore struct {
	store.Store
	fail atomic.Bool
}

var errInjected = errors.New("injected store failure")

func (f *failingStore) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	if f.fail.Load() {
		return "", errInjected
	}
	return f.Store.Save(ctx, blob, prev)
}

func logOptions(data, key store.Store, segs *logstoretest.Segments) Options {
	o := Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}}
	if segs != nil {
		o.LogSegments = segs.Get
	}
	return o
}

// verifyLog reads c's whole log in pages of 50 and verifies it against c's
// root and checkpoint; it returns the records.
func verifyLog(t testing.TB, c *Core) []logchain.Record {
	t.Helper()
	root := c.snap.Load().ca.Root
	var all []logchain.Record
	h := logchain.Head{}
	var cp logchain.Checkpoint
	for {
		p, err := c.UpdateLogPage(context.Background(), h.Count, 50)
		if err != nil {
			t.Fatalf("page after %d: %v", h.Count, err)
		}
		if p.Prev != h.Hash {
			t.Fatalf("page after %d: prev %s, want %s", h.Count, p.Prev, h.Hash)
		}
		cp = p.Checkpoint
		if h, err = logchain.VerifyPage(root, cp, h, p.Records); err != nil {
			t.Fatalf("page after %d: %v", h.Count, err)
		}
		all = append(all, p.Records...)
		if len(p.Records) == 0 {
			break
		}
	}
	if h != cp.HeadOf() {
		t.Fatalf("log ends at %v, checkpoint %v", h, cp.HeadOf())
	}
	legacy, err := c.UpdateLog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range all {
		if !updatelog.IsAudit(r.Entry) {
			want = append(want, r.Entry)
		}
	}
	if !slices.Equal(legacy, want) {
		t.Fatalf("GET update shows %d entries, the verifiable log %d", len(legacy), len(want))
	}
	return all
}

func upload(t testing.TB, c *Core, peer []*x509.Certificate, n int) {
	t.Helper()
	for range n {
		if err := c.SetSecrets(context.Background(), peer, map[string]secrets.Upload{"upload": {Key: make([]byte, 32)}}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLogSegmentsAppendReadRestart(t *testing.T) {
	data, key, segs := memstore.New(), memstore.New(), logstoretest.New()
	c, peer := stateWithSecretsOpts(t, 1, logOptions(data, key, segs))
	upload(t, c, peer, 200)
	recs := verifyLog(t, c)
	if len(recs) != 201 {
		t.Fatalf("%d entries, want 201", len(recs))
	}
	st := c.snap.Load().persisted
	if segs.Stored() < 2 || st.Log.Segments != uint64(segs.Stored()) || len(st.UpdateLog) >= 2*updatelog.SegmentSize {
		t.Fatalf("%d segments stored, state references %d, tail %d", segs.Stored(), st.Log.Segments, len(st.UpdateLog))
	}
	// A restart reads the segments back: the same entries and hashes.
	c2, err := New(context.Background(), logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	if again := verifyLog(t, c2); !slices.Equal(again, recs) {
		t.Fatal("the log read after a restart differs")
	}
}

// A segment written without the state that references it (a crash or a
// failed state write) is ignored, and written again at the next append.
func TestLogSegmentWithoutState(t *testing.T) {
	data := &failingStore{Store: memstore.New()}
	key, segs := memstore.New(), logstoretest.New()
	c, peer := stateWithSecretsOpts(t, 1, logOptions(data, key, segs))
	upload(t, c, peer, updatelog.SegmentSize) // 65 stored entries: the next change writes segment 0
	before := verifyLog(t, c)
	data.fail.Store(true)
	if err := c.SetSecrets(context.Background(), peer, map[string]secrets.Upload{"upload": {Key: make([]byte, 32)}}); !errors.Is(err, errInjected) {
		t.Fatalf("state write failed: %v", err)
	}
	if segs.Stored() != 1 {
		t.Fatalf("%d segments written, want 1", segs.Stored())
	}
	data.fail.Store(false)
	c2, err := New(context.Background(), logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	if got := verifyLog(t, c2); !slices.Equal(got, before) {
		t.Fatalf("after the failed change: %d entries, want the %d before", len(got), len(before))
	}
	upload(t, c2, peer, 1)
	if got := verifyLog(t, c2); len(got) != len(before)+1 || !slices.Equal(got[:len(before)], before) {
		t.Fatal("the next change does not extend the log")
	}
}

func TestLogMissingSegmentIsNamed(t *testing.T) {
	data, key, segs := memstore.New(), memstore.New(), logstoretest.New()
	c, peer := stateWithSecretsOpts(t, 1, logOptions(data, key, segs))
	upload(t, c, peer, 2*updatelog.SegmentSize)
	segs.Set(0, memstore.New())
	c2, err := New(context.Background(), logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.UpdateLog(context.Background()); !errors.Is(err, ErrLogDamaged) {
		t.Fatalf("GET update with a missing segment: %v", err)
	}
	if _, err := c2.UpdateLogPage(context.Background(), 0, 10); !errors.Is(err, ErrLogDamaged) {
		t.Fatalf("GET update-log with a missing segment: %v", err)
	}
	// Segment 1 cannot be checked to continue the missing segment 0, so
	// it is not served either; the error names segment 0.
	_, err = c2.UpdateLogPage(context.Background(), updatelog.SegmentSize+1, 10)
	if !errors.Is(err, ErrLogDamaged) || !strings.Contains(err.Error(), "segment 0 is missing") {
		t.Fatalf("page in the segment after the missing one: %v", err)
	}
	// The entries after it are still served.
	st := c2.snap.Load().persisted
	if st.Log.Segments < 2 {
		t.Fatalf("%d segments; the test needs 2", st.Log.Segments)
	}
	if _, err := c2.UpdateLogPage(context.Background(), 2*updatelog.SegmentSize+1, 10); err != nil {
		t.Fatalf("page two segments after the missing one: %v", err)
	}
}

// spliceSegment replaces stored segment n of c's log with segment n of a
// fork of the same log (same identity and key, as another copy of the
// state would write it): entry fork (1-based) is changed, and the segment
// is chained from the fork's hashes.
func spliceSegment(t *testing.T, c *Core, n uint64, fork int) {
	t.Helper()
	ctx := context.Background()
	st := c.snap.Load().persisted
	all, err := c.logs.Full(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	all = slices.Clone(all)
	all[fork-1] = updatelog.SecretSet(time.Now(), "mallory", "forked", "symmetric-key")
	const size = updatelog.SegmentSize
	recs := logchain.Chain(logchain.Head{}, all)
	prev := logchain.Hash{}
	if n > 0 {
		prev = recs[n*size-1].Hash
	}
	l := *st.Log
	if err := c.logs.WriteSegment(ctx, &l, n, prev, all[n*size:(n+1)*size]); err != nil {
		t.Fatal(err)
	}
}

// TestLogSegmentsMustChain: segments that are each intact and sealed with
// the log's key, but do not chain (a segment from a fork of the log, an
// older copy, or segment 0 of a log that starts elsewhere), are refused
// wherever the Coordinator reads them, naming the broken link; parts of the
// log the broken link does not touch are still served.
func TestLogSegmentsMustChain(t *testing.T) {
	const size = updatelog.SegmentSize
	for _, tc := range []struct {
		name   string
		n      uint64   // the segment replaced
		fork   int      // the entry where the fork differs
		refuse []uint64 // pages of 10 (after) that touch the broken link
		serve  []uint64 // pages of 10 (after) that do not
		text   string   // names the broken link
		alt    string   // or, for a segment with both links broken, this
	}{
		// Segment k holds entries 64k+1 to 64k+64; the page after a holds
		// entries a+1 to a+10 and the hash of entry a; the tail 257 on.
		{"fork before segment 2", 2, 10, []uint64{size + 3, 2*size + 5, 3 * size, 4 * size}, []uint64{3, 4*size + 2}, "segment 2 does not continue segment 1", "segment 3 does not continue segment 2"},
		{"fork inside segment 2", 2, 2*size + 10, []uint64{2*size + 5, 3 * size, 3*size + 8}, []uint64{3, size + 3, 4*size + 2}, "segment 3 does not continue segment 2", ""},
		{"fork inside the last segment", 3, 3*size + 10, []uint64{3 * size, 3*size + 8}, []uint64{size + 3, 2*size + 5, 4*size + 2}, "segment 3, the last, does not end where the state's tail starts", ""},
		{"fork inside segment 0", 0, 3, []uint64{0, 5, size + 3}, []uint64{2*size + 5, 4*size + 2}, "segment 1 does not continue segment 0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, key, segs := memstore.New(), memstore.New(), logstoretest.New()
			c, _ := stateWithSecretsOpts(t, 1, logOptions(data, key, segs))
			growLog(t, c, 4*size+20)
			if got := c.snap.Load().persisted.Log.Segments; got != 4 {
				t.Fatalf("%d segments, want 4", got)
			}
			spliceSegment(t, c, tc.n, tc.fork)
			// A fresh Coordinator on the same stores (no cached segments).
			c2, err := New(context.Background(), logOptions(data, key, segs))
			if err != nil {
				t.Fatal(err)
			}
			check := func(what string, err error) {
				t.Helper()
				named := err != nil && (strings.Contains(err.Error(), tc.text) || tc.alt != "" && strings.Contains(err.Error(), tc.alt))
				if !errors.Is(err, updatelog.ErrSegmentChain) || !errors.Is(err, ErrLogDamaged) || !named {
					t.Errorf("%s: %v, want a broken link: %q", what, err, tc.text)
				}
			}
			_, err = c2.UpdateLog(context.Background())
			check("GET update", err)
			if err != nil && !strings.Contains(err.Error(), tc.text) {
				t.Errorf("GET update names another link than the first: %v", err)
			}
			for _, after := range tc.refuse {
				_, err := c2.UpdateLogPage(context.Background(), after, 10)
				check(fmt.Sprintf("page after %d", after), err)
			}
			for _, after := range tc.serve {
				if _, err := c2.UpdateLogPage(context.Background(), after, 10); err != nil {
					t.Errorf("page after %d: %v", after, err)
				}
			}
			// Each check holds also with the segments cached.
			_, err = c2.UpdateLog(context.Background())
			check("GET update, cached", err)
		})
	}
}

// TestLogSegmentZeroMustStartTheLog: a segment 0 that chains from anything
// but the empty log is refused, even when segment 1 continues it.
func TestLogSegmentZeroMustStartTheLog(t *testing.T) {
	const size = updatelog.SegmentSize
	data, key, segs := memstore.New(), memstore.New(), logstoretest.New()
	c, _ := stateWithSecretsOpts(t, 1, logOptions(data, key, segs))
	growLog(t, c, 2*size+5)
	ctx := context.Background()
	st := c.snap.Load().persisted
	all, err := c.logs.Full(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	// Segment 0 rewritten as if the log had an entry before it, and
	// segment 1 rewritten to continue that segment 0.
	start := logchain.Head{}.Append("an entry before the first").Hash
	seg0 := logchain.Chain(logchain.Head{Hash: start}, all[:size])
	l := *st.Log
	if err := c.logs.WriteSegment(ctx, &l, 0, start, all[:size]); err != nil {
		t.Fatal(err)
	}
	if err := c.logs.WriteSegment(ctx, &l, 1, seg0[size-1].Hash, all[size:2*size]); err != nil {
		t.Fatal(err)
	}
	c2, err := New(ctx, logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c2.UpdateLogPage(ctx, 0, 10)
	if !errors.Is(err, updatelog.ErrSegmentChain) || !strings.Contains(err.Error(), "segment 0 does not start the log") {
		t.Fatalf("segment 0 chained from another entry: %v", err)
	}
}

// TestLogSegmentsReorderedOrDropped: a segment stored under another
// segment's number, or removed, is refused by name.
func TestLogSegmentsReorderedOrDropped(t *testing.T) {
	const size = updatelog.SegmentSize
	data, key, segs := memstore.New(), memstore.New(), logstoretest.New()
	c, _ := stateWithSecretsOpts(t, 1, logOptions(data, key, segs))
	growLog(t, c, 3*size+5)
	ctx := context.Background()
	blob := func(n uint64) []byte {
		s, _ := segs.Get(n)
		b, _, err := s.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	put := func(n uint64, b []byte) {
		s := memstore.New()
		if b != nil {
			if _, err := s.Save(ctx, b, ""); err != nil {
				t.Fatal(err)
			}
		}
		segs.Set(n, s)
	}
	b1, b2 := blob(1), blob(2)
	// Segment 2's blob in place of segment 1, and the reverse.
	put(1, b2)
	put(2, b1)
	c2, err := New(ctx, logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.UpdateLog(ctx); !errors.Is(err, ErrLogDamaged) || !strings.Contains(err.Error(), "segment 1 is segment 2") {
		t.Fatalf("swapped segments: %v", err)
	}
	// Segment 2 dropped.
	put(1, b1)
	put(2, nil)
	c3, err := New(ctx, logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c3.UpdateLog(ctx); !errors.Is(err, ErrLogDamaged) || !strings.Contains(err.Error(), "segment 2 is missing") {
		t.Fatalf("dropped segment: %v", err)
	}
}

// storeOldFormat stores st as a state from before the verifiable log (no
// Log, the whole log in UpdateLog), bypassing prepareLog.
func storeOldFormat(t *testing.T, c *Core, st sealedstate.State) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	st.Log = nil
	plaintext, err := json.Marshal(&st)
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := json.Marshal(c.header)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := seal.Seal(nil, c.dek, hdr, plaintext)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.vault.Commit(context.Background(), blob, c.dek, c.snap.Load().manifest.Config.SealMode, nil); err != nil {
		t.Fatal(err)
	}
}

func TestLogConversionOfOldState(t *testing.T) {
	data, key, segs := memstore.New(), memstore.New(), logstoretest.New()
	// Without segments the whole log stays in the state, as before.
	c, peer := stateWithSecretsOpts(t, 1, logOptions(data, key, nil))
	upload(t, c, peer, 150)
	old := c.snap.Load().persisted
	entries := slices.Clone(old.UpdateLog)
	storeOldFormat(t, c, *old)

	// Loaded twice: the conversion is deterministic (instances sharing a
	// store convert alike), and the old entries start the chain.
	c1, err := New(context.Background(), logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := New(context.Background(), logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := verifyLog(t, c1), verifyLog(t, c2)
	if !slices.Equal(r1, r2) || len(r1) != len(entries) {
		t.Fatalf("conversions differ or lose entries: %d, %d, want %d", len(r1), len(r2), len(entries))
	}
	for i, r := range r1 {
		if r.Entry != entries[i] {
			t.Fatalf("entry %d changed by the conversion", i+1)
		}
	}
	// Nothing is written until the next change (a crash before it finds
	// the old state); that change writes the segments.
	if segs.Stored() != 0 {
		t.Fatalf("%d segments written at load", segs.Stored())
	}
	upload(t, c1, peer, 1)
	if segs.Stored() != len(entries)/updatelog.SegmentSize {
		t.Fatalf("%d segments after the first change, want %d", segs.Stored(), len(entries)/updatelog.SegmentSize)
	}
	c3, err := New(context.Background(), logOptions(data, key, segs))
	if err != nil {
		t.Fatal(err)
	}
	if got := verifyLog(t, c3); len(got) != len(entries)+1 || !slices.Equal(got[:len(entries)], r1) {
		t.Fatal("the converted log is not extended by the change")
	}
}

func TestUpdateLogPageBounds(t *testing.T) {
	c, peer := stateWithSecretsOpts(t, 1, logOptions(memstore.New(), memstore.New(), logstoretest.New()))
	upload(t, c, peer, 3)
	if _, err := c.UpdateLogPage(context.Background(), 5, 1); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("after beyond the log: %v", err)
	}
	p, err := c.UpdateLogPage(context.Background(), 4, 1)
	if err != nil || len(p.Records) != 0 || p.Checkpoint.Count != 4 {
		t.Fatalf("after the last entry: %v %+v", err, p)
	}
	// limit 0 and limits above the maximum are refused, naming the
	// bounds, rather than quietly changed.
	for _, limit := range []uint64{0, MaxLogPage + 1, 1 << 63} {
		_, err := c.UpdateLogPage(context.Background(), 0, limit)
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "must be 1 to 10000") {
			t.Fatalf("limit %d: %v", limit, err)
		}
	}
	if p, err := c.UpdateLogPage(context.Background(), 0, MaxLogPage); err != nil || len(p.Records) != 4 {
		t.Fatalf("limit %d: %v %+v", MaxLogPage, err, p)
	}
	p, err = c.UpdateLogPage(context.Background(), 1, 2)
	if err != nil || len(p.Records) != 2 || p.Records[0].Seq != 2 {
		t.Fatalf("middle page: %v %+v", err, p)
	}
}

// growLog makes c's log n entries long: full segments written directly and
// the rest in the tail (the setup of the benchmarks).
func growLog(tb testing.TB, c *Core, n int) {
	tb.Helper()
	ctx := context.Background()
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	st := *s.persisted
	l := *st.Log
	all := slices.Clone(st.UpdateLog)
	now := time.Now()
	for i := len(all); i < n; i++ {
		all = append(all, updatelog.SecretSet(now, "alice", fmt.Sprintf("s%d", i), "symmetric-key"))
	}
	const size = updatelog.SegmentSize
	recs := logchain.Chain(logchain.Head{}, all)
	k := uint64(len(all) / size)
	for i := range k {
		prev := logchain.Hash{}
		if i > 0 {
			prev = recs[i*size-1].Hash
		}
		if err := c.logs.WriteSegment(ctx, &l, i, prev, all[i*size:(i+1)*size]); err != nil {
			tb.Fatal(err)
		}
	}
	if k > 0 {
		l.TailPrev = recs[k*size-1].Hash
	}
	l.Segments, l.Count, l.Head = k, uint64(len(all)), recs[len(recs)-1].Hash
	st.UpdateLog = slices.Clone(all[k*size:])
	key, err := x509.ParseECPrivateKey(st.CA.RootKey)
	if err != nil {
		tb.Fatal(err)
	}
	if l.Checkpoint, err = logchain.Sign(nil, key, l.Chain(), now); err != nil {
		tb.Fatal(err)
	}
	st.Log = &l
	if err := c.commit(ctx, &st, c.header, c.dek, s.manifest.Config.SealMode); err != nil {
		tb.Fatal(err)
	}
	next := *s
	next.persisted = &st
	c.snap.Store(&next)
}

func TestGrowLogVerifies(t *testing.T) {
	c, peer := stateWithSecretsOpts(t, 1, logOptions(memstore.New(), memstore.New(), logstoretest.New()))
	growLog(t, c, 1000)
	upload(t, c, peer, 1)
	if got := verifyLog(t, c); len(got) != 1001 {
		t.Fatalf("%d entries", len(got))
	}
}

// BenchmarkLogStateChange measures a state change (a secret upload: one
// entry) with a log of 10, 10,000 and 1,000,000 entries: the cost does not
// grow with the log.
func BenchmarkLogStateChange(b *testing.B) {
	for _, n := range []int{10, 10_000, 1_000_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			c, peer := stateWithSecretsOpts(b, 10, logOptions(memstore.New(), memstore.New(), logstoretest.New()))
			growLog(b, c, n)
			upload := map[string]secrets.Upload{"upload": {Key: make([]byte, 32)}}
			b.ResetTimer()
			for b.Loop() {
				if err := c.SetSecrets(context.Background(), peer, upload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLogLastPage measures GET /api/v2/update-log's use case for the
// last 100 entries of a log of 1,000,000 (segments cached, and cold).
func BenchmarkLogLastPage(b *testing.B) {
	c, _ := stateWithSecretsOpts(b, 10, logOptions(memstore.New(), memstore.New(), logstoretest.New()))
	growLog(b, c, 1_000_000)
	after := c.snap.Load().persisted.Log.Count - 100
	for _, cold := range []bool{false, true} {
		b.Run(fmt.Sprintf("cold=%v", cold), func(b *testing.B) {
			for b.Loop() {
				if cold {
					c.logs = logstore.New(c.opts.LogSegments, c.opts.Now)
				}
				p, err := c.UpdateLogPage(context.Background(), after, 100)
				if err != nil || len(p.Records) != 100 {
					b.Fatal(err)
				}
			}
		})
	}
}

// Marble activity (activations of types with MaxActivations, counter
// increments) changes the state without entries; the next change records
// it as counts, in the verifiable log only.
func TestLogRecordsMarbleActivityAsCounts(t *testing.T) {
	c, peer := stateWithSecretsOpts(t, 1, logOptions(memstore.New(), memstore.New(), logstoretest.New()))
	activity := func(activations map[string]uint64, increments int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for range increments {
			s := c.snap.Load()
			st := *s.persisted
			st.Activations = maps.Clone(activations)
			st.Log = st.Log.Counted()
			if err := c.persist(context.Background(), s, &st); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := verifyLog(t, c)
	activity(map[string]uint64{"m": 3}, 5)
	if got := verifyLog(t, c); len(got) != len(before) {
		t.Fatalf("activity alone added %d entries", len(got)-len(before))
	}
	upload(t, c, peer, 1)
	activity(map[string]uint64{"m": 4}, 1)
	upload(t, c, peer, 2)
	recs := verifyLog(t, c)
	var usage []map[string]any
	for _, r := range recs {
		if strings.Contains(r.Entry, updatelog.MsgMarbleUsage) {
			var e map[string]any
			if err := json.Unmarshal([]byte(r.Entry), &e); err != nil {
				t.Fatal(err)
			}
			usage = append(usage, e)
		}
	}
	if len(recs) != len(before)+5 || len(usage) != 2 {
		t.Fatalf("%d entries (want %d), %d activity entries (want 2)", len(recs), len(before)+5, len(usage))
	}
	if fmt.Sprint(usage[0]["activations"], usage[0]["counterIncrements"]) != "map[m:3] 5" ||
		fmt.Sprint(usage[1]["activations"], usage[1]["counterIncrements"]) != "map[m:1] 1" {
		t.Fatalf("activity entries %v", usage)
	}
}

// Outside state 3 the verifiable log is refused with the wrong state
// (409), naming what was asked for.
func TestUpdateLogPageOutsideState3(t *testing.T) {
	c := newCore(t, newStores())
	_, err := c.UpdateLogPage(context.Background(), 0, 1)
	var ws *WrongStateError
	if !errors.As(err, &ws) || ws.State != StateAcceptingManifest ||
		!strings.Contains(err.Error(), "cannot read the verifiable update log in state 2") {
		t.Fatalf("state 2: %v", err)
	}
}
