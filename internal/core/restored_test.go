package core

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/logstore/logstoretest"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

// put replaces the blob in s (as a restore or a host does).
func put(t testing.TB, s store.Store, b []byte) {
	t.Helper()
	_, rev, err := s.Load(context.Background())
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := s.Save(context.Background(), b, rev); err != nil {
		t.Fatal(err)
	}
}

// headerCheckpoint reads the checkpoint in a sealed state's public header.
func headerCheckpoint(t testing.TB, blob []byte) *logchain.Checkpoint {
	t.Helper()
	hdr, err := seal.ReadHeader(blob)
	if err != nil {
		t.Fatal(err)
	}
	return updatelog.CheckpointInHeader(hdr)
}

// restoreFixture is a Coordinator whose log went from a backup's 70
// entries to 150, and the files of both moments.
type restoreFixture struct {
	opts                  Options
	data, key, markers    *memstore.Store
	backupData, backupKey []byte
	replacedData          []byte
	// replaced is the checkpoint a client saved last, of 150 entries.
	replaced    logchain.Checkpoint
	peer        []*x509.Certificate
	backupCount uint64
}

func newRestoreFixture(t *testing.T) *restoreFixture {
	t.Helper()
	f := &restoreFixture{data: memstore.New(), key: memstore.New(), markers: memstore.New()}
	f.opts = logOptions(f.data, f.key, logstoretest.New())
	f.opts.RestoreMarker = f.markers
	c, peer := stateWithSecretsOpts(t, 1, f.opts)
	f.peer = peer
	upload(t, c, peer, 69) // 70 entries: segment 0 and a tail
	f.backupData, f.backupKey = load(t, f.data), load(t, f.key)
	f.backupCount = c.snap.Load().persisted.Log.Count
	upload(t, c, peer, 80) // 150 entries: segments 0 and 1
	f.replacedData = load(t, f.data)
	f.replaced = c.snap.Load().persisted.Log.Checkpoint
	// Every commit puts the log's checkpoint in the public header.
	if cp := headerCheckpoint(t, f.replacedData); cp == nil || cp.HeadOf() != f.replaced.HeadOf() || cp.Time != f.replaced.Time {
		t.Fatalf("the header holds checkpoint %+v, the state %+v", cp, f.replaced)
	}
	return f
}

// restore puts the backup's files back with marker m, as `coordinator
// restore` does while the Coordinator is stopped.
func (f *restoreFixture) restore(t *testing.T, m *updatelog.RestoreMarker) {
	t.Helper()
	put(t, f.data, f.backupData)
	put(t, f.key, f.backupKey)
	if m != nil {
		b, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		put(t, f.markers, b)
	}
}

func (f *restoreFixture) marker(t *testing.T, replaced *logchain.Checkpoint) *updatelog.RestoreMarker {
	t.Helper()
	m := &updatelog.RestoreMarker{BackupCreated: "2026-01-02T03:04:05Z", SealedData: fingerprint(f.backupData), ReplacedState: logchain.ReplacedNone}
	if replaced != nil {
		m.ReplacedState, m.Replaced = logchain.ReplacedCheckpoint, replaced
	}
	return m
}

func restoreRecords(recs []logchain.Record) []logchain.RestoreRecord {
	var out []logchain.RestoreRecord
	for _, r := range recs {
		if rr, ok := logchain.ParseRestore(r); ok {
			out = append(out, rr)
		}
	}
	return out
}

