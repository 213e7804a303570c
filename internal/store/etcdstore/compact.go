package etcdstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/quarry-cc/quarry/internal/store"
)

// etcd keeps every earlier value of every key until it is compacted
// (docs/ha.md, "Compaction"). An instance that commits tells its Store
// (Committed); the Client then compacts etcd's history up to the newest
// head revision it committed at least Retention ago, at most once per
// Interval, in the background. What is read from the history is younger
// or copes without it: the read-back of a write whose answer was lost
// (FirstWriteAfter) starts within a store timeout of the write, and the
// retention is several store timeouts; a head's chunks are read at the
// head's revision, and a reader slower than the retention is told that a
// chunk is gone (LoadChunks, ErrHistoryGone) and reads the head again.
// Several instances compacting is harmless: etcd refuses a compaction to
// a revision it has already compacted, which is not an error here.

// CompactionOptions configure the compaction of etcd's history.
type CompactionOptions struct {
	// Retention is how long history is kept after a commit (default 30 s).
	Retention time.Duration
	// Interval is the least time between two compactions (0: a quarter
	// of the retention, between 1 s and 1 min; negative: none, for tests).
	Interval time.Duration
	// Done, if set, is called after each compaction with the revision
	// compacted to and its error (nil also when another instance had
	// compacted as far already). It must be quick.
	Done func(rev int64, err error)
	// Now defaults to time.Now.
	Now func() time.Time
}

// Defaults of CompactionOptions.
const (
	DefaultRetention = 30 * time.Second
)

type compactor struct {
	opts CompactionOptions

	mu      sync.Mutex
	marks   []mark // head revisions committed, oldest first
	last    time.Time
	done    int64
	running bool
}

// mark says that the head had revision rev at time at.
type mark struct {
	at  time.Time
	rev int64
}

// EnableCompaction makes the client compact etcd's history after the
// commits reported to its Stores' Committed (off until called).
func (c *Client) EnableCompaction(opts CompactionOptions) {
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	if opts.Interval < 0 {
		opts.Interval = 0
	} else if opts.Interval == 0 {
		opts.Interval = min(max(opts.Retention/4, time.Second), time.Minute)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c.compactMu.Lock()
	c.compact = &compactor{opts: opts}
	c.compactMu.Unlock()
}

// enabledCompactor returns the compactor (nil: compaction is off).
func (c *Client) enabledCompactor() *compactor {
	c.compactMu.Lock()
	defer c.compactMu.Unlock()
	return c.compact
}

// Committed reports that this instance's commit made r the revision of
// s's blob (the head); with compaction enabled it may start one.
func (s *Store) Committed(r store.Revision) {
	k := s.c.enabledCompactor()
	n, ok := parseRev(r)
	if k == nil || !ok {
		return
	}
	now := k.opts.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	// One mark per second is enough: dropping a newer mark only compacts
	// less.
	if len(k.marks) == 0 || now.Sub(k.marks[len(k.marks)-1].at) >= time.Second || k.opts.Retention < time.Second {
		k.marks = append(k.marks, mark{now, n})
	}
	cut := now.Add(-k.opts.Retention)
	i := -1
	for j, m := range k.marks {
		if m.at.After(cut) {
			break
		}
		i = j
	}
	if i < 0 {
		return
	}
	k.marks = k.marks[i:] // later targets are never older than marks[i]
	target := k.marks[0].rev
	if k.running || target <= k.done || (!k.last.IsZero() && now.Sub(k.last) < k.opts.Interval) {
		return
	}
	k.running, k.last = true, now
	go s.c.runCompaction(k, target)
}

func (c *Client) runCompaction(k *compactor, target int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.cli.Compact(ctx, target)
	if errors.Is(err, rpctypes.ErrCompacted) {
		err = nil // another instance compacted as far already
	}
	k.mu.Lock()
	k.running = false
	if err == nil {
		k.done = max(k.done, target)
	}
	k.mu.Unlock()
	if k.opts.Done != nil {
		k.opts.Done(target, err)
	}
}

// Compact compacts etcd's history up to revision r now (a revision that
// etcd already compacted is no error).
func (c *Client) Compact(ctx context.Context, r int64) error {
	_, err := c.cli.Compact(ctx, r)
	if errors.Is(err, rpctypes.ErrCompacted) {
		return nil
	}
	return err
}

// MemberStatus is what one etcd endpoint says about its database.
type MemberStatus struct {
	Endpoint string
	// DBSize is the size of the database file; DBSizeInUse the part of it
	// in use (the rest is free pages that a defragmentation returns).
	DBSize, DBSizeInUse int64
	// Quota is the member's --quota-backend-bytes (0 when the member does
	// not say: etcd before 3.6).
	Quota int64
	// Err is set when the endpoint did not answer.
	Err error
}

// Status asks every endpoint for its database size and quota (etcd's
// maintenance Status API), each within ctx.
func (c *Client) Status(ctx context.Context) []MemberStatus {
	eps := c.endpoints
	out := make([]MemberStatus, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			out[i].Endpoint = ep
			resp, err := c.cli.Status(ctx, ep)
			if err != nil {
				out[i].Err = err
				return
			}
			out[i].DBSize, out[i].DBSizeInUse, out[i].Quota = resp.DbSize, resp.DbSizeInUse, resp.DbSizeQuota
		})
	}
	wg.Wait()
	return out
}
