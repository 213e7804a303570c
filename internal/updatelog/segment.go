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