// The start that opens a restored state records the restore right after
// the restored entries: what was restored and the checkpoint it replaced
// (signed by this root). A client holding that checkpoint is told that
// the log was restored, not just that it does not extend; the marker is
// set aside, and a restart records nothing more. The log goes on, and the
// segment the discarded entries had filled is written again.
func TestRestoreRecordedAtNextStart(t *testing.T) {
	ctx := context.Background()
	f := newRestoreFixture(t)
	hdr := headerCheckpoint(t, f.replacedData)
	f.restore(t, f.marker(t, hdr))
	c, err := New(ctx, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	recs := verifyLog(t, c)
	if uint64(len(recs)) != f.backupCount+1 {
		t.Fatalf("%d entries after the restore, want the backup's %d and the record", len(recs), f.backupCount)
	}
	got := restoreRecords(recs)
	if len(got) != 1 {
		t.Fatalf("%d restore records", len(got))
	}
	r := got[0]
	if r.Seq != f.backupCount+1 || r.RestoredCount != f.backupCount || r.RestoredHead != recs[f.backupCount-1].Hash ||
		r.BackupCreated != "2026-01-02T03:04:05Z" || r.ReplacedState != logchain.ReplacedCheckpoint ||
		r.Replaced.HeadOf() != f.replaced.HeadOf() || r.Replaced.Verify(c.snap.Load().ca.Root) != nil {
		t.Fatalf("restore record %+v", r)
	}
	// The record's exact form (docs/update-log.md).
	var e map[string]json.RawMessage
	if err := json.Unmarshal([]byte(recs[r.Seq-1].Entry), &e); err != nil {
		t.Fatal(err)
	}
	if string(e["user"]) != `"restore"` || string(e["restoredHead"]) != `"`+hex.EncodeToString(r.RestoredHead[:])+`"` {
		t.Fatalf("entry %s", recs[r.Seq-1].Entry)
	}
	if !strings.HasPrefix(recs[r.Seq-1].Entry, `{"time":"`) || !updatelog.IsAudit(recs[r.Seq-1].Entry) {
		t.Fatalf("the record is not one of Quarry's own entries: %s", recs[r.Seq-1].Entry)
	}
	// The client's view.
	why := logchain.ExplainNotExtension(c.snap.Load().ca.Root, f.replaced, recs)
	if why == nil || !why.Exact || !errors.Is(why, logchain.ErrNotExtension) || !errors.Is(why, logchain.ErrRestored) ||
		!strings.Contains(why.Error(), "the log was restored from a backup at entry 70, discarding entries 71..150 of your checkpoint") {
		t.Fatalf("explanation %v", why)
	}
	if _, _, err := f.markers.Load(ctx); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the marker is still in place: %v", err)
	}
	// The log goes on past the discarded segment 1.
	upload(t, c, f.peer, 80)
	recs = verifyLog(t, c)
	c2, err := New(ctx, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	if again := verifyLog(t, c2); len(again) != len(recs) || len(restoreRecords(again)) != 1 {
		t.Fatalf("after a restart %d entries (%d restore records), before %d", len(again), len(restoreRecords(again)), len(recs))
	}
}

// A marker the host wrote is trusted no further than it can be checked: a
// marker for another sealed_data records nothing and is set aside; a
// replaced checkpoint not signed by this root is recorded as unknown; one
// that does not parse records nothing.
func TestRestoreMarkerChecked(t *testing.T) {
	ctx := context.Background()
	other, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("another sealed_data", func(t *testing.T) {
		f := newRestoreFixture(t)
		m := f.marker(t, nil)
		m.SealedData = fingerprint(f.replacedData)
		f.restore(t, m)
		c, err := New(ctx, f.opts)
		if err != nil {
			t.Fatal(err)
		}
		if recs := verifyLog(t, c); uint64(len(recs)) != f.backupCount || len(restoreRecords(recs)) != 0 {
			t.Fatalf("%d entries, %d restore records", len(recs), len(restoreRecords(recs)))
		}
		if _, _, err := f.markers.Load(ctx); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the stale marker is still in place: %v", err)
		}
	})
	t.Run("replaced checkpoint of another root", func(t *testing.T) {
		f := newRestoreFixture(t)
		forged, err := logchain.Sign(rand.Reader, other, f.replaced.HeadOf(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		f.restore(t, f.marker(t, &forged))
		c, err := New(ctx, f.opts)
		if err != nil {
			t.Fatal(err)
		}
		got := restoreRecords(verifyLog(t, c))
		if len(got) != 1 || got[0].ReplacedState != logchain.ReplacedUnknown || got[0].Replaced != nil {
			t.Fatalf("restore records %+v", got)
		}
		// The client is told that what was discarded is not known.
		why := logchain.ExplainNotExtension(c.snap.Load().ca.Root, f.replaced, verifyLog(t, c))
		if why == nil || why.Exact || !strings.Contains(why.Error(), "what it discarded is not known; your checkpoint's entries 71..150 are not in this log") {
			t.Fatalf("explanation %v", why)
		}
	})
	t.Run("not a marker", func(t *testing.T) {
		f := newRestoreFixture(t)
		f.restore(t, nil)
		put(t, f.markers, []byte(`{"format":"quarry-restore-marker/v1","sealedData":"`+fingerprint(f.backupData)+`"}`))
		c, err := New(ctx, f.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := restoreRecords(verifyLog(t, c)); len(got) != 0 {
			t.Fatalf("restore records %+v", got)
		}
	})
}

// When the record cannot be stored the start fails and the marker stays:
// the next start records the restore, right after the restored entries.
func TestRestoreRecordFailureStopsStart(t *testing.T) {
	ctx := context.Background()
	f := newRestoreFixture(t)
	f.restore(t, f.marker(t, headerCheckpoint(t, f.replacedData)))
	failing := &failingStore{Store: f.data}
	failing.fail.Store(true)
	opts := f.opts
	opts.Data = failing
	if _, err := New(ctx, opts); err == nil || !strings.Contains(err.Error(), "recording the restore from a backup in the update log") {
		t.Fatalf("start with a failing store: %v", err)
	}
	if _, _, err := f.markers.Load(ctx); err != nil {
		t.Fatalf("the marker is gone: %v", err)
	}
	c, err := New(ctx, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := restoreRecords(verifyLog(t, c)); len(got) != 1 || got[0].Seq != f.backupCount+1 {
		t.Fatalf("restore records %+v", got)
	}
}

// A restored state that another machine's sealing key does not open is
// recovered with the recovery secrets; the recovery records the restore
// before itself.
func TestRestoreRecordedByRecovery(t *testing.T) {
	ctx := context.Background()
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 1)}
	e := &faultEnv{w: w, dir: t.TempDir()}
	e.open(t)
	e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1})
	blob, _ := e.files(t)
	m := updatelog.RestoreMarker{BackupCreated: "2026-01-02T03:04:05Z", SealedData: fingerprint(blob), ReplacedState: logchain.ReplacedNone}
	raw, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	markers, err := filestore.New(e.dir, updatelog.RestoreMarkerFile)
	if err != nil {
		t.Fatal(err)
	}
	put(t, markers, raw)
	e.breakKey(t)
	data, key := e.stores(t)
	c, err := New(ctx, Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}, EphemeralKeyBits: 1024, RestoreMarker: markers})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status() != StateRecovery {
		t.Fatalf("state %d", c.Status())
	}
	if _, _, err := markers.Load(ctx); err != nil {
		t.Fatalf("recovery mode touched the marker: %v", err)
	}
	p := e.plain["r0"]
	if _, err := c.Recover(ctx, p, signSecret(w.rec[0], p)); err != nil {
		t.Fatal(err)
	}
	recs := verifyLog(t, c)
	n := len(recs)
	if n != 3 {
		t.Fatalf("%d entries, want the manifest set, the restore and the recovery", n)
	}
	got := restoreRecords(recs)
	if len(got) != 1 || got[0].Seq != 2 || got[0].RestoredCount != 1 || got[0].ReplacedState != logchain.ReplacedNone ||
		!strings.Contains(recs[2].Entry, updatelog.MsgRecovered) {
		t.Fatalf("restore records %+v; last entry %s", got, recs[2].Entry)
	}
	if _, _, err := markers.Load(ctx); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the marker is still in place: %v", err)
	}
}
