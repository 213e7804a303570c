//go:build unix

package graminetest

import (
	"errors"
	"os"
	"syscall"
)

var errUnsupported = errors.New("named pipes are not supported here")

func mkfifo(path string) error {
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		return &os.PathError{Op: "mkfifo", Path: path, Err: err}
	}
	return nil
}

// openNonblock opens a pipe end without waiting for a peer; opening the
// write end fails when no reader waits.
func openNonblock(path string, flag int) (*os.File, error) {
	return os.OpenFile(path, flag|syscall.O_NONBLOCK, 0)
}
