// Package logstore keeps the update log (docs/update-log.md) beside the
// sealed state:
// full segments of updatelog.SegmentSize entries, each sealed in a store of
// its own (New's segments), written once and never changed; the
// entries after the last full segment (the tail) and the head (count, hash,
// segment count, signed checkpoint) stay in the sealed state
// (sealedstate.State.UpdateLog and .Log).
//
// A change appends its entries to the tail. At the next commit, the
// segments that the tail's already stored entries fill are written first,
// then the state that references them (crash-safe: a segment that no state
// references is ignored and written again; a stored state never references
// a segment that is not stored). Only entries that a stored state already
// holds go into segments, so that instances racing on a shared store write
// identical segments: every stored state is on one linear history. A
// change therefore writes the state (with a tail of at most
// SegmentSize-1 stored entries plus its own) and, once every SegmentSize
// entries, one segment: its cost does not grow with the log's length.
package logstore

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

// marbleUsage returns the entry that records the activations (of Marbles
// with MaxActivations) and counter increments since the log last recorded
// them, and updates l's record; "" when there were none.
func marbleUsage(l *sealedstate.Log, activations map[string]uint64, now time.Time) string {
	since := map[string]uint64{}
	for t, n := range activations {
		if d := n - l.RecordedActivations[t]; n > l.RecordedActivations[t] {
			since[t] = d
		}
	}
	incs := l.CounterIncrements - l.RecordedIncrements
	if len(since) == 0 && incs == 0 {
		return ""
	}
	l.RecordedActivations = maps.Clone(activations)
	l.RecordedIncrements = l.CounterIncrements
	return updatelog.MarbleUsage(now, since, incs)
}

// segmentCacheSize bounds the decoded segments kept in memory.
const segmentCacheSize = 256

// Store reads and writes the segments, with a cache of decoded ones
// (segments never change once a state references them). It is safe for
// concurrent reads (Records, Full); Prepare and WriteSegment are called by
// one writer at a time (the core, under its state lock).
type Store struct {
	// segments returns the store of segment n; nil keeps the whole log in
	// the state (no segments).
	segments func(n uint64) (store.Store, error)
	// now is the clock of the checkpoints and of the Marble activity
	// entries.
	now func() time.Time

	// mu guards cacheID, cache, rootDER and rootKey.
	mu      sync.Mutex
	cacheID []byte
	cache   map[uint64][]logchain.Record
	// rootDER and rootKey cache the parsed root key.
	rootDER []byte
	rootKey *ecdsa.PrivateKey
}

// New returns a Store whose segment n is kept in segments(n) (nil: the
// whole log stays in the state), dating with now.
func New(segments func(n uint64) (store.Store, error), now func() time.Time) *Store {
	return &Store{segments: segments, now: now}
}

// ErrDamaged means a stored segment of the update log is missing or
// does not open.
var ErrDamaged = errors.New("the stored update log is damaged")

// signer returns the parsed root key of the state.
func (ls *Store) signer(der []byte) (*ecdsa.PrivateKey, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.rootKey != nil && string(ls.rootDER) == string(der) {
		return ls.rootKey, nil
	}
	k, err := x509.ParseECPrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("root key: %w", err)
	}
	ls.rootDER, ls.rootKey = slices.Clone(der), k
	return k, nil
}

// KnowRootKey hands the store the parsed root key whose DER form a state's
// CA.RootKey holds, so that signing the first checkpoint under a new root
// (a new manifest) does not parse the key again: parsing a P-384 key
// recomputes its public point, a third of a millisecond.
func (ls *Store) KnowRootKey(der []byte, key *ecdsa.PrivateKey) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.rootDER, ls.rootKey = slices.Clone(der), key
}

