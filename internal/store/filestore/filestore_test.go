package filestore

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

const name = "sealed_data"

func newStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := New(dir, name)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func save(t *testing.T, s *Store, blob string, prev store.Revision) store.Revision {
	t.Helper()
	rev, err := s.Save(t.Context(), []byte(blob), prev)
	if err != nil {
		t.Fatalf("Save(%q, %q): %v", blob, prev, err)
	}
	return rev
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, t.TempDir())
	})
}

func TestModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "seal")
	s := newStore(t, dir)
	save(t, s, "state", "")
	for _, tc := range []struct {
		path string
		want os.FileMode
	}{
		{dir, os.ModeDir | 0o700},
		{filepath.Join(dir, name), 0o600},
	} {
		fi, err := os.Stat(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != tc.want {
			t.Errorf("mode of %s = %v, want %v", tc.path, fi.Mode(), tc.want)
		}
	}
}

func TestNoTempFileLeft(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	rev := save(t, s, "one", "")
	save(t, s, "two", rev)
	if got := storetest.Files(t, dir); !slices.Equal(got, []string{name}) {
		t.Errorf("directory holds %q, want only %q", got, name)
	}
}

func TestRevisionIsContentHash(t *testing.T) {
	s := newStore(t, t.TempDir())
	rev := save(t, s, "state", "")
	sum := sha256.Sum256([]byte("state"))
	if want := store.Revision(hex.EncodeToString(sum[:])); rev != want {
		t.Errorf("revision = %q, want %q", rev, want)
	}
}

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	rev := save(t, newStore(t, dir), "persisted", "")

	s := newStore(t, dir)
	blob, got, err := s.Load(t.Context())
	if err != nil || string(blob) != "persisted" || got != rev {
		t.Fatalf("Load after reopening = %q, %q, %v; want %q, %q", blob, got, err, "persisted", rev)
	}
	save(t, s, "next", rev)
}

// TestStaleTempFile simulates a crash between writing <name>.tmp and the
// rename: the leftover file is not the state and the next Save replaces it.
func TestStaleTempFile(t *testing.T) {
	for _, withState := range []bool{false, true} {
		t.Run(map[bool]string{false: "no state", true: "with state"}[withState], func(t *testing.T) {
			dir := t.TempDir()
			var rev store.Revision
			if withState {
				rev = save(t, newStore(t, dir), "committed", "")
			}
			tmp := filepath.Join(dir, name+".tmp")
			if err := os.WriteFile(tmp, []byte("half-written garbage from a crash"), 0o644); err != nil {
				t.Fatal(err)
			}

			s := newStore(t, dir)
			blob, got, err := s.Load(t.Context())
			switch {
			case !withState && !errors.Is(err, store.ErrNotFound):
				t.Fatalf("Load = %q, %v; want ErrNotFound (the temp file is not the state)", blob, err)
			case withState && (err != nil || string(blob) != "committed" || got != rev):
				t.Fatalf("Load = %q, %q, %v; want the committed state", blob, got, err)
			}

			save(t, s, "new", rev)
			if got := readFile(t, filepath.Join(dir, name)); got != "new" {
				t.Errorf("file holds %q, want %q", got, "new")
			}
			if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("temp file still present after Save (stat: %v)", err)
			}
			if fi, _ := os.Stat(filepath.Join(dir, name)); fi.Mode() != 0o600 {
				t.Errorf("mode = %v, want 0600 (not the stale temp file's 0644)", fi.Mode())
			}
		})
	}
}

// TestOtherInstance: a blob written through another Store on the same file
// makes a Save from a stale revision fail.
func TestOtherInstance(t *testing.T) {
	dir := t.TempDir()
	a, b := newStore(t, dir), newStore(t, dir)
	rev1 := save(t, a, "from a", "")
	if _, got, err := b.Load(t.Context()); err != nil || got != rev1 {
		t.Fatalf("b.Load revision = %q, %v; want %q", got, err, rev1)
	}
	rev2 := save(t, a, "from a again", rev1)
	if _, err := b.Save(t.Context(), []byte("from b"), rev1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("b.Save with a stale revision: err = %v, want ErrConflict", err)
	}
	if got := readFile(t, filepath.Join(dir, name)); got != "from a again" {
		t.Errorf("file holds %q after the failed save", got)
	}
	save(t, b, "from b", rev2)
}

// TestUnreadable: a state file that exists but cannot be read is reported as
// an error, never as ErrNotFound (that would mean a fresh start) nor as a
// conflict.
func TestUnreadable(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, dir)
	_, _, err := s.Load(t.Context())
	if err == nil || errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Load of an unreadable file: err = %v, want a read error", err)
	}
	if !strings.Contains(err.Error(), name) {
		t.Errorf("Load error %q does not name the file", err)
	}
	if _, err := s.Save(t.Context(), []byte("x"), ""); err == nil || errors.Is(err, store.ErrConflict) {
		t.Fatalf("Save over an unreadable file: err = %v, want a read error", err)
	}
}

func TestMoveAsideNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	ctx := t.Context()

	// Someone already left <name>.corrupt.1 here.
	existing := filepath.Join(dir, name+".corrupt.1")
	if err := os.WriteFile(existing, []byte("older"), 0o600); err != nil {
		t.Fatal(err)
	}

	want := []string{name + ".corrupt", name + ".corrupt.2", name + ".corrupt.3"}
	for i, content := range []string{"first", "second", "third"} {
		save(t, s, content, "")
		where, err := s.MoveAside(ctx, "corrupt")
		if err != nil {
			t.Fatalf("MoveAside %d: %v", i, err)
		}
		if where != filepath.Join(dir, want[i]) {
			t.Errorf("MoveAside %d went to %s, want %s", i, where, want[i])
		}
	}
	for i, content := range []string{"first", "second", "third"} {
		if got := readFile(t, filepath.Join(dir, want[i])); got != content {
			t.Errorf("%s holds %q, want %q", want[i], got, content)
		}
	}
	if got := readFile(t, existing); got != "older" {
		t.Errorf("%s was overwritten: holds %q", existing, got)
	}
	if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after MoveAside", name)
	}
}

