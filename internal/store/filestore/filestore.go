// Package filestore is the default store.Store: one blob in one file of a
// local directory (the Coordinator's seal directory), replaced atomically
// and durably on every Save.
//
// The compare-and-swap is exact within one process (a mutex per Store) and
// against other Store values on the same file as long as they do not write
// concurrently; LockDir keeps a second process out of the directory
// altogether.
package filestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/quarry-cc/quarry/internal/store"
)

const (
	dirMode  = 0o700
	fileMode = 0o600
	// tmpSuffix names the file a Save writes before renaming it into place.
	tmpSuffix = ".tmp"
	// lockName is the file LockDir locks.
	lockName = ".lock"
	// maxAside bounds the search for a free MoveAside name.
	maxAside = 10000
)

// Store keeps one blob in the file <dir>/<name>. A revision is the lowercase
// hex SHA-256 of the file's content, so two saves of equal bytes have equal
// revisions (the state they name is the same). Methods are safe for
// concurrent use.
type Store struct {
	dir  string
	name string
	path string

	mu sync.Mutex // serialises Save and MoveAside within this Store
	// tmpGen counts the writers of <name>.tmp (Save, Stage): a staged
	// blob is put in place only while its writer was the last one.
	tmpGen uint64
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Mover  = (*Store)(nil)
	_ store.Copier = (*Store)(nil)
	_ store.Stager = (*Store)(nil)
)

// New returns a Store for the file <dir>/<name>, creating dir with mode 0700
// if it is missing. name must be a plain file name.
func New(dir, name string) (*Store, error) {
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("filestore: file name %q: %w", name, err)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("filestore: create directory: %w", err)
	}
	return &Store{dir: dir, name: name, path: filepath.Join(dir, name)}, nil
}

