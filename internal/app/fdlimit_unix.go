//go:build unix

package app

import "syscall"

// raiseFileLimit raises the soft limit of open file descriptors
// (RLIMIT_NOFILE) to the hard limit and returns the limit in force, the
// soft limit found and whether it could be read (false: unknown).
func raiseFileLimit() (limit, found uint64, ok bool) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, false
	}
	found = lim.Cur
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = raised.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	return lim.Cur, found, true
}
