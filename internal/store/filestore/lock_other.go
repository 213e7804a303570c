//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package filestore

import (
	"errors"
	"os"
)

var errNoLock = errors.New("directory locking is not supported on this platform")

func tryLock(*os.File) (bool, error) { return false, errNoLock }

func unlockFile(*os.File) error { return errNoLock }
