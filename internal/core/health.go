package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/store"
)

// CommitResult describes one attempt to store a changed state (OnCommit).
type CommitResult struct {
	// Duration is the time taken to encode, seal and store the state.
	Duration time.Duration
	// SealedBytes is the size of the sealed blob (0 when sealing failed
	// before there was one).
	SealedBytes int
	// Err is nil when the state was stored.
	Err error
}

// SealedStateSize returns the size in bytes of the sealed state the store
// holds as far as the Coordinator knows (the blob loaded at start or last
// stored); 0 when none.
func (c *Core) SealedStateSize() int64 { return c.sealedSize.Load() }

// RecoverySharesAccepted returns how many recovery secrets the current
// recovery round has accepted and how many it needs in all; 0, 0 outside
// recovery mode or when the state cannot be recovered.
func (c *Core) RecoverySharesAccepted() (accepted, needed int) {
	p := c.rec.progress.Load()
	if p == nil || p.need <= 0 {
		return 0, 0
	}
	return max(p.need-p.collector.Remaining(), 0), p.need
}

// ErrStoreUnavailable is returned by CheckStore when the sealed state
// cannot be read back from the store.
var ErrStoreUnavailable = errors.New("the store of the sealed state is not reachable")

// CheckStore reads the sealed state and data key back from their stores
// (readiness). It fails when either cannot be read, or when the Coordinator
// stored a state and the store no longer holds it. It does not take the
// state lock, so a long state change does not delay it. On a shared store
// it reads only the two revisions (one linearizable read without the
// blobs), so probes cost etcd next to nothing whatever the state's size.
func (c *Core) CheckStore(ctx context.Context) error {
	stored := c.sealedSize.Load() > 0
	running := c.Status() == StateAcceptingMarbles
	if c.vault.Shared() {
		drev, krev, err := c.vault.StoredRevisions(ctx)
		switch {
		case err != nil:
			return fmt.Errorf("%w: reading the revisions of the sealed state: %w", ErrStoreUnavailable, err)
		case drev == "" && stored:
			return fmt.Errorf("%w: the sealed state is missing from the store", ErrStoreUnavailable)
		case krev == "" && stored && running:
			return fmt.Errorf("%w: the sealed data key is missing from the store", ErrStoreUnavailable)
		}
		return nil
	}
	for _, s := range []struct {
		name   string
		st     store.Store
		expect bool
	}{
		{"sealed state", c.opts.Data, stored},
		// In recovery mode the key file may have been moved aside.
		{"sealed data key", c.opts.Key, stored && running},
	} {
		_, _, err := s.st.Load(ctx)
		switch {
		case err == nil:
		case errors.Is(err, store.ErrNotFound):
			if s.expect {
				return fmt.Errorf("%w: the %s is missing from the store", ErrStoreUnavailable, s.name)
			}
		default:
			return fmt.Errorf("%w: reading the %s: %w", ErrStoreUnavailable, s.name, err)
		}
	}
	return nil
}
