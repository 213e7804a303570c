//go:build !unix

package graminetest

import (
	"errors"
	"os"
)

var errUnsupported = errors.New("named pipes are not supported on this platform")

func mkfifo(string) error { return errUnsupported }

func openNonblock(string, int) (*os.File, error) { return nil, errUnsupported }
