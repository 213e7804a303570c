package app

import (
	"errors"
	"io/fs"
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/server/rest"
)

func TestBodyMemory(t *testing.T) {
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			if v, ok := m[name]; ok {
				return []byte(v), nil
			}
			return nil, fs.ErrNotExist
		}
	}
	const v2, v1 = "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"
	for _, tc := range []struct {
		name     string
		goLimit  int64
		files    map[string]string
		want     int64
		fromFile string
	}{
		{"no limit", 0, nil, rest.DefaultBodyMemory, ""},
		{"cgroup v2 unlimited", 0, map[string]string{v2: "max\n"}, rest.DefaultBodyMemory, ""},
		{"cgroup v1 unlimited", 0, map[string]string{v1: "9223372036854771712\n"}, rest.DefaultBodyMemory, ""},
		{"cgroup v2 2 GiB", 0, map[string]string{v2: "2147483648\n"}, 512 << 20, v2},
		{"cgroup v1 1 GiB", 0, map[string]string{v1: "1073741824\n"}, 256 << 20, v1},
		{"small cgroup", 0, map[string]string{v2: "67108864"}, minBodyMemory, v2},
		{"huge cgroup", 0, map[string]string{v2: "68719476736"}, maxBodyMemory, v2},
		{"GOMEMLIMIT", 512 << 20, nil, 128 << 20, "GOMEMLIMIT"},
		{"the smaller wins", 512 << 20, map[string]string{v2: "2147483648"}, 128 << 20, "GOMEMLIMIT"},
		{"the smaller wins (cgroup)", 4 << 30, map[string]string{v2: "1073741824"}, 256 << 20, v2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.goLimit > 0 {
				old := debug.SetMemoryLimit(tc.goLimit)
				defer debug.SetMemoryLimit(old)
			} else {
				old := debug.SetMemoryLimit(math.MaxInt64)
				defer debug.SetMemoryLimit(old)
			}
			got, source := bodyMemory(files(tc.files))
			if got != tc.want {
				t.Errorf("budget %d, want %d (%s)", got, tc.want, source)
			}
			if tc.fromFile != "" && !strings.Contains(source, tc.fromFile) {
				t.Errorf("source %q does not name %s", source, tc.fromFile)
			}
		})
	}
	if _, err := readSystemFile("/nonexistent/memory.max"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("readSystemFile: %v", err)
	}
}
