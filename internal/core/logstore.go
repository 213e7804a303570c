package core

import (
	"context"
	"fmt"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/logstore"
)

// ErrLogDamaged means a stored segment of the update log is missing or
// does not open (logstore.ErrDamaged).
var ErrLogDamaged = logstore.ErrDamaged

// LogPage is a page of the verifiable update log.
type LogPage struct {
	// Records are entries After+1 on.
	Records []logchain.Record
	// Prev is the hash of entry After (zero for After 0).
	Prev logchain.Hash
	// Checkpoint is the latest signed head.
	Checkpoint logchain.Checkpoint
}

// Page limits of GET /api/v2/update-log: a request without limit gets
// DefaultLogPage entries; limit must be 1 to MaxLogPage.
const (
	DefaultLogPage = 1000
	MaxLogPage     = 10000
)

// UpdateLogPage returns entries after+1 to after+limit (fewer at the end of
// the log) with their chain hashes, the hash of entry after, and the
// latest signed checkpoint, all from one snapshot: the checkpoint covers
// every entry returned. limit must be 1 to MaxLogPage and after at most
// the log's count (ErrInvalidRequest, naming the bounds); the log is
// served in state 3 only (*WrongStateError).
func (c *Core) UpdateLogPage(ctx context.Context, after, limit uint64) (LogPage, error) {
	s := c.snap.Load()
	if err := require(s.state, opReadLog); err != nil {
		return LogPage{}, err
	}
	if limit < 1 || limit > MaxLogPage {
		return LogPage{}, classify(ErrInvalidRequest, fmt.Errorf("limit %d is out of bounds: it must be 1 to %d (without limit a page has %d entries)", limit, MaxLogPage, DefaultLogPage))
	}
	st := s.persisted
	if after > st.Log.Count {
		return LogPage{}, classify(ErrInvalidRequest, fmt.Errorf("after %d is beyond the log's %d entries: it must be 0 to %d", after, st.Log.Count, st.Log.Count))
	}
	from := after
	if after > 0 {
		from--
	}
	recs, err := c.logs.Records(ctx, st, from, limit+after-from)
	if err != nil {
		return LogPage{}, err
	}
	page := LogPage{Records: recs, Checkpoint: st.Log.Checkpoint}
	if after > 0 {
		page.Prev, page.Records = recs[0].Hash, recs[1:]
	}
	return page, nil
}
