package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
	"github.com/quarry-cc/quarry/internal/updatelog"
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

// ExistingSegmentsError means the seal directory holds update log segment
// files that differ from the backup's of the same number, and restore was
// not forced.
type ExistingSegmentsError struct {
	Dir string
	// Files are the differing files (LogDir/<n>).
	Files []string
}

func (e *ExistingSegmentsError) Error() string {
	list := strings.Join(e.Files, ", ")
	if len(e.Files) > 5 {
		list = strings.Join(e.Files[:5], ", ") + fmt.Sprintf(" and %d more", len(e.Files)-5)
	}
	return fmt.Sprintf("%s holds update log segments that differ from the backup's (%s). "+
		"Restore with --force to replace them (they are kept as %s/<n>.before-restore-<time>)", e.Dir, list, LogDir)
}

// RestoreResult says what Restore did.
type RestoreResult struct {
	// Unchanged reports that the directory held the backup's state and
	// update log segments already; nothing was written.
	Unchanged bool
	// Segments is the number of update log segment files written.
	Segments int
	// Aside lists the copies of the files that were replaced.
	Aside []string
	// Marker is the restore marker left for the next start when the
	// state was replaced (nil otherwise): what the restore replaced, for
	// the record in the update log (docs/update-log.md).
	Marker *updatelog.RestoreMarker
	// Restored is the update log checkpoint of the backup's state (nil
	// for a state written before checkpoints were in the header).
	Restored *logchain.Checkpoint
}

// Restore writes the archive's sealed files into dir. It refuses while a
// Coordinator holds dir (ErrInUse) and, unless force, when dir holds
// another sealed state (*ExistingStateError) or update log segment files
// that differ from the backup's (*ExistingSegmentsError). A sealed_key
// without sealed_data opens nothing and is no state. Before anything is
// replaced the current files are copied aside as
// <file>.before-restore-<time> (never deleted); when the state changes,
// so are the segment files the backup does not have (the restored
// Coordinator would write its own segments over them).
//
// The update log segments are written first, each atomically (a segment
// is stored before the state that references it, as a Coordinator does),
// then the pair crash-safely like a Coordinator's commit
// (docs/sealing.md): first a key file with the backup's entry and the
// current key's entry for the current sealed_data, then sealed_data, then
// the backup's key file. A crash leaves the old or the restored state (or,
// where the old key file was legacy or unusable, recovery mode with the
// copies aside); where it leaves the old state after replacing segments of
// another log, the old state's own segments are aside: run the restore
// again.
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

	same := curData != nil && bytes.Equal(curData, a.Data) && curEntry != nil &&
		curEntry.Legacy == newEntry.Legacy && bytes.Equal(curEntry.Sealed, newEntry.Sealed)
	if curData != nil && !same && !force {
		info, err := os.Stat(filepath.Join(dir, DataFile))
		if err != nil {
			return res, err
		}
		return res, &ExistingStateError{Dir: dir, Modified: info.ModTime(), Created: a.Created}
	}
	segs, err := planSegments(dir, a.Segments)
	if err != nil {
		return res, err
	}
	if len(segs.differ) > 0 && !force {
		e := &ExistingSegmentsError{Dir: dir}
		for _, s := range segs.differ {
			e.Files = append(e.Files, s.Name())
		}
		return res, e
	}
	if same && len(segs.write) == 0 {
		res.Unchanged = true
		return res, nil
	}

	suffix := "before-restore-" + now().UTC().Format("20060102T150405Z")
	// Keep the segment files replaced now, and, when the state changes,
	// those the restored Coordinator may write over later.
	aside := segs.differ
	if !same {
		aside = append(slices.Clone(aside), segs.extra...)
	}
	logDir := filepath.Join(dir, LogDir)
	for _, sg := range aside {
		ss, err := filestore.New(logDir, strconv.FormatUint(sg.Index, 10))
		if err != nil {
			return res, err
		}
		p, err := ss.CopyAside(ctx, suffix)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return res, fmt.Errorf("keeping the current files: %w", err)
		}
		res.Aside = append(res.Aside, p)
	}
	var marker *updatelog.RestoreMarker
	if !same {
		if marker, err = restoreMarker(ctx, dir, a, curData, now()); err != nil {
			return res, err
		}
	}
	step := 0
	for _, sg := range segs.write {
		if crash != nil && crash(step) {
			return res, errCrashed
		}
		step++
		ss, err := filestore.New(logDir, strconv.FormatUint(sg.Index, 10))
		if err != nil {
			return res, err
		}
		_, rev, err := load(ctx, ss)
		if err != nil {
			return res, err
		}
		if _, err := ss.Save(ctx, sg.Blob, rev); err != nil {
			return res, fmt.Errorf("writing %s: %w", sg.Name(), err)
		}
		if got, _, err := load(ctx, ss); err != nil || !bytes.Equal(got, sg.Blob) {
			return res, fmt.Errorf("the file %s read back from %s differs from the backup (%v)", sg.Name(), dir, err)
		}
		res.Segments++
	}
	if same {
		return res, nil
	}

	// The marker for the next start, before the state it names is in
	// place: a crash before the state is written leaves a marker that
	// names another sealed_data, which the Coordinator sets aside.
	if crash != nil && crash(step) {
		return res, errCrashed
	}
	step++
	if err := writeMarker(ctx, dir, marker); err != nil {
		return res, err
	}
	res.Marker = marker
	res.Restored = headerCheckpoint(a.Data)

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
	twoKeys := curEntry != nil && !curEntry.Legacy && !newEntry.Legacy && (curEntry.Binding != newEntry.Binding || curEntry.ByKeyID != newEntry.ByKeyID)
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
	for _, st := range steps {
		if crash != nil && crash(step) {
			return res, errCrashed
		}
		step++
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

// segmentPlan says which of a backup's segments restore writes.
type segmentPlan struct {
	// write are the backup's segments missing from the directory or
	// differing there; differ are those of them that exist.
	write, differ []Segment
	// extra are the directory's segment files the backup does not have
	// (Blob nil).
	extra []Segment
}

// planSegments compares the backup's segments with dir's segment files.
func planSegments(dir string, segs []Segment) (segmentPlan, error) {
	var p segmentPlan
	logDir := filepath.Join(dir, LogDir)
	ents, err := os.ReadDir(logDir)
	if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return p, fmt.Errorf("list %s: %w", LogDir, err)
	}
	inBackup := map[uint64]bool{}
	for _, s := range segs {
		inBackup[s.Index] = true
		cur, err := os.ReadFile(filepath.Join(logDir, strconv.FormatUint(s.Index, 10)))
		switch {
		case errors.Is(err, iofs.ErrNotExist):
			p.write = append(p.write, s)
		case err != nil:
			return p, fmt.Errorf("read %s: %w", s.Name(), err)
		case !bytes.Equal(cur, s.Blob):
			p.write = append(p.write, s)
			p.differ = append(p.differ, s)
		}
	}
	for _, e := range ents {
		if n, ok := parseSegmentName(e.Name()); ok && !inBackup[n] && e.Type().IsRegular() {
			p.extra = append(p.extra, Segment{Index: n})
		}
	}
	return p, nil
}

