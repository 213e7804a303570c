package updatelog

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/quarry-cc/quarry/api/logchain"
)

// SegmentSize is how many entries one stored segment holds. Segments are
// written once, full, and never change; the entries after the last full
// segment (the tail) live in the sealed state.
const SegmentSize = 64

// Segment is the plaintext of one stored segment: entries
// Index*SegmentSize+1 to (Index+1)*SegmentSize of the log Log.
type Segment struct {
	// Log identifies the log (a new one starts with every new manifest
	// set), so that a segment of an earlier log is never taken for one of
	// this log.
	Log   []byte `json:"log"`
	Index uint64 `json:"index"`
	// Prev is the chain hash before the segment's first entry.
	Prev    logchain.Hash `json:"prev"`
	Entries []string      `json:"entries"`
}

// ErrBadSegment means a stored segment is not the one expected.
var ErrBadSegment = errors.New("update log segment is damaged or belongs elsewhere")

// ErrSegmentChain means stored segments, each intact, do not form one
// chain: a segment's first entry does not chain from the last entry of the
// segment before it (or segment 0's from the empty log), or the last
// segment does not end where the tail starts. A segment taken from another
// copy of the same log (a fork, an older backup) or segments replaced,
// reordered or dropped look like this (docs/update-log.md).
var ErrSegmentChain = errors.New("update log segments do not chain")

// Follows reports whether recs, the records of a segment or of the tail,
// continue from prev, the hash of the entry before their first (the zero
// Hash before entry 1): the first record's hash is recomputed from prev and
// its entry. The records after the first are chained from it by
// DecodeSegment or logchain.Chain. No records follow anything.
func Follows(prev logchain.Hash, recs []logchain.Record) bool {
	return len(recs) == 0 || logchain.Next(prev, recs[0].Seq, recs[0].Entry) == recs[0].Hash
}

// DecodeSegment decodes a segment's plaintext and checks that it is
// segment index of log and full; it returns its records (chained from the
// segment's Prev, which the sealing authenticates).
func DecodeSegment(b []byte, log []byte, index uint64) ([]logchain.Record, error) {
	var s Segment
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSegment, err)
	}
	switch {
	case string(s.Log) != string(log):
		return nil, fmt.Errorf("%w: segment %d belongs to another log", ErrBadSegment, index)
	case s.Index != index:
		return nil, fmt.Errorf("%w: segment %d is segment %d", ErrBadSegment, index, s.Index)
	case len(s.Entries) != SegmentSize:
		return nil, fmt.Errorf("%w: segment %d has %d entries", ErrBadSegment, index, len(s.Entries))
	}
	return logchain.Chain(logchain.Head{Count: index * SegmentSize, Hash: s.Prev}, s.Entries), nil
}