func TestMoveAsideBadSuffix(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	rev := save(t, s, "state", "")
	for _, suffix := range []string{"", ".", "..", "a/b", "../escape", `a\b`, "tmp", "x\x00"} {
		if where, err := s.MoveAside(t.Context(), suffix); err == nil {
			t.Errorf("MoveAside(%q) succeeded: %s", suffix, where)
		}
	}
	if _, got, err := s.Load(t.Context()); err != nil || got != rev {
		t.Fatalf("state changed by rejected MoveAside calls: %q, %v", got, err)
	}
	if got := storetest.Files(t, dir); !slices.Equal(got, []string{name}) {
		t.Errorf("directory holds %q, want only %q", got, name)
	}
}

func TestNewBadName(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"", ".", "..", "a/b", "../x", ".lock", "x.tmp", "x\x00"} {
		if _, err := New(dir, n); err == nil {
			t.Errorf("New(dir, %q) succeeded", n)
		}
	}
}

func TestNewDirIsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(file, name); err == nil {
		t.Error("New with a regular file as directory succeeded")
	}
}

func lockSupported(t *testing.T) {
	switch runtime.GOOS {
	case "darwin", "dragonfly", "freebsd", "linux", "netbsd", "openbsd":
	default:
		t.Skipf("LockDir is not supported on %s", runtime.GOOS)
	}
}

func TestLockDir(t *testing.T) {
	lockSupported(t)
	dir := filepath.Join(t.TempDir(), "seal")
	unlock, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, ".lock")); err != nil || fi.Mode() != 0o600 {
		t.Errorf("lock file: %v, %v; want mode 0600", fi, err)
	}

	_, err = LockDir(dir)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second LockDir: err = %v, want ErrLocked", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "another") || !strings.Contains(msg, dir) {
		t.Errorf("second LockDir error %q should say another process holds %s", msg, dir)
	}

	if err := unlock(); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	if err := unlock(); err == nil {
		t.Error("second unlock reported success")
	}
	unlock2, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir after unlock: %v", err)
	}
	if err := unlock2(); err != nil {
		t.Fatal(err)
	}
}

// TestLockDirOtherProcess runs this test binary again as a child that holds
// the lock, and checks that the parent cannot take it until the child exits.
func TestLockDirOtherProcess(t *testing.T) {
	lockSupported(t)
	if dir := os.Getenv("FILESTORE_LOCK_CHILD"); dir != "" {
		lockChild(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockDirOtherProcess$")
	cmd.Env = append(os.Environ(), "FILESTORE_LOCK_CHILD="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		stdin.Close()
		cmd.Wait()
		t.Fatalf("child: %q, %v", line, err)
	}

	if _, err := LockDir(dir); !errors.Is(err, ErrLocked) {
		t.Errorf("LockDir while another process holds it: err = %v, want ErrLocked", err)
	}

	stdin.Close() // the child exits, and the kernel releases its lock
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	unlock, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir after the other process exited: %v", err)
	}
	unlock()
}

// lockChild holds the lock on dir until its stdin closes.
func lockChild(dir string) {
	if _, err := LockDir(dir); err != nil {
		os.Stdout.WriteString("error: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("locked\n")
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestStageLeavesNoTempFile: a staged blob, saved or discarded, leaves only
// the store's file, with its mode.
func TestStageLeavesNoTempFile(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	rev, err := s.Stage(t.Context(), []byte("staged")).Save(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	s.Stage(t.Context(), []byte("discarded")).Discard()
	if got := storetest.Files(t, dir); !slices.Equal(got, []string{name}) {
		t.Errorf("directory holds %q, want only %q", got, name)
	}
	if fi, _ := os.Stat(filepath.Join(dir, name)); fi.Mode() != 0o600 {
		t.Errorf("mode = %v, want 0600", fi.Mode())
	}
	save(t, s, "next", rev)
}

// TestStageWriteFails: when the staged file cannot be written, its Save
// fails and the stored blob stays.
func TestStageWriteFails(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	rev := save(t, s, "kept", "")
	// A non-empty directory where the temporary file goes: it can be
	// neither removed nor created.
	if err := os.MkdirAll(filepath.Join(dir, name+".tmp", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stage(t.Context(), []byte("lost")).Save(t.Context(), rev); err == nil {
		t.Fatal("the staged Save succeeded although its file could not be written")
	}
	if got := readFile(t, filepath.Join(dir, name)); got != "kept" {
		t.Errorf("file holds %q, want %q", got, "kept")
	}
}

// TestStageWithOneP: with GOMAXPROCS 1 the staged file is written before
// Stage returns (a background write would hold the only P while it
// syncs), and the staged blob is stored as with more Ps.
func TestStageWithOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	dir := t.TempDir()
	s := newStore(t, dir)
	staged := s.Stage(t.Context(), []byte("staged with one P"))
	if got := readFile(t, filepath.Join(dir, name+".tmp")); got != "staged with one P" {
		t.Fatalf("after Stage the temporary file holds %q", got)
	}
	rev, err := staged.Save(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, name)); got != "staged with one P" || rev != revision([]byte("staged with one P")) {
		t.Fatalf("file holds %q (revision %q)", got, rev)
	}
}
