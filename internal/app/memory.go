package app

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/quarry-cc/quarry/internal/server/rest"
)

// Bounds of the memory budget of request bodies derived from a memory limit.
const (
	minBodyMemory = 32 << 20
	maxBodyMemory = 1 << 30
)

// cgroupMemoryFiles hold the memory limit of the process's cgroup (v2, then
// v1); a v1 limit near the maximum means none.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// bodyMemory returns the memory budget of request bodies decoded at once
// (docs/design/decisions.md#d16) and where it comes from: a quarter of the Go memory limit
// (GOMEMLIMIT) or of the cgroup's memory limit, whichever is smaller,
// within 32 MiB and 1 GiB; without a limit rest.DefaultBodyMemory. A
// quarter leaves room for the garbage collector (which lets the heap grow to
// about twice what is live) and for everything else.
func bodyMemory(readFile func(string) ([]byte, error)) (int64, string) {
	limit, source := int64(math.MaxInt64), ""
	if l := debug.SetMemoryLimit(-1); l > 0 && l < limit {
		limit, source = l, "GOMEMLIMIT"
	}
	for _, f := range cgroupMemoryFiles {
		raw, err := readFile(f)
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		if err == nil && v > 0 && v < 1<<60 && v < limit {
			limit, source = v, f
		}
		break
	}
	if source == "" {
		return rest.DefaultBodyMemory, "default"
	}
	return min(max(limit/4, minBodyMemory), maxBodyMemory), "a quarter of the memory limit in " + source
}

// readSystemFile reads a file of the system's (cgroup) configuration.
func readSystemFile(name string) ([]byte, error) { return os.ReadFile(name) }