// headerCheckpoint returns the update log checkpoint in a sealed state's
// public header, or nil (an earlier version's state, MarbleRun's, or not
// a sealed state). The header is not authenticated without the data key:
// the Coordinator checks the checkpoint's signature before it records it.
func headerCheckpoint(blob []byte) *logchain.Checkpoint {
	hdr, err := seal.ReadHeader(blob)
	if err != nil {
		return nil
	}
	return updatelog.CheckpointInHeader(hdr)
}

// restoreMarker builds the marker of a restore of a into dir, whose
// sealed_data is curData (nil: none). When dir holds a marker of an
// earlier restore that names curData, that restore was never recorded
// (no Coordinator opened its state since): this restore replaces what
// that one replaced, which is what clients last saw.
func restoreMarker(ctx context.Context, dir string, a *Archive, curData []byte, now time.Time) (*updatelog.RestoreMarker, error) {
	m := &updatelog.RestoreMarker{
		Restored:      now.UTC().Format(time.RFC3339),
		BackupCreated: a.Created.UTC().Format(time.RFC3339),
		SealedData:    sum(a.Data),
		ReplacedState: logchain.ReplacedNone,
	}
	if curData == nil {
		return m, nil
	}
	ms, err := filestore.New(dir, updatelog.RestoreMarkerFile)
	if err != nil {
		return nil, err
	}
	if raw, _, err := ms.Load(ctx); err == nil {
		if prev, err := updatelog.DecodeRestoreMarker(raw); err == nil && prev.SealedData == sum(curData) {
			m.ReplacedState, m.Replaced = prev.ReplacedState, prev.Replaced
			return m, nil
		}
	}
	m.ReplacedState = logchain.ReplacedUnknown
	if cp := headerCheckpoint(curData); cp != nil {
		m.ReplacedState, m.Replaced = logchain.ReplacedCheckpoint, cp
	}
	return m, nil
}

// writeMarker stores the restore marker in dir (replacing an earlier one).
func writeMarker(ctx context.Context, dir string, m *updatelog.RestoreMarker) error {
	b, err := m.Encode()
	if err != nil {
		return err
	}
	ms, err := filestore.New(dir, updatelog.RestoreMarkerFile)
	if err != nil {
		return err
	}
	_, rev, err := load(ctx, ms)
	if err != nil {
		return err
	}
	if _, err := ms.Save(ctx, b, rev); err != nil {
		return fmt.Errorf("writing the restore marker %s: %w", updatelog.RestoreMarkerFile, err)
	}
	return nil
}