func checkName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return errors.New("not a file name")
	case strings.ContainsAny(name, `/\`+"\x00"), filepath.Base(name) != name:
		return errors.New("must not contain a path separator")
	case name == lockName:
		return errors.New("reserved for the directory lock")
	case strings.HasSuffix(name, tmpSuffix):
		return errors.New("must not end in " + tmpSuffix)
	}
	return nil
}

// Path returns the path of the file that holds the blob.
func (s *Store) Path() string { return s.path }

// Load returns the file's content and revision. It returns store.ErrNotFound
// when the file does not exist, and any other error (the file exists but
// cannot be read) wrapped, so callers can tell "absent" from "unreadable".
func (s *Store) Load(ctx context.Context) ([]byte, store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", fmt.Errorf("filestore: load: %w", err)
	}
	blob, rev, err := s.read()
	if err != nil {
		return nil, "", err
	}
	if blob == nil {
		return nil, "", store.ErrNotFound
	}
	return blob, rev, nil
}

// read returns the file's content and revision; a nil blob and the empty
// revision when the file does not exist.
func (s *Store) read() ([]byte, store.Revision, error) {
	blob, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("filestore: read %s: %w", s.path, err)
	}
	if blob == nil {
		blob = []byte{}
	}
	return blob, revision(blob), nil
}

func revision(blob []byte) store.Revision {
	sum := sha256.Sum256(blob)
	return store.Revision(hex.EncodeToString(sum[:]))
}

// Save replaces the file's content with blob if the file's current revision
// is prevRev (the empty revision: the file does not exist), else it returns
// store.ErrConflict. It writes <name>.tmp, syncs it, renames it over <name>
// and syncs the directory before it returns. An error other than
// store.ErrConflict or a cancelled context may leave the new blob in place
// but not yet durable; Load tells which blob is stored.
func (s *Store) Save(ctx context.Context, blob []byte, prevRev store.Revision) (store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("filestore: save: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tmpGen++

	if err := s.holds(prevRev); err != nil {
		return "", err
	}

	tmp := s.path + tmpSuffix
	if err := writeSynced(tmp, blob); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("filestore: save: %w", err)
	}
	return s.putInPlace(ctx, blob)
}

// holds returns nil when the file's revision is prevRev, else
// store.ErrConflict (or the error reading it).
func (s *Store) holds(prevRev store.Revision) error {
	_, cur, err := s.read()
	if err != nil {
		return err
	}
	if cur != prevRev {
		return store.ErrConflict
	}
	return nil
}

// putInPlace renames the synced <name>.tmp holding blob over <name> and
// syncs the directory. Callers hold mu.
func (s *Store) putInPlace(ctx context.Context, blob []byte) (store.Revision, error) {
	tmp := s.path + tmpSuffix
	// Last point at which nothing has changed: honour a cancellation here.
	if err := ctx.Err(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("filestore: save: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("filestore: save: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		return "", fmt.Errorf("filestore: save: %w", err)
	}
	return revision(blob), nil
}

// Stage writes and syncs <name>.tmp in the background (store.Stager); the
// store's other writes wait until that is done. Its Save renames the file
// into place as Save does.
//
// With a single P (GOMAXPROCS 1) the write is done before Stage returns:
// a goroutine blocked in a file system call keeps the only P until the
// runtime's monitor takes it back (up to milliseconds when the process has
// been idle), so the caller's work would wait for the write instead of
// running beside it.
func (s *Store) Stage(ctx context.Context, blob []byte) store.Staged {
	s.mu.Lock() // unlocked by the write below, when it is done
	s.tmpGen++
	st := &staged{s: s, blob: blob, gen: s.tmpGen, done: make(chan struct{})}
	write := func() {
		defer close(st.done)
		defer s.mu.Unlock()
		if err := ctx.Err(); err != nil {
			st.err = err
			return
		}
		if err := writeSynced(s.path+tmpSuffix, blob); err != nil {
			os.Remove(s.path + tmpSuffix)
			st.err = err
		}
	}
	if runtime.GOMAXPROCS(0) == 1 {
		write()
	} else {
		go write()
	}
	return st
}

// staged is a blob Stage writes to <name>.tmp.
type staged struct {
	s    *Store
	blob []byte
	gen  uint64
	done chan struct{}
	err  error // of the write, once done is closed
}

// errStagedReplaced: another Save or Stage wrote <name>.tmp after Stage.
var errStagedReplaced = errors.New("the staged blob was replaced by another write")

func (st *staged) Save(ctx context.Context, prevRev store.Revision) (store.Revision, error) {
	<-st.done
	if st.err != nil {
		return "", fmt.Errorf("filestore: save: %w", st.err)
	}
	s := st.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tmpGen != st.gen {
		return "", fmt.Errorf("filestore: save: %w", errStagedReplaced)
	}
	s.tmpGen++
	if err := s.holds(prevRev); err != nil {
		os.Remove(s.path + tmpSuffix)
		return "", err
	}
	return s.putInPlace(ctx, st.blob)
}

func (st *staged) Discard() {
	<-st.done
	s := st.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tmpGen == st.gen {
		s.tmpGen++
		os.Remove(s.path + tmpSuffix)
	}
}

// writeSynced writes blob to a new file at path with mode 0600 and syncs it.
// A file left at path by an earlier crash is replaced.
func writeSynced(path string, blob []byte) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return writeNew(path, blob)
}

// writeNew writes blob to a file at path that must not exist yet (else an
// error wrapping fs.ErrExist), with mode 0600, and syncs it.
func writeNew(path string, blob []byte) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	// The mode given to OpenFile is reduced by the umask; set it exactly.
	if err := f.Chmod(fileMode); err != nil {
		return err
	}
	if _, err := f.Write(blob); err != nil {
		return err
	}
	return f.Sync()
}

// syncDir makes renames in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// MoveAside renames <name> to <name>.<suffix>, or to <name>.<suffix>.1, .2, …
// if that exists (it never overwrites or deletes a file), syncs the
// directory and returns the new path. It returns store.ErrNotFound when the
// file does not exist. suffix must be a plain file-name component.
func (s *Store) MoveAside(ctx context.Context, suffix string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("filestore: move aside: %w", err)
	}
	if err := checkName(s.name + "." + suffix); err != nil || suffix == "" || suffix == "." || suffix == ".." {
		return "", fmt.Errorf("filestore: move aside: bad suffix %q", suffix)
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	if _, err := os.Lstat(s.path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", store.ErrNotFound
		}
		return "", fmt.Errorf("filestore: move aside: %w", err)
	}
	base := s.path + "." + suffix
	for i := 0; i <= maxAside; i++ {
		dst := base
		if i > 0 {
			dst = base + "." + strconv.Itoa(i)
		}
		moved, err := renameNoReplace(s.path, dst)
		if err != nil {
			return "", fmt.Errorf("filestore: move aside: %w", err)
		}
		if !moved {
			continue
		}
		if err := syncDir(s.dir); err != nil {
			return "", fmt.Errorf("filestore: move aside: %w", err)
		}
		return dst, nil
	}
	return "", fmt.Errorf("filestore: move aside: %s and %d numbered variants all exist", base, maxAside)
}

// CopyAside writes a copy of <name> to <name>.<suffix>, or to
// <name>.<suffix>.1, .2, … if that exists (it never overwrites a file),
// syncs it and the directory, and returns the copy's path. The original
// stays. It returns store.ErrNotFound when the file does not exist.
func (s *Store) CopyAside(ctx context.Context, suffix string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("filestore: copy aside: %w", err)
	}
	if err := checkName(s.name + "." + suffix); err != nil || suffix == "" || suffix == "." || suffix == ".." {
		return "", fmt.Errorf("filestore: copy aside: bad suffix %q", suffix)
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	blob, _, err := s.read()
	if err != nil {
		return "", err
	}
	if blob == nil {
		return "", store.ErrNotFound
	}
	// Create the first free name exclusively (O_EXCL: never replacing a
	// file; no hard links, which Gramine does not provide) and write the
	// copy there. The original stays whatever happens.
	base := s.path + "." + suffix
	for i := 0; i <= maxAside; i++ {
		dst := base
		if i > 0 {
			dst = base + "." + strconv.Itoa(i)
		}
		err := writeNew(dst, blob)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			os.Remove(dst) // a partial copy; the original is untouched
			return "", fmt.Errorf("filestore: copy aside: %w", err)
		}
		if err := syncDir(s.dir); err != nil {
			return "", fmt.Errorf("filestore: copy aside: %w", err)
		}
		return dst, nil
	}
	return "", fmt.Errorf("filestore: copy aside: %s and %d numbered variants all exist", base, maxAside)
}

// renameNoReplace renames src to dst unless dst exists, and reports whether
// it did. A hard link makes the check and the new name one atomic step; on
// file systems without hard links it falls back to a check then a rename,
// which is safe while LockDir keeps other processes out.
func renameNoReplace(src, dst string) (bool, error) {
	err := os.Link(src, dst)
	switch {
	case err == nil:
		return true, os.Remove(src)
	case errors.Is(err, fs.ErrExist):
		return false, nil
	}
	if _, err := os.Lstat(dst); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	return true, os.Rename(src, dst)
}
