package filestore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// ErrLocked is returned by LockDir when another process (or another LockDir
// in this process) holds the directory.
var ErrLocked = errors.New("filestore: directory is in use by another process")

// LockDir takes an exclusive, non-blocking lock on <dir>/.lock (creating dir
// with mode 0700 and the lock file with mode 0600 if needed), so that two
// Coordinator processes never use one seal directory at once. If the lock is
// held elsewhere it returns an error wrapping ErrLocked that names the
// directory. The lock lasts until unlock is called or the process exits; the
// lock file itself is left in place. unlock may be called more than once.
func LockDir(dir string) (unlock func() error, err error) {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("filestore: lock directory: %w", err)
	}
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return nil, fmt.Errorf("filestore: lock directory: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("filestore: lock %s: %w", path, err)
	}
	if !held {
		f.Close()
		return nil, fmt.Errorf("%w: another Coordinator holds the lock on %s", ErrLocked, path)
	}
	var once sync.Once
	return func() error {
		err := errors.New("filestore: directory already unlocked")
		once.Do(func() {
			err = unlockFile(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		})
		return err
	}, nil
}
