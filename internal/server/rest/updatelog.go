package rest

import (
	"net/http"
	"strconv"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/internal/core"
)

// getUpdateLogPage is GET /api/v2/update-log?after=N&limit=M.
func (s *server) getUpdateLogPage(r *http.Request) (any, error) {
	q := r.URL.Query()
	after, err := queryUint(q.Get(v2.QueryAfter), v2.QueryAfter)
	if err != nil {
		return nil, err
	}
	// Without limit, the default page; limit=0 and limits above the
	// maximum are refused by the use case, naming the bounds
	// (docs/update-log.md).
	limit := uint64(core.DefaultLogPage)
	if q.Has(v2.QueryLimit) {
		if limit, err = queryUint(q.Get(v2.QueryLimit), v2.QueryLimit); err != nil {
			return nil, err
		}
	}
	page, err := s.c.UpdateLogPage(r.Context(), after, limit)
	if err != nil {
		return nil, err
	}
	out := v2.UpdateLogPageResponse{
		Entries: make([]v2.LogRecord, len(page.Records)),
		Prev:    page.Prev.String(),
		Checkpoint: v2.LogCheckpoint{
			Count: page.Checkpoint.Count, Head: page.Checkpoint.Head.String(),
			Time: page.Checkpoint.Time, Signature: page.Checkpoint.Signature,
		},
	}
	for i, rec := range page.Records {
		out.Entries[i] = v2.LogRecord{Seq: rec.Seq, Entry: rec.Entry, Hash: rec.Hash.String()}
	}
	return out, nil
}

// queryUint parses an optional non-negative decimal query parameter ("":
// 0).
func queryUint(v, name string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, &bodyError{msg: "malformed query string: " + name + " must be a non-negative integer"}
	}
	return n, nil
}
