//go:build !pprof

package main

import "log/slog"

// startProfiler does nothing in normal builds (see pprof.go).
func startProfiler(*slog.Logger) {}
