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

// Stager is an optional capability of a store whose Save writes the new
// blob somewhere first and then puts it in place (a file store: a synced
// temporary file, then a rename). Stage starts that first part in the
// background and returns at once; the returned Staged puts the blob in
// place. The caller can so overlap the slow, durable write of a blob with
// another store's write (the Vault: the data blob with the key file) and
// still decide later, and in order, when the blob is stored. A staged
// blob is invisible to Load until its Save; a crash leaves the stored blob
// as it was.
type Stager interface {
	Stage(ctx context.Context, blob []byte) Staged
}

// Staged is a blob written by Stager.Stage and not yet in place. Exactly
// one of Save and Discard is called.
type Staged interface {
	// Save waits for the staged write, then replaces the stored blob with
	// it as Store.Save does (compare-and-swap on prevRev, durable when it
	// returns). It fails, changing nothing, when the staged write failed
	// or another Save or Stage of the store came in between.
	Save(ctx context.Context, prevRev Revision) (Revision, error)
	// Discard waits for the staged write and removes what it wrote.
	Discard()
}