// newLog starts an empty log whose identity and key derive from the
// state's root secret (new with every manifest set): instances converting
// the same stored state on a shared store derive the same log, so that
// their segments are interchangeable.
func newLog(st *sealedstate.State) (*sealedstate.Log, error) {
	if len(st.RootSecret) == 0 {
		return nil, errors.New("the state has no root secret")
	}
	id := sha256.Sum256(append([]byte("quarry update log id\x00"), st.RootSecret...))
	key := sha256.Sum256(append([]byte("quarry update log key\x00"), st.RootSecret...))
	return &sealedstate.Log{ID: id[:16], Key: key[:]}, nil
}

// Prepare brings st.Log up to date with the entries appended to the
// tail (st.UpdateLog) since the state st was copied from: chains them,
// writes the full segments of already stored tail entries when flush is
// set, and signs the new head. A state without Log (before this change,
// or a new manifest) gets a new log whose first entries are its UpdateLog.
// One writer at a time.
func (ls *Store) Prepare(ctx context.Context, st *sealedstate.State, flush bool) error {
	old := st.Log
	fresh := old == nil
	if fresh {
		var err error
		if old, err = newLog(st); err != nil {
			return fmt.Errorf("starting the update log: %w", err)
		}
	}
	const size = updatelog.SegmentSize
	stored := old.Count - old.Segments*size
	if uint64(len(st.UpdateLog)) < stored {
		return fmt.Errorf("%w: the tail has %d entries, the head says %d", ErrDamaged, len(st.UpdateLog), stored)
	}
	added := uint64(len(st.UpdateLog)) - stored
	k := uint64(0)
	if flush && ls.segments != nil {
		k = stored / size
	}
	if added == 0 && k == 0 && !fresh {
		return nil
	}
	nl := *old
	if added > 0 && !fresh {
		// Marble activity since the last entry, as counts, before the
		// change's own entries.
		if e := marbleUsage(&nl, st.Activations, ls.now()); e != "" {
			st.UpdateLog = slices.Insert(slices.Clip(st.UpdateLog), int(stored), e)
		}
	}
	tail := st.UpdateLog
	// The new head chains only the added entries; the tail's hashes are
	// needed only to write segments.
	h := old.Chain().Append(tail[stored:]...)
	nl.Count, nl.Head = h.Count, h.Hash
	var recs []logchain.Record
	if k > 0 {
		recs = logchain.Chain(logchain.Head{Count: old.Segments * size, Hash: old.TailPrev}, tail[:k*size])
	}
	for i := range k {
		prev := old.TailPrev
		if i > 0 {
			prev = recs[i*size-1].Hash
		}
		if err := ls.WriteSegment(ctx, &nl, old.Segments+i, prev, tail[i*size:(i+1)*size]); err != nil {
			return err
		}
	}
	if k > 0 {
		nl.TailPrev = recs[k*size-1].Hash
		nl.Segments += k
		st.UpdateLog = slices.Clone(tail[k*size:])
	}
	if added > 0 || fresh {
		key, err := ls.signer(st.CA.RootKey)
		if err != nil {
			return err
		}
		if nl.Checkpoint, err = logchain.Sign(rand.Reader, key, nl.Chain(), ls.now()); err != nil {
			return err
		}
	}
	st.Log = &nl
	return nil
}

// segmentHeader is the public header of a sealed segment.
type segmentHeader struct {
	Segment uint64 `json:"updatelogSegment"`
}

// WriteSegment seals and stores segment n (overwriting whatever an
// interrupted write left there).
func (ls *Store) WriteSegment(ctx context.Context, l *sealedstate.Log, n uint64, prev logchain.Hash, entries []string) error {
	s, err := ls.segments(n)
	if err != nil {
		return fmt.Errorf("update log segment %d: %w", n, err)
	}
	plaintext, err := json.Marshal(updatelog.Segment{Log: l.ID, Index: n, Prev: prev, Entries: entries})
	if err != nil {
		return err
	}
	hdr, err := json.Marshal(segmentHeader{Segment: n})
	if err != nil {
		return err
	}
	blob, err := seal.Seal(rand.Reader, l.Key, hdr, plaintext)
	if err != nil {
		return fmt.Errorf("sealing update log segment %d: %w", n, err)
	}
	for range 4 {
		_, rev, err := s.Load(ctx)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("reading update log segment %d: %w", n, err)
		}
		if _, err = s.Save(ctx, blob, rev); err == nil {
			return nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("storing update log segment %d: %w", n, err)
		}
	}
	return fmt.Errorf("storing update log segment %d: %w", n, store.ErrConflict)
}

