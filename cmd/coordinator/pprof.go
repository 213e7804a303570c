//go:build pprof

package main

import (
	"log/slog"
	"net/http"
	_ "net/http/pprof"
)

// startProfiler serves net/http/pprof on 127.0.0.1:6060. It exists only in
// builds with -tags pprof, for performance work (docs/performance.md).
func startProfiler(log *slog.Logger) {
	go func() {
		log.Warn("pprof build: profiler listening on 127.0.0.1:6060")
		if err := http.ListenAndServe("127.0.0.1:6060", nil); err != nil {
			log.Error("profiler", "error", err.Error())
		}
	}()
}
