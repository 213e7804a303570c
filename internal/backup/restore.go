package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
)

// ErrInUse means a Coordinator holds the seal directory: stop it first.
var ErrInUse = errors.New("the seal directory is in use by a running Coordinator")

// ExistingStateError means the seal directory holds another sealed state
// and restore was not forced. The sealed state carries no revision or
// time that can be read without its key, so restore cannot tell an older
// state from a newer one: any state other than the backup's counts as
// possibly newer.
type ExistingStateError struct {
	Dir string
	// Modified is sealed_data's modification time.
	Modified time.Time
	// Created is when the backup was taken.
	Created time.Time
}

func (e *ExistingStateError) Error() string {
	when := "before"
	if e.Modified.After(e.Created) {
		when = "after"
	}
	return fmt.Sprintf("%s holds another sealed state (sealed_data last written %s, %s the backup was taken at %s); "+
		"it may be newer than the backup. Restore with --force to replace it (its files are kept as sealed_*.before-restore-<time>)",
		e.Dir, e.Modified.UTC().Format(time.RFC3339), when, e.Created.UTC().Format(time.RFC3339))
}

// RestoreResult says what Restore did.
type RestoreResult struct {
	// Unchanged reports that the directory held the backup's state
	// already; nothing was written.
	Unchanged bool
	// Aside lists the copies of the files that were replaced.
	Aside []string
}

// Restore writes the archive's sealed files into dir. It refuses while a
// Coordinator holds dir (ErrInUse) and, unless force, when dir holds
// another sealed state (*ExistingStateError). A sealed_key without
// sealed_data opens nothing and is no state. Before anything is replaced
// the current files are copied aside as <file>.before-restore-<time>
// (never deleted), and the files are written crash-safely like a
// Coordinator's commit (docs/sealing.md): first a key file with the
// backup's entry and the current key's entry for the current sealed_data,
// then sealed_data, then the backup's key file. A crash leaves the old or
// the restored state (or, where the old key file was legacy or unusable,
// recovery mode with the copies aside).
func Restore(ctx context.Context, dir string, a *Archive, force bool, now func() time.Time) (RestoreResult, error) {
	return restore(ctx, dir, a, force, now, nil)
}

// errCrashed is returned by restore when the test hook crash stopped it.
var errCrashed = errors.New("backup: stopped by the test hook")

// restore is Restore; crash, if not nil, is asked before each write step
// (0, 1, ...) and stops the restore there when it returns true (tests).
func restore(ctx context.Context, dir string, a *Archive, force bool, now func() time.Time, crash func(step int) bool) (RestoreResult, error) {
	var res RestoreResult
	if now == nil {
		now = time.Now
	}
	if err := a.Check(); err != nil {
		return res, err
	}
	unlock, err := filestore.LockDir(dir)
	if errors.Is(err, filestore.ErrLocked) {
		return res, fmt.Errorf("%w: %w", ErrInUse, err)
	}
	if err != nil {
		return res, err
	}
	defer unlock()

	data, err := filestore.New(dir, DataFile)
	if err != nil {
		return res, err
	}
	key, err := filestore.New(dir, KeyFile)
	if err != nil {
		return res, err
	}
	curData, dataRev, err := load(ctx, data)
	if err != nil {
		return res, err
	}
	curKey, keyRev, err := load(ctx, key)
	if err != nil {
		return res, err
	}
	newEntries, _ := seal.DecodeKeyFile(a.Key) // checked by a.Check
	newEntry, _ := seal.Find(newEntries, a.Data)

	// The entry of the current key file that opens the current data, if
	// any (nil for a legacy or unusable key file).
	var curEntry *seal.KeyEntry
	if curData != nil && curKey != nil {
		if entries, err := seal.DecodeKeyFile(curKey); err == nil {
			if e, ok := seal.Find(entries, curData); ok {
				curEntry = &e
			}
		}
	}

	if curData != nil {
		same := bytes.Equal(curData, a.Data) && curEntry != nil &&
			curEntry.Legacy == newEntry.Legacy && bytes.Equal(curEntry.Sealed, newEntry.Sealed)
		if same {
			res.Unchanged = true
			return res, nil
		}
		if !force {
			info, err := os.Stat(filepath.Join(dir, DataFile))
			if err != nil {
				return res, err
			}
			return res, &ExistingStateError{Dir: dir, Modified: info.ModTime(), Created: a.Created}
		}
	}

	suffix := "before-restore-" + now().UTC().Format("20060102T150405Z")
	for _, s := range []*filestore.Store{key, data} {
		p, err := s.CopyAside(ctx, suffix)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return res, fmt.Errorf("keeping the current files: %w", err)
		}
		res.Aside = append(res.Aside, p)
	}

	// Step 1: a key file that opens both the current and the restored data
	// where both entries are version-1 entries. Step 2: the data. Step 3:
	// the backup's own key file.
	first := a.Key
	twoKeys := curEntry != nil && !curEntry.Legacy && !newEntry.Legacy && curEntry.Binding != newEntry.Binding
	if twoKeys {
		if first, err = seal.EncodeKeyFile([]seal.KeyEntry{newEntry, *curEntry}); err != nil {
			return res, err
		}
	}
	steps := []struct {
		s    *filestore.Store
		name string
		blob []byte
		rev  *store.Revision
	}{
		{key, KeyFile, first, &keyRev},
		{data, DataFile, a.Data, &dataRev},
	}
	if twoKeys {
		steps = append(steps, steps[0])
		steps[2].blob = a.Key
	}
	for i, st := range steps {
		if crash != nil && crash(i) {
			return res, errCrashed
		}
		rev, err := st.s.Save(ctx, st.blob, *st.rev)
		if err != nil {
			return res, fmt.Errorf("writing %s: %w", st.name, err)
		}
		*st.rev = rev
	}
	// Read back what is stored.
	gotData, _, err := load(ctx, data)
	if err != nil {
		return res, err
	}
	gotKey, _, err := load(ctx, key)
	if err != nil {
		return res, err
	}
	if !bytes.Equal(gotData, a.Data) || !bytes.Equal(gotKey, a.Key) {
		return res, fmt.Errorf("the files read back from %s differ from the backup", dir)
	}
	return res, nil
}

// load returns a store's blob and revision; nil and the empty revision
// when nothing is stored.
func load(ctx context.Context, s *filestore.Store) ([]byte, store.Revision, error) {
	b, rev, err := s.Load(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil, "", nil
	}
	return b, rev, err
}
