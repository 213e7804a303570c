package backup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/filestore"
)

// Errors of Take.
var (
	// ErrNoState means the seal directory holds no sealed state to back
	// up (no sealed_data).
	ErrNoState = errors.New("no sealed state to back up")
	// ErrInconsistent means no read of the seal directory found a
	// sealed_key with an entry bound to the sealed_data read just before
	// it, within the attempts: a Coordinator in recovery mode (the key
	// does not belong to the data) or one changing its state faster than
	// the files can be read.
	ErrInconsistent = errors.New("no consistent pair of sealed files")
)

// DefaultAttempts is how often Take reads the pair before it gives up.
const DefaultAttempts = 50

// TakeOptions tune Take; the zero value is the default.
type TakeOptions struct {
	// Attempts bounds the reads of the pair (DefaultAttempts if 0).
	Attempts int
	// Pause is the wait after the n-th failed attempt (by default
	// n × 10 ms, at most 200 ms).
	Pause func(n int) time.Duration
	// Now is the clock (time.Now if nil).
	Now func() time.Time

	// readFile replaces os.ReadFile in tests.
	readFile func(string) ([]byte, error)
}

// TakeInfo says how Take read the directory.
type TakeInfo struct {
	// Locked reports that Take held the directory's lock (no Coordinator
	// was running); otherwise it read without the lock.
	Locked bool
	// Attempts is how many reads it took.
	Attempts int
	// Skipped lists the files under LogDir named like a segment that are
	// not a well-formed sealed segment and were left out, with why. No
	// state references such a file (segments are written whole, by
	// rename, before any state references them), unless the disk damaged
	// it.
	Skipped []string
}

// Take reads one consistent revision of the sealed state in dir, whether or
// not a Coordinator runs on it. A Coordinator commits a change by writing
// sealed_key (with entries for the new and the current sealed_data) and
// then sealed_data, each replaced atomically (docs/sealing.md), so Take
// reads sealed_data, then sealed_key, and accepts the pair only when the
// key file has an entry bound to the SHA-256 of that sealed_data: that
// entry is the one the Coordinator would open it with. Otherwise it reads
// again, a bounded number of times. When no Coordinator holds the
// directory, Take holds its lock while it reads, so none starts meanwhile.
//
// The archive's key file holds only the entry bound to the data (or the
// legacy raw key), so the backup carries no key to any other state.
func Take(ctx context.Context, dir string, opts TakeOptions) (*Archive, TakeInfo, error) {
	var info TakeInfo
	if opts.Attempts <= 0 {
		opts.Attempts = DefaultAttempts
	}
	if opts.Pause == nil {
		opts.Pause = func(n int) time.Duration { return min(time.Duration(n)*10*time.Millisecond, 200*time.Millisecond) }
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.readFile == nil {
		opts.readFile = os.ReadFile
	}
	st, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, info, fmt.Errorf("%w: the seal directory %s does not exist", ErrNoState, dir)
		}
		return nil, info, fmt.Errorf("seal directory: %w", err)
	}
	if !st.IsDir() {
		return nil, info, fmt.Errorf("seal directory %s is not a directory", dir)
	}
	// Hold the lock when no Coordinator does. ErrLocked: a Coordinator
	// runs, read without it. Another failure (a read-only directory, say):
	// reading without it is just as consistent.
	if unlock, err := filestore.LockDir(dir); err == nil {
		info.Locked = true
		defer unlock()
	}

	var last error
	for n := 1; n <= opts.Attempts; n++ {
		info.Attempts = n
		if err := ctx.Err(); err != nil {
			return nil, info, err
		}
		a, retry, err := readPair(dir, opts.readFile)
		if err == nil {
			// Every segment the pair references was stored before it
			// and is never changed after: listed now, it is there.
			if a.Segments, info.Skipped, err = readSegments(dir, opts.readFile); err != nil {
				return nil, info, err
			}
			a.Created = opts.Now().UTC().Truncate(time.Second)
			return a, info, nil
		}
		if !retry || info.Locked {
			// Nothing can change while the lock is held.
			return nil, info, err
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, info, ctx.Err()
		case <-time.After(opts.Pause(n)):
		}
	}
	return nil, info, fmt.Errorf("after %d attempts: %w", opts.Attempts, last)
}

