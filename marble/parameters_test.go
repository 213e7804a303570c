package marble_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/marble"
)

func TestApply(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	abs := filepath.Join(dir, "abs", "deep", "secret.pem")
	// An existing file open to others is tightened.
	if err := os.WriteFile("existing", []byte("old content that is longer"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("QUARRY_TEST_APPLY", "old")
	t.Setenv("QUARRY_TEST_APPLY_NEW", "") // restored after the test

	p := &marble.Parameters{
		Files: map[string][]byte{
			"rel/dir/config.json": []byte(`{"a":1}`),
			abs:                   {0, 1, 2, 0xff},
			"existing":            []byte("new"),
		},
		Env:       map[string][]byte{"QUARRY_TEST_APPLY": []byte("new value"), "QUARRY_TEST_APPLY_NEW": []byte("x=y")},
		FileRoots: []string{dir},
	}
	argv, err := p.Apply()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(argv, []string{"./marble"}) {
		t.Errorf("argv = %q, want [./marble] for an empty Argv", argv)
	}
	for path, want := range p.Files {
		got, err := os.ReadFile(path)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s = %q (err %v), want %q", path, got, err, want)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v (err %v), want 0600", path, fi.Mode().Perm(), err)
		}
	}
	for _, d := range []string{"rel", "rel/dir", filepath.Join(dir, "abs"), filepath.Dir(abs)} {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("directory %s mode %v (err %v), want 0700", d, fi.Mode(), err)
		}
	}
	if got := os.Getenv("QUARRY_TEST_APPLY"); got != "new value" {
		t.Errorf("QUARRY_TEST_APPLY = %q", got)
	}
	if got := os.Getenv("QUARRY_TEST_APPLY_NEW"); got != "x=y" {
		t.Errorf("QUARRY_TEST_APPLY_NEW = %q", got)
	}

	p.Argv = []string{"/bin/app", "-v"}
	if argv, _ := p.Apply(); !slices.Equal(argv, p.Argv) {
		t.Errorf("argv = %q, want %q", argv, p.Argv)
	}
	argv[0] = "changed"
	if p.Argv[0] != "/bin/app" {
		t.Error("Apply returned Argv itself, not a copy")
	}
}

func TestApplyFailures(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("QUARRY_TEST_UNTOUCHED", "before")
	for _, tc := range []struct {
		name string
		p    marble.Parameters
		want string
	}{
		{"parent is a file", marble.Parameters{Files: map[string][]byte{filepath.Join(blocker, "x"): nil}, FileRoots: []string{dir}}, "not a directory"},
		{"empty path", marble.Parameters{Files: map[string][]byte{"": nil}}, "it is empty"},
		{"NUL in value", marble.Parameters{Env: map[string][]byte{"QUARRY_TEST_UNTOUCHED": []byte("a\x00b")}}, "QUARRY_TEST_UNTOUCHED"},
		{"= in name", marble.Parameters{Env: map[string][]byte{"A=B": nil, "QUARRY_TEST_UNTOUCHED": []byte("after")}}, `"A=B"`},
		{"empty name", marble.Parameters{Env: map[string][]byte{"": nil}}, "empty name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.p.Apply()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one containing %q", err, tc.want)
			}
			if got := os.Getenv("QUARRY_TEST_UNTOUCHED"); got != "before" {
				t.Errorf("a failed Apply set the environment: %q", got)
			}
		})
	}
}

func TestEnviron(t *testing.T) {
	p := &marble.Parameters{Env: map[string][]byte{"B": []byte("new"), "C": []byte("c"), "A": []byte("a=1")}}
	got, err := p.Environ([]string{"PATH=/bin", "B=old", "D=d", "B=dup", "=weird"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PATH=/bin", "D=d", "=weird", "A=a=1", "B=new", "C=c"}
	if !slices.Equal(got, want) {
		t.Errorf("Environ = %q, want %q", got, want)
	}
	if _, err := (&marble.Parameters{Env: map[string][]byte{"X": []byte("\x00")}}).Environ(nil); err == nil {
		t.Error("no error for a NUL in a value")
	}
	if got, _ := (&marble.Parameters{}).Environ([]string{"A=1"}); !slices.Equal(got, []string{"A=1"}) {
		t.Errorf("Environ without Env = %q", got)
	}
}
