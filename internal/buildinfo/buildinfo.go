// Package buildinfo tells which build a binary is: the version and commit
// stamped at link time (the Dockerfile's VERSION and COMMIT build
// arguments, docs/deployment.md "Container image"), else what the Go
// toolchain recorded (the module version, and the VCS revision of a build
// inside a git checkout).
package buildinfo

import "runtime/debug"

// Set by the linker: go build -ldflags "-X
// github.com/quarry-cc/quarry/internal/buildinfo.version=v1.2.3 -X
// github.com/quarry-cc/quarry/internal/buildinfo.commit=<sha>".
var (
	version string
	commit  string
)

// Devel is the version of a build that has none.
const Devel = "(devel)"

// Version returns the stamped version, else the module version, else
// Devel.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return Devel
}

// Commit returns the stamped commit, else the recorded VCS revision, else
// "".
func Commit() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}
