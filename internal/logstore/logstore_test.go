package logstore

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/logstore/logstoretest"
	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/internal/testpki"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

func newState(t *testing.T, entries int) *sealedstate.State {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	st := &sealedstate.State{Format: sealedstate.Format, State: sealedstate.Running, RootSecret: []byte("root secret")}
	st.CA.RootKey = der
	for i := range entries {
		st.UpdateLog = append(st.UpdateLog, fmt.Sprintf(`{"entry":%d}`, i))
	}
	return st
}

// TestPrepareSegmentsAndClock: a new log signs its head with the injected
// clock; once its entries are stored, a flushing Prepare moves the full
// segments out of the state, and Records serves them again with the tail.
// A missing segment is ErrDamaged.
func TestPrepareSegmentsAndClock(t *testing.T) {
	const size = updatelog.SegmentSize
	now := time.Date(2031, 2, 3, 4, 5, 6, 0, time.UTC)
	segs := logstoretest.New()
	ls := New(segs.Get, func() time.Time { return now })
	st := newState(t, 2*size+3)
	all := append([]string(nil), st.UpdateLog...)
	ctx := context.Background()

	if err := ls.Prepare(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	// A new log: its entries were not stored yet, so no segment is written.
	if st.Log == nil || st.Log.Segments != 0 || len(st.UpdateLog) != len(all) || segs.Stored() != 0 {
		t.Fatalf("fresh log: %+v, %d in the tail, %d segments stored", st.Log, len(st.UpdateLog), segs.Stored())
	}
	if got, want := st.Log.Checkpoint.Time, now.Format(logchain.TimeFormat); got != want {
		t.Errorf("checkpoint time %s, want the injected clock's %s", got, want)
	}
	if st.Log.Checkpoint.Count != uint64(len(all)) {
		t.Errorf("checkpoint count %d, want %d", st.Log.Checkpoint.Count, len(all))
	}

	if err := ls.Prepare(ctx, st, true); err != nil {
		t.Fatal(err)
	}
	if st.Log.Segments != 2 || len(st.UpdateLog) != 3 || segs.Stored() != 2 || st.Log.Count != uint64(len(all)) {
		t.Fatalf("after flush: %d segments (%d stored), %d in the tail, count %d", st.Log.Segments, segs.Stored(), len(st.UpdateLog), st.Log.Count)
	}
	full, err := ls.Full(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(full) != fmt.Sprint(all) {
		t.Errorf("the log read back differs:\n%q\nwant\n%q", full, all)
	}

	// A cold reader (no cache) finds segment 1 missing.
	segs.Set(1, memstore.New())
	if _, err := New(segs.Get, time.Now).Records(ctx, st, 0, st.Log.Count); !errors.Is(err, ErrDamaged) {
		t.Errorf("missing segment: %v, want ErrDamaged", err)
	}
}

// TestKnownRootKeySignsWithoutParsing: a root key handed over with
// KnowRootKey signs the checkpoint of a state whose CA holds that DER
// without parsing it again (here the DER is not a key at all, which parsing
// would refuse), and the checkpoint verifies against that key; a state with
// another root key is parsed as before.
func TestKnownRootKeySignsWithoutParsing(t *testing.T) {
	ctx := context.Background()
	st := newState(t, 3)
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ls := New(nil, time.Now)
	st.CA.RootKey = []byte("the known root key, not DER")
	ls.KnowRootKey(st.CA.RootKey, key)
	if err := ls.Prepare(ctx, st, false); err != nil {
		t.Fatalf("with the known key: %v", err)
	}
	root := testpki.NewCA(t, "root", testpki.Key(key)).Cert
	if err := st.Log.Checkpoint.Verify(root); err != nil {
		t.Errorf("the checkpoint does not verify against the known key: %v", err)
	}

	other := newState(t, 1)
	other.CA.RootKey = []byte("another root key, not DER either")
	if err := ls.Prepare(ctx, other, false); err == nil {
		t.Error("a state with an unknown root key that is not DER was signed")
	}
}
