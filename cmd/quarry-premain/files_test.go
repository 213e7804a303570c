package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// TestPremainFiles: the manifest's files are written beneath the working
// directory and the file roots only. A "..", an absolute path outside the
// roots (or any absolute path when the Coordinator is not pinned and no
// roots are declared) and a planted symbolic link end the premain with
// exit status 1 and a message naming the file and the reason; nothing is
// written outside and nothing is exec'd. Within the rules, the files are
// written.
func TestPremainFiles(t *testing.T) {
	type world struct {
		h       *harness
		outside string // a directory outside the working directory and the roots
		victim  string // a file in it
	}
	for _, tc := range []struct {
		name   string
		pinned bool
		setup  func(t *testing.T, w world) (files map[string][]byte, env []string)
		want   []string // in stderr; nil: success
		check  func(t *testing.T, w world)
	}{
		{name: "..", pinned: true, setup: func(t *testing.T, w world) (map[string][]byte, []string) {
			rel, err := filepath.Rel(w.h.dir, w.victim)
			if err != nil || !strings.HasPrefix(rel, "..") {
				t.Fatalf("%q %v", rel, err)
			}
			return map[string][]byte{rel: []byte("evil")}, nil
		}, want: []string{`".."`}},
		{name: "absolute outside the roots", pinned: true, setup: func(t *testing.T, w world) (map[string][]byte, []string) {
			return map[string][]byte{w.victim: []byte("evil")}, []string{"QUARRY_FILE_ROOTS=" + filepath.Join(w.h.dir, "data")}
		}, want: []string{"outside the declared file roots", "data"}},
		{name: "absolute, unpinned, no roots", setup: func(t *testing.T, w world) (map[string][]byte, []string) {
			return map[string][]byte{w.victim: []byte("evil")}, nil
		}, want: []string{"no file roots are declared", "QUARRY_FILE_ROOTS"}},
		{name: "planted symbolic link as a directory", pinned: true, setup: func(t *testing.T, w world) (map[string][]byte, []string) {
			if err := os.Symlink(w.outside, filepath.Join(w.h.dir, "conf")); err != nil {
				t.Fatal(err)
			}
			return map[string][]byte{"conf/victim": []byte("evil")}, nil
		}, want: []string{"conf is a symbolic link", "not written through symbolic links"}},
		{name: "planted symbolic link as the file", pinned: true, setup: func(t *testing.T, w world) (map[string][]byte, []string) {
			if err := os.MkdirAll(filepath.Join(w.h.dir, "etc", "app"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(w.victim, filepath.Join(w.h.dir, "etc", "app", "key.pem")); err != nil {
				t.Fatal(err)
			}
			return map[string][]byte{filepath.Join(w.h.dir, "etc", "app", "key.pem"): []byte("evil")}, nil
		}, want: []string{"key.pem is a symbolic link"}},
		{name: "unpinned with a declared root", setup: func(t *testing.T, w world) (map[string][]byte, []string) {
			return map[string][]byte{filepath.Join(w.h.dir, "data", "conf", "a"): []byte("a"), "rel": []byte("b")},
				[]string{"QUARRY_FILE_ROOTS=/nonexistent-root:" + filepath.Join(w.h.dir, "data")}
		}, check: func(t *testing.T, w world) {
			for path, want := range map[string]string{filepath.Join(w.h.dir, "data", "conf", "a"): "a", filepath.Join(w.h.dir, "rel"): "b"} {
				if b, err := os.ReadFile(path); err != nil || string(b) != want {
					t.Errorf("%s = %q (%v), want %q", path, b, err, want)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var files map[string][]byte
			coord := marbletest.New(t, func(req marbletest.Request) (*marblepb.Parameters, error) {
				return answer(t, &marblepb.Parameters{Files: files, Argv: []string{"app"}})(req)
			})
			h := newHarness(t, coord.Addr)
			h.executable("bin/app")
			if err := os.Mkdir(filepath.Join(h.dir, "data"), 0o700); err != nil {
				t.Fatal(err)
			}
			w := world{h: h, outside: t.TempDir()}
			w.victim = filepath.Join(w.outside, "victim")
			if err := os.WriteFile(w.victim, []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			var env []string
			files, env = tc.setup(t, w)
			h.setenv(env...)
			if tc.pinned {
				h.pin(coord.CA.Root)
			}
			code := h.run()
			if tc.want == nil {
				if code != 0 || len(h.calls) != 1 {
					t.Fatalf("exit %d, %d execs: %s", code, len(h.calls), h.stderr.String())
				}
				tc.check(t, w)
				return
			}
			if code != 1 || len(h.calls) != 0 {
				t.Fatalf("exit %d, %d execs, want 1 and none (stderr %q)", code, len(h.calls), h.stderr.String())
			}
			for path := range files {
				tc.want = append(tc.want, "writing file "+`"`+path+`"`)
			}
			for _, want := range tc.want {
				if !strings.Contains(h.stderr.String(), want) {
					t.Errorf("stderr %q does not say %q", h.stderr.String(), want)
				}
			}
			entries, err := os.ReadDir(w.outside)
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(w.victim); len(entries) != 1 || string(b) != "keep" {
				t.Errorf("outside: %d entries, victim %q; want the victim alone, unchanged", len(entries), b)
			}
		})
	}
}
