//go:build unix

package dcap_test

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportPerCPUSecond reports verifications per CPU-second since start, a
// figure that other load on a shared machine changes less than the wall
// time.
func reportPerCPUSecond(b *testing.B, start time.Duration) {
	if used := cpuTime() - start; used > 0 {
		b.ReportMetric(float64(b.N)/used.Seconds(), "verifications/CPU-s")
	}
}
