package marble_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/marble"
)

// fileWorld is a working directory, a declared file root, and a directory
// outside both that holds a victim file an attacker wants overwritten.
type fileWorld struct {
	work, root, outside, victim string
}

func newFileWorld(t *testing.T) fileWorld {
	t.Helper()
	w := fileWorld{work: t.TempDir(), root: filepath.Join(t.TempDir(), "root"), outside: t.TempDir()}
	if err := os.Mkdir(w.root, 0o700); err != nil {
		t.Fatal(err)
	}
	w.victim = filepath.Join(w.outside, "victim")
	if err := os.WriteFile(w.victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(w.work)
	return w
}

// symlink plants a symbolic link at link pointing to target.
func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// untouched checks that the outside directory holds the victim alone,
// unchanged.
func (w fileWorld) untouched(t *testing.T) {
	t.Helper()
	entries, err := os.ReadDir(w.outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "victim" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the outside directory holds %q, want only the victim", names)
	}
	if b, err := os.ReadFile(w.victim); err != nil || string(b) != "keep" {
		t.Errorf("the victim holds %q (%v), want it unchanged", b, err)
	}
}

// TestWriteFilesRefusesEscapes: a "..", an absolute path outside the file
// roots (or any absolute path without roots), a symbolic link planted as
// the file or as a directory on the way (pointing outside, dangling, or
// even inside the root), and anything but a regular file are refused with
// an error naming the file and the reason; nothing is written outside, and
// nothing at all when any path is refused before writing.
func TestWriteFilesRefusesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, w fileWorld) (path string, roots []string)
		is    error
		want  string
	}{
		{"relative ..", func(t *testing.T, w fileWorld) (string, []string) {
			return "../" + filepath.Base(w.outside) + "/victim", nil
		}, marble.ErrFilePath, `".."`},
		{".. inside a path", func(t *testing.T, w fileWorld) (string, []string) {
			return "a/../../x", nil
		}, marble.ErrFilePath, `".."`},
		{"absolute .. out of a root", func(t *testing.T, w fileWorld) (string, []string) {
			rel, _ := filepath.Rel(w.root, w.victim)
			return w.root + "/" + rel, []string{w.root}
		}, marble.ErrFilePath, `".."`},
		{"absolute outside the roots", func(t *testing.T, w fileWorld) (string, []string) {
			return w.victim, []string{w.root}
		}, marble.ErrFileOutsideRoots, "outside the declared file roots"},
		{"absolute without roots", func(t *testing.T, w fileWorld) (string, []string) {
			return w.victim, nil
		}, marble.ErrFileOutsideRoots, "no file roots are declared"},
		{"a sibling sharing the root's prefix", func(t *testing.T, w fileWorld) (string, []string) {
			return w.root + "evil/x", []string{w.root}
		}, marble.ErrFileOutsideRoots, "outside"},
		{"the root itself", func(t *testing.T, w fileWorld) (string, []string) {
			return w.root, []string{w.root}
		}, marble.ErrFileOutsideRoots, "outside"},
		{"trailing slash", func(t *testing.T, w fileWorld) (string, []string) {
			return "conf/", nil
		}, marble.ErrFilePath, "directory"},
		{"symlink as the file", func(t *testing.T, w fileWorld) (string, []string) {
			symlink(t, w.victim, "config")
			return "config", nil
		}, marble.ErrFileSymlink, "config is a symbolic link"},
		{"dangling symlink as the file", func(t *testing.T, w fileWorld) (string, []string) {
			symlink(t, filepath.Join(w.outside, "new"), "config")
			return "config", nil
		}, marble.ErrFileSymlink, "config is a symbolic link"},
		{"relative symlink as the file", func(t *testing.T, w fileWorld) (string, []string) {
			symlink(t, "../"+filepath.Base(w.outside)+"/victim", "config")
			return "config", nil
		}, marble.ErrFileSymlink, "symbolic link"},
		{"symlink as a directory", func(t *testing.T, w fileWorld) (string, []string) {
			symlink(t, w.outside, "conf")
			return "conf/victim", nil
		}, marble.ErrFileSymlink, "conf is a symbolic link"},
		{"symlink deeper", func(t *testing.T, w fileWorld) (string, []string) {
			if err := os.MkdirAll("a/b", 0o700); err != nil {
				t.Fatal(err)
			}
			symlink(t, w.outside, "a/b/c")
			return "a/b/c/victim", nil
		}, marble.ErrFileSymlink, filepath.Join("a", "b", "c") + " is a symbolic link"},
		{"symlink beneath an absolute root", func(t *testing.T, w fileWorld) (string, []string) {
			symlink(t, w.outside, filepath.Join(w.root, "etc"))
			return filepath.Join(w.root, "etc", "victim"), []string{w.root}
		}, marble.ErrFileSymlink, filepath.Join("root", "etc") + " is a symbolic link"},
		{"symlink within the root", func(t *testing.T, w fileWorld) (string, []string) {
			if err := os.Mkdir(filepath.Join(w.root, "real"), 0o700); err != nil {
				t.Fatal(err)
			}
			symlink(t, "real", filepath.Join(w.root, "link"))
			return filepath.Join(w.root, "link", "x"), []string{w.root}
		}, marble.ErrFileSymlink, "link is a symbolic link"},
		{"a directory as the file", func(t *testing.T, w fileWorld) (string, []string) {
			if err := os.Mkdir("conf", 0o700); err != nil {
				t.Fatal(err)
			}
			return "conf", nil
		}, nil, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newFileWorld(t)
			path, roots := tc.setup(t, w)
			p := &marble.Parameters{
				Files:     map[string][]byte{path: []byte("evil"), "aaa-first": []byte("a")},
				FileRoots: roots,
			}
			err := p.WriteFiles()
			if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.is, tc.want)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("err = %v, want it to name %q", err, path)
			}
			w.untouched(t)
			// Every path is checked before anything is written.
			if errors.Is(err, marble.ErrFilePath) || errors.Is(err, marble.ErrFileOutsideRoots) {
				if _, err := os.Stat("aaa-first"); err == nil {
					t.Error("a file was written although another path was refused")
				}
			}
		})
	}
}