// readSegments reads the update log segment files under dir/LogDir, by
// ascending index. Only files named by a canonical decimal number are
// segments (not <n>.tmp, <n>.before-restore-..., or anything else). A
// segment file that is not a well-formed sealed segment naming its own
// index is skipped and reported: a Coordinator writes each segment whole
// and renames it into place, so a referenced segment always parses, and
// an unreferenced one is ignored and rewritten by the Coordinator anyway;
// skipping one that the disk damaged still backs up the state (whose log
// cannot be read past it with or without the backup).
func readSegments(dir string, readFile func(string) ([]byte, error)) (segs []Segment, skipped []string, err error) {
	logDir := filepath.Join(dir, LogDir)
	ents, err := os.ReadDir(logDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", LogDir, err)
	}
	var total int64
	for _, e := range ents { // sorted by name; sorted by index below
		n, ok := parseSegmentName(e.Name())
		if !ok {
			continue
		}
		s := Segment{Index: n}
		if !e.Type().IsRegular() {
			skipped = append(skipped, s.Name()+": not a regular file")
			continue
		}
		blob, err := readFile(filepath.Join(logDir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // never removed by a Coordinator; someone else did
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", s.Name(), err)
		}
		if err := checkSegment(n, blob); err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", s.Name(), err))
			continue
		}
		if total += int64(len(blob)); total > MaxLogSize {
			return nil, nil, fmt.Errorf("the update log segments exceed %d bytes", int64(MaxLogSize))
		}
		s.Blob = blob
		segs = append(segs, s)
	}
	slices.SortFunc(segs, func(a, b Segment) int { return cmp.Compare(a.Index, b.Index) })
	return segs, skipped, nil
}

// readPair reads sealed_data then sealed_key once. retry reports whether
// another read may succeed.
func readPair(dir string, readFile func(string) ([]byte, error)) (a *Archive, retry bool, err error) {
	data, err := readFile(filepath.Join(dir, DataFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("%w: %s has no %s (a Coordinator that has no manifest yet, or the wrong directory)", ErrNoState, dir, DataFile)
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", DataFile, err)
	}
	if len(data) > MaxFileSize {
		return nil, false, fmt.Errorf("%s of %d bytes exceeds %d", DataFile, len(data), MaxFileSize)
	}
	if _, err := seal.ReadHeader(data); err != nil {
		// Files are replaced atomically: a corrupt blob stays corrupt.
		return nil, false, fmt.Errorf("%s is not a sealed state: %w", DataFile, err)
	}
	key, err := readFile(filepath.Join(dir, KeyFile))
	if errors.Is(err, fs.ErrNotExist) {
		// Moved aside by a recovery in progress, or lost.
		return nil, true, fmt.Errorf("%w: %s is missing", ErrInconsistent, KeyFile)
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", KeyFile, err)
	}
	entries, err := seal.DecodeKeyFile(key)
	if err != nil {
		return nil, true, fmt.Errorf("%w: %s: %w", ErrInconsistent, KeyFile, err)
	}
	e, ok := seal.Find(entries, data)
	if !ok {
		return nil, true, fmt.Errorf("%w: %s has no entry bound to %s (a Coordinator in recovery mode, or one changing its state)", ErrInconsistent, KeyFile, DataFile)
	}
	if !e.Legacy {
		if key, err = seal.EncodeKeyFile([]seal.KeyEntry{e}); err != nil {
			return nil, false, err
		}
	}
	return &Archive{Data: data, Key: key}, false, nil
}
