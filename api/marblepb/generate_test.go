package marblepb_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// generatedFiles are the committed outputs of `go generate` in this package.
var generatedFiles = []string{"marble.pb.go", "marble_grpc.pb.go"}

// protocVersionLine matches the header line in which each plugin records the
// version of protoc that ran it:
//
//	// 	protoc        v3.21.12        (protoc-gen-go)
//	// - protoc             v3.21.12   (protoc-gen-go-grpc)
var protocVersionLine = regexp.MustCompile(`(?m)^// (\t|- )protoc +\S+$`)

// TestGeneratedCodeIsCurrent regenerates the Go code from marble.proto into a
// temporary directory, with the plugin versions pinned in go.mod, and fails
// if it differs from the committed files. The comparison is byte for byte
// except for the one header line that names protoc's version: protoc only
// parses marble.proto (its output, the file descriptor, is embedded in
// marble.pb.go and compared), while the Go code is written by the pinned
// plugins, so a developer with another protoc release need not churn the
// files. The committed files were made with Debian bookworm's protoc 3.21.12.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		msg := "protoc is not installed (Debian: apt-get install protobuf-compiler; .ci/run installs it), " +
			"so the generated code cannot be checked against marble.proto"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// Read the inputs in this process too, so that go test's result cache
	// notices when they change (the generator runs in a child process).
	for _, input := range []string{"marble.proto", filepath.Join("..", "..", "go.mod")} {
		if _, err := os.ReadFile(input); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	// Static and -trimpath (for the plugins go tool builds too), the
	// configuration of the release build, whose compiled packages they
	// share.
	cmd := exec.Command("go", "run", "./internal/protogen", "-out", dir)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-trimpath")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generating: %v\n%s", err, out)
	}
	for _, name := range generatedFiles {
		fresh, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("%v (run `go generate ./api/marblepb`)", err)
		}
		if diff := firstDifference(ignoreProtocVersion(committed), ignoreProtocVersion(fresh)); diff != "" {
			t.Errorf("%s is stale: it differs from what marble.proto and go.mod's tool versions generate; "+
				"run `go generate ./api/marblepb` and commit the result\n%s", name, diff)
		}
	}
}

func ignoreProtocVersion(b []byte) []byte {
	return protocVersionLine.ReplaceAll(b, []byte("// ${1}protoc (version not compared)"))
}

// firstDifference describes the first line where committed and fresh
// differ, or returns "" when they are equal.
func firstDifference(committed, fresh []byte) string {
	if bytes.Equal(committed, fresh) {
		return ""
	}
	c := strings.Split(string(committed), "\n")
	f := strings.Split(string(fresh), "\n")
	for i := 0; ; i++ {
		if i < len(c) && i < len(f) && c[i] == f[i] {
			continue
		}
		line := func(lines []string) string {
			if i < len(lines) {
				return fmt.Sprintf("%q", lines[i])
			}
			return "(end of file)"
		}
		return fmt.Sprintf("first difference at line %d:\n  committed: %s\n  generated: %s", i+1, line(c), line(f))
	}
}