// TestWriteFilesConfined: within the rules, files land where they should:
// relative paths beneath the working directory, absolute ones beneath the
// longest matching root, whose own path may be a symbolic link (the
// operator named it); an existing file is replaced in place.
func TestWriteFilesConfined(t *testing.T) {
	w := newFileWorld(t)
	inner := filepath.Join(w.root, "inner")
	if err := os.Mkdir(inner, 0o700); err != nil {
		t.Fatal(err)
	}
	// A root named through a symbolic link.
	alias := filepath.Join(t.TempDir(), "alias")
	symlink(t, w.root, alias)
	if err := os.WriteFile(filepath.Join(w.root, "existing"), []byte("a much longer old content"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &marble.Parameters{
		Files: map[string][]byte{
			"./rel/./dir//config":                []byte("1"),
			filepath.Join(w.root, "a", "b"):      []byte("2"),
			filepath.Join(inner, "c"):            []byte("3"),
			filepath.Join(alias, "via", "alias"): []byte("4"),
			filepath.Join(w.root, "existing"):    []byte("new"),
		},
		FileRoots: []string{w.root, inner + "/", alias},
	}
	if err := p.WriteFiles(); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(w.work, "rel", "dir", "config"): "1",
		filepath.Join(w.root, "a", "b"):               "2",
		filepath.Join(inner, "c"):                     "3",
		filepath.Join(w.root, "via", "alias"):         "4",
		filepath.Join(w.root, "existing"):             "new",
	} {
		b, err := os.ReadFile(path)
		if err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", path, b, err, want)
		}
		if fi, err := os.Lstat(path); err != nil || fi.Mode() != 0o600 {
			t.Errorf("%s: mode %v (%v), want a regular file with mode 0600", path, fi.Mode(), err)
		}
	}
	w.untouched(t)

	// "/" admits every absolute path (what a pinned Activate sets),
	// through no symbolic link: the real path of the temporary directory.
	real, err := filepath.EvalSymlinks(w.root)
	if err != nil {
		t.Fatal(err)
	}
	p = &marble.Parameters{Files: map[string][]byte{filepath.Join(real, "slash"): []byte("5")}, FileRoots: []string{"/"}}
	if err := p.WriteFiles(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(w.root, "slash")); string(b) != "5" {
		t.Errorf("slash = %q", b)
	}
	// A relative root is refused.
	p.FileRoots = []string{"root"}
	if err := p.WriteFiles(); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("err = %v for a relative root", err)
	}
}
