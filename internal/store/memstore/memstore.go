// Package memstore is a store.Store kept in memory, for tests and for
// Coordinators that must not persist anything. Its contents die with the
// process.
package memstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/quarry-cc/quarry/internal/store"
)

// Store holds one blob in memory. Revisions are a decimal counter that never
// repeats within one Store. The zero value is not usable; call New.
type Store struct {
	mu      sync.Mutex
	blob    []byte // nil when nothing is stored
	rev     store.Revision
	counter uint64
	aside   map[string][]byte // blobs moved aside, by location
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Mover  = (*Store)(nil)
	_ store.Copier = (*Store)(nil)
)

// New returns an empty Store.
func New() *Store {
	return &Store{aside: map[string][]byte{}}
}

// Load returns a copy of the stored blob and its revision, or
// store.ErrNotFound.
func (s *Store) Load(ctx context.Context) ([]byte, store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", fmt.Errorf("memstore: load: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blob == nil {
		return nil, "", store.ErrNotFound
	}
	return append([]byte{}, s.blob...), s.rev, nil
}

// Save stores a copy of blob if the stored revision is prevRev, else returns
// store.ErrConflict.
func (s *Store) Save(ctx context.Context, blob []byte, prevRev store.Revision) (store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("memstore: save: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prevRev != s.rev {
		return "", store.ErrConflict
	}
	s.counter++
	s.blob = append([]byte{}, blob...) // never nil: an empty blob is stored
	s.rev = store.Revision(strconv.FormatUint(s.counter, 10))
	return s.rev, nil
}

// MoveAside moves the stored blob to the location "memory:<suffix>" (or
// "memory:<suffix>.1", ".2", … if that is taken) and returns the location;
// Aside reads it back. It returns store.ErrNotFound when nothing is stored.
func (s *Store) MoveAside(ctx context.Context, suffix string) (string, error) {
	return s.putAside(ctx, "move aside", suffix, true)
}

// CopyAside copies the stored blob to "memory:<suffix>" (numbered like
// MoveAside) and returns the location; the blob stays stored. It returns
// store.ErrNotFound when nothing is stored.
func (s *Store) CopyAside(ctx context.Context, suffix string) (string, error) {
	return s.putAside(ctx, "copy aside", suffix, false)
}

func (s *Store) putAside(ctx context.Context, op, suffix string, remove bool) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("memstore: %s: %w", op, err)
	}
	if suffix == "" {
		return "", fmt.Errorf("memstore: %s: empty suffix", op)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blob == nil {
		return "", store.ErrNotFound
	}
	where := "memory:" + suffix
	for i := 1; s.aside[where] != nil; i++ {
		where = "memory:" + suffix + "." + strconv.Itoa(i)
	}
	s.aside[where] = append([]byte{}, s.blob...)
	if remove {
		s.blob, s.rev = nil, ""
	}
	return where, nil
}

// Aside returns a copy of the blob that MoveAside or CopyAside put at where.
func (s *Store) Aside(where string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.aside[where]
	return append([]byte{}, b...), ok
}
