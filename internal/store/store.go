// Package store defines where the Coordinator keeps its sealed blobs: a Store
// holds one opaque blob with compare-and-swap on a revision, so that several
// backends (local files, memory, etcd) are interchangeable below core.
package store

import (
	"context"
	"errors"
)

// Revision identifies one stored version of a blob. The empty Revision means
// "no blob stored". Revisions are opaque: compare them only for equality.
type Revision string

// ErrNotFound is returned by Load when no blob is stored.
var ErrNotFound = errors.New("store: no blob stored")

// ErrConflict is returned by Save when the stored revision is not prevRev.
var ErrConflict = errors.New("store: revision conflict")

// Store holds one blob with compare-and-swap semantics.
type Store interface {
	// Load returns the stored blob and its revision, or ErrNotFound.
	Load(ctx context.Context) ([]byte, Revision, error)
	// Save durably replaces the blob if the stored revision equals prevRev
	// (the empty Revision when nothing is stored) and returns the new
	// revision; otherwise it returns ErrConflict and changes nothing. When
	// Save returns without error the blob survives a crash.
	Save(ctx context.Context, blob []byte, prevRev Revision) (Revision, error)
}

// Mover is an optional capability: MoveAside renames the stored blob out of
// the way (never deleting it) and returns a description of where it went.
// After MoveAside, Load returns ErrNotFound.
type Mover interface {
	MoveAside(ctx context.Context, suffix string) (string, error)
}

// MoveAside moves s's blob aside if s is a Mover, else fails.
func MoveAside(ctx context.Context, s Store, suffix string) (string, error) {
	mover, ok := s.(Mover)
	if !ok {
		return "", errors.New("the store cannot move a blob aside")
	}
	return mover.MoveAside(ctx, suffix)
}

// Copier is an optional capability: CopyAside durably writes a copy of the
// stored blob beside it (never overwriting anything) and returns a
// description of where it went; the stored blob stays. It returns
// ErrNotFound when no blob is stored.
type Copier interface {
	CopyAside(ctx context.Context, suffix string) (string, error)
}
