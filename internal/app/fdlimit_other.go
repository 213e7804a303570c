//go:build !unix

package app

// raiseFileLimit: without RLIMIT_NOFILE the limit is unknown.
func raiseFileLimit() (limit, found uint64, ok bool) { return 0, 0, false }