// readSegment returns the records of stored segment n of l.
func (ls *Store) readSegment(ctx context.Context, l *sealedstate.Log, n uint64) ([]logchain.Record, error) {
	ls.mu.Lock()
	if string(ls.cacheID) != string(l.ID) {
		ls.cacheID, ls.cache = slices.Clone(l.ID), map[uint64][]logchain.Record{}
	}
	recs, ok := ls.cache[n]
	ls.mu.Unlock()
	if ok {
		return recs, nil
	}
	if ls.segments == nil {
		return nil, fmt.Errorf("%w: segment %d is referenced but no segment store is configured", ErrDamaged, n)
	}
	s, err := ls.segments(n)
	if err != nil {
		return nil, fmt.Errorf("update log segment %d: %w", n, err)
	}
	blob, _, err := s.Load(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: segment %d is missing", ErrDamaged, n)
	}
	if err != nil {
		return nil, fmt.Errorf("reading update log segment %d: %w", n, err)
	}
	_, plaintext, err := seal.Open(l.Key, blob)
	if err != nil {
		return nil, fmt.Errorf("%w: segment %d does not open: %v", ErrDamaged, n, err)
	}
	if recs, err = updatelog.DecodeSegment(plaintext, l.ID, n); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	ls.mu.Lock()
	if string(ls.cacheID) == string(l.ID) {
		if len(ls.cache) >= segmentCacheSize {
			for k := range ls.cache {
				delete(ls.cache, k)
				break
			}
		}
		ls.cache[n] = recs
	}
	ls.mu.Unlock()
	return recs, nil
}

// Records returns entries after+1 to min(after+limit, count) of st's log.
// Every segment it serves is checked to chain with its neighbours
// (checkSegmentLinks), so reading the whole log checks the whole chain of
// segments up to the tail, whose start the sealed state holds.
func (ls *Store) Records(ctx context.Context, st *sealedstate.State, after, limit uint64) ([]logchain.Record, error) {
	l := st.Log
	end := min(l.Count, after+limit)
	if limit > l.Count { // after+limit may overflow
		end = l.Count
	}
	if after >= end {
		return []logchain.Record{}, nil
	}
	const size = updatelog.SegmentSize
	out := make([]logchain.Record, 0, end-after)
	seq := after + 1
	var before []logchain.Record // the segment read just before, if any
	for seq <= end && seq <= l.Segments*size {
		n := (seq - 1) / size
		recs, err := ls.readSegment(ctx, l, n)
		if err != nil {
			return nil, err
		}
		last := min(end, (n+1)*size)
		if err := ls.checkSegmentLinks(ctx, l, n, recs, before, last == end); err != nil {
			return nil, err
		}
		first := n*size + 1
		out = append(out, recs[seq-first:last-first+1]...)
		seq = last + 1
		before = recs
	}
	if seq <= end {
		base := l.Segments * size
		tail := logchain.Chain(logchain.Head{Count: base, Hash: l.TailPrev}, st.UpdateLog)
		out = append(out, tail[seq-base-1:end-base]...)
	}
	return out, nil
}

