package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// build compiles the packages (import paths) into dir and returns the
// binaries' paths.
func build(t *testing.T, dir string, pkgs ...string) []string {
	t.Helper()
	var bins []string
	for _, pkg := range pkgs {
		bin := filepath.Join(dir, filepath.Base(pkg))
		// Static and -trimpath, as the Dockerfile builds: one build
		// configuration besides the race detector's.
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
		bins = append(bins, bin)
	}
	return bins
}

// TestExecTestApp runs the real binaries: quarry-premain activates at a
// fake Coordinator and execs testapp, which reports what it got.
func TestExecTestApp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	// Its real path: the pinned premain writes the absolute path conf
	// through no symbolic link.
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bins := build(t, dir, "github.com/quarry-cc/quarry/cmd/quarry-premain",
		"github.com/quarry-cc/quarry/cmd/quarry-premain/internal/testapp")
	premainBin, testappBin := bins[0], bins[1]

	conf := filepath.Join(dir, "data", "conf")
	for _, tc := range []struct {
		name  string
		argv  []string // the manifest's
		arg0  string   // the premain's own argv[0]; "" for its path
		want0 string   // argv[0] testapp sees
	}{
		{name: "Argv[0] names the program", argv: []string{testappBin}, want0: testappBin},
		// Under Gramine, argv[0] names the application and Argv only
		// supplies the arguments (MarbleRun's premain-libos).
		{name: "own argv[0] names the program", argv: []string{"app"}, arg0: testappBin, want0: "app"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			report := filepath.Join(t.TempDir(), "report.json")
			argv := append(tc.argv, "-env", "GREETING,EDG_MARBLE_TYPE,MARBLE_PREDEFINED_*", "-out", report, conf)
			coord := marbletest.New(t, answer(t, &marblepb.Parameters{
				Files: map[string][]byte{conf: []byte("config")},
				Env:   map[string][]byte{"GREETING": []byte("hello"), "MARBLE_PREDEFINED_ROOT_CA": []byte("root")},
				Argv:  argv,
			}))
			cmd := exec.Command(premainBin)
			if tc.arg0 != "" {
				cmd.Args[0] = tc.arg0
			}
			cmd.Dir = t.TempDir()
			cmd.Env = []string{
				"PATH=" + os.Getenv("PATH"),
				"EDG_MARBLE_TYPE=backend",
				"EDG_MARBLE_COORDINATOR_ADDR=" + coord.Addr,
				"QUARRY_GRAMINE_ATTESTATION_DIR=" + filepath.Join(dir, "none"),
				"QUARRY_COORDINATOR_ROOT_SHA256=" + fmt.Sprintf("%x", sha256.Sum256(coord.CA.Root.Raw)),
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v: %s", err, stderr.Bytes())
			}
			b, err := os.ReadFile(report)
			if err != nil {
				t.Fatalf("%v (stderr %s)", err, stderr.Bytes())
			}
			var r struct {
				Argv  []string
				Cwd   string
				Env   map[string]*string
				Files map[string]struct {
					Data []byte
					Mode string
				}
			}
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			if want := append([]string{tc.want0}, argv[1:]...); !slices.Equal(r.Argv, want) {
				t.Errorf("argv %q, want %q", r.Argv, want)
			}
			for k, want := range map[string]string{"GREETING": "hello", "EDG_MARBLE_TYPE": "backend", "MARBLE_PREDEFINED_ROOT_CA": "root"} {
				if v := r.Env[k]; v == nil || *v != want {
					t.Errorf("env %s = %v, want %q", k, v, want)
				}
			}
			if f := r.Files[conf]; string(f.Data) != "config" || f.Mode != "0600" {
				t.Errorf("file %+v", f)
			}
			if _, err := os.Stat(filepath.Join(cmd.Dir, "uuid")); err != nil {
				t.Errorf("no UUID file in the working directory: %v", err)
			}
		})
	}
}