// checkSegmentLinks checks that segment n of l (its records recs) chains
// with its neighbours (docs/update-log.md): its first entry chains from
// the empty log (n = 0) or from the last entry of segment n-1 (before, when
// the caller has just read it, else read now); and, when it is the last
// segment the caller serves (lastServed) or the last one stored, its last
// entry is the one segment n+1 chains from, or for the last segment the
// tail's start that the sealed state holds (TailPrev). Each segment is
// sealed and intact on its own; this refuses a segment of another copy of
// the same log (a fork, an older backup) and segments replaced, reordered
// or dropped. A neighbour that is missing or does not open is reported as
// such: the link cannot be checked, so the segment is not served.
func (ls *Store) checkSegmentLinks(ctx context.Context, l *sealedstate.Log, n uint64, recs, before []logchain.Record, lastServed bool) error {
	const size = updatelog.SegmentSize
	switch {
	case n == 0:
		if !updatelog.Follows(logchain.Hash{}, recs) {
			return segmentChainError("segment 0 does not start the log: its first entry does not chain from the empty log")
		}
	default:
		if before == nil {
			var err error
			if before, err = ls.readSegment(ctx, l, n-1); err != nil {
				return fmt.Errorf("checking that segment %d continues segment %d: %w", n, n-1, err)
			}
		}
		if !updatelog.Follows(before[len(before)-1].Hash, recs) {
			return segmentChainError(fmt.Sprintf("segment %d does not continue segment %d: its first entry (%d) does not chain from entry %d, the last of segment %d",
				n, n-1, n*size+1, n*size, n-1))
		}
	}
	end := recs[len(recs)-1].Hash
	switch {
	case n+1 == l.Segments:
		if end != l.TailPrev {
			return segmentChainError(fmt.Sprintf("segment %d, the last, does not end where the state's tail starts: its last entry (%d) hashes to %s, the state says %s",
				n, (n+1)*size, end, l.TailPrev))
		}
	case lastServed:
		next, err := ls.readSegment(ctx, l, n+1)
		if err != nil {
			return fmt.Errorf("checking that segment %d continues segment %d: %w", n+1, n, err)
		}
		if !updatelog.Follows(end, next) {
			return segmentChainError(fmt.Sprintf("segment %d does not continue segment %d: its first entry (%d) does not chain from entry %d, the last of segment %d",
				n+1, n, (n+1)*size+1, (n+1)*size, n))
		}
	}
	return nil
}

// segmentChainError is the error of a broken link between segments.
func segmentChainError(what string) error {
	return fmt.Errorf("%w: %w: %s; the stored segments do not all belong to this state's log (a segment from another copy of it, or segments replaced, reordered or dropped): "+
		"restore the update log segments stored with this state (docs/backup.md)", ErrDamaged, updatelog.ErrSegmentChain, what)
}

// Ensure gives a state from before the verifiable log one, in memory:
// its entries become the start of the chain. The converted state is
// written (its entries into segments) with the next change; until then the
// stored state is the old one, so a crash at any point loses nothing.
func Ensure(st *sealedstate.State, now time.Time) error {
	if st.Log != nil {
		return nil
	}
	l, err := newLog(st)
	if err != nil {
		return err
	}
	if len(st.UpdateLog) > 0 {
		recs := logchain.Chain(logchain.Head{}, st.UpdateLog)
		l.Count, l.Head = recs[len(recs)-1].Seq, recs[len(recs)-1].Hash
	}
	key, err := x509.ParseECPrivateKey(st.CA.RootKey)
	if err != nil {
		return fmt.Errorf("root key: %w", err)
	}
	if l.Checkpoint, err = logchain.Sign(rand.Reader, key, l.Chain(), now); err != nil {
		return err
	}
	st.Log = l
	return nil
}

// Full returns every entry of st's log.
func (ls *Store) Full(ctx context.Context, st *sealedstate.State) ([]string, error) {
	if st.Log == nil || st.Log.Segments == 0 {
		return st.UpdateLog, nil
	}
	recs, err := ls.Records(ctx, st, 0, st.Log.Count)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Entry
	}
	return out, nil
}
