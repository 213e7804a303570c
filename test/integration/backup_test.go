package integration

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// runTool runs the coordinator binary with args (backup, restore) and
// returns its exit code and stderr.
func runTool(t *testing.T, stdin []byte, args ...string) (code int, stdout []byte, stderr string) {
	t.Helper()
	cmd := exec.Command(coordinatorBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("running coordinator %v: %v", args, err)
	}
	return code, out.Bytes(), errb.String()
}

// runToolOK runs the tool and fails unless it exits 0.
func runToolOK(t *testing.T, args ...string) string {
	t.Helper()
	code, _, stderr := runTool(t, nil, args...)
	if code != 0 {
		t.Fatalf("coordinator %v: exit %d\n%s", args, code, stderr)
	}
	return stderr
}

// plainValue reads the user-defined plain secret's value.
func plainValue(t *testing.T, c *coordinator, hc *http.Client) string {
	t.Helper()
	return string(getSecrets(t, c, hc, "plain")["plain"].Public)
}

// Backups taken while secrets are uploaded in a loop always
// restore and open: state 3, the same manifest and root, and the last
// upload acknowledged before the backup started, or a later one.
func TestBackupDuringWriteLoop(t *testing.T) {
	t.Parallel()
	s := newSecretsSetup(t)
	hc := s.c.client(nil, nil)
	root := fetchRoot(t, s.c, hc)
	raw := s.f.bytes(t)
	expect(t, postSecrets(t, s.c, s.alice, map[string]any{"plain": map[string]any{"key": []byte("v0")}}), http.StatusOK, "success")

	var acked atomic.Int64 // the last acknowledged upload
	stop := make(chan struct{})
	loopErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				loopErr <- nil
				return
			default:
			}
			body, _ := json.Marshal(map[string]any{"secrets": map[string]any{"plain": map[string]any{"key": []byte("v" + strconv.Itoa(i))}}})
			resp, err := s.alice.Post(s.c.url("/api/v2/secrets"), "application/json", bytes.NewReader(body))
			if err != nil {
				loopErr <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				loopErr <- fmt.Errorf("upload %d: %s", i, resp.Status)
				return
			}
			acked.Store(int64(i))
		}
	}()

	const backups = 6
	type taken struct {
		file   string
		before int64
	}
	var files []taken
	work := t.TempDir()
	for k := range backups {
		// Let some uploads land between backups.
		for start := acked.Load(); acked.Load() < start+3; {
			time.Sleep(5 * time.Millisecond)
		}
		before := acked.Load()
		file := filepath.Join(work, fmt.Sprintf("backup-%d.qbk", k))
		stderr := runToolOK(t, "backup", "--seal-dir", s.c.sealDir, "--out", file)
		if !strings.Contains(stderr, "read without the directory lock") {
			t.Errorf("backup %d did not report reading beside the running Coordinator:\n%s", k, stderr)
		}
		files = append(files, taken{file, before})
	}
	close(stop)
	wg.Wait()
	if err := <-loopErr; err != nil {
		t.Fatal(err)
	}
	last := acked.Load()
	t.Logf("%d uploads acknowledged during %d backups", last, backups)
	s.c.kill()

	for k, b := range files {
		dir := filepath.Join(work, fmt.Sprintf("restored-%d", k))
		runToolOK(t, "restore", "--seal-dir", dir, "--in", b.file)
		c := startCoordinator(t, dir)
		chc := c.client(nil, nil)
		expectState(t, c, chc, 3, msgRunning)
		if got := fetchRoot(t, c, chc); !got.Equal(root) {
			t.Fatalf("backup %d: another root certificate", k)
		}
		checkManifest(t, c, c.client(root, nil), root, raw)
		alice := s.f.users["alice"].cert
		v := plainValue(t, c, c.client(root, &alice))
		n, err := strconv.ParseInt(strings.TrimPrefix(v, "v"), 10, 64)
		if err != nil || n < b.before || n > last+1 {
			t.Fatalf("backup %d (taken after upload %d acknowledged, %d in all) restores secret %q", k, b.before, last, v)
		}
		c.kill()
	}
}

// Restoring over a newer state needs --force, keeps the newer files aside
// and brings back the backup's state; restore refuses a running
// Coordinator, and truncated or corrupt files, with their exit codes.
func TestRestoreRules(t *testing.T) {
	t.Parallel()
	s := newSecretsSetup(t)
	alice := s.f.users["alice"].cert
	expect(t, postSecrets(t, s.c, s.alice, map[string]any{"plain": map[string]any{"key": []byte("old")}}), http.StatusOK, "success")
	work := t.TempDir()
	file := filepath.Join(work, "b.qbk")
	runToolOK(t, "backup", "--seal-dir", s.c.sealDir, "--out", file)
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Never overwrites a backup file.
	if code, _, stderr := runTool(t, nil, "backup", "--seal-dir", s.c.sealDir, "--out", file); code != 1 || !strings.Contains(stderr, "exists") {
		t.Fatalf("backup over an existing file: exit %d\n%s", code, stderr)
	}
	expect(t, postSecrets(t, s.c, s.alice, map[string]any{"plain": map[string]any{"key": []byte("newer")}}), http.StatusOK, "success")

	// A running Coordinator: exit 3, nothing changed.
	before := readSealed(t, s.c.sealDir)
	code, _, stderr := runTool(t, nil, "restore", "--seal-dir", s.c.sealDir, "--in", file, "--force")
	if code != 3 || !strings.Contains(stderr, "in use by a running Coordinator") {
		t.Fatalf("restore beside a running Coordinator: exit %d\n%s", code, stderr)
	}
	if readSealed(t, s.c.sealDir) != before {
		t.Fatal("a refused restore changed the seal directory")
	}
	if err := s.c.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// Truncated and corrupt files: exit 5, nothing changed.
	for name, bad := range map[string][]byte{
		"truncated": good[:len(good)*2/3],
		"corrupt":   flipByte(good, 700),
		"empty":     {},
	} {
		path := filepath.Join(work, name)
		os.WriteFile(path, bad, 0o600)
		code, _, stderr := runTool(t, nil, "restore", "--seal-dir", s.c.sealDir, "--in", path, "--force")
		if code != 5 || !strings.Contains(stderr, "not a valid Quarry backup") {
			t.Fatalf("%s backup: exit %d\n%s", name, code, stderr)
		}
		if readSealed(t, s.c.sealDir) != before {
			t.Fatalf("restoring a %s backup changed the seal directory", name)
		}
	}

	// A newer state: exit 4 without --force.
	code, _, stderr = runTool(t, nil, "restore", "--seal-dir", s.c.sealDir, "--in", file)
	if code != 4 || !strings.Contains(stderr, "--force") {
		t.Fatalf("restore over a newer state: exit %d\n%s", code, stderr)
	}
	if readSealed(t, s.c.sealDir) != before {
		t.Fatal("a refused restore changed the seal directory")
	}
	// From standard input, forced.
	code, _, stderr = runTool(t, good, "restore", "--seal-dir", s.c.sealDir, "--in", "-", "--force")
	if code != 0 {
		t.Fatalf("forced restore: exit %d\n%s", code, stderr)
	}
	aside, _ := filepath.Glob(filepath.Join(s.c.sealDir, "sealed_*.before-restore-*"))
	if len(aside) != 2 {
		t.Fatalf("replaced files kept: %v", aside)
	}
	// The same backup again: nothing to do. (Once a Coordinator has
	// opened it, the state holds the record of the restore in its update
	// log, and is no longer the backup's.)
	if stderr := runToolOK(t, "restore", "--seal-dir", s.c.sealDir, "--in", file); !strings.Contains(stderr, "nothing changed") {
		t.Fatalf("restoring the same state again:\n%s", stderr)
	}
	s.c.start()
	expectState(t, s.c, s.c.client(nil, nil), 3, msgRunning)
	if v := plainValue(t, s.c, s.c.client(nil, &alice)); v != "old" {
		t.Fatalf("after the restore the secret is %q, want the backup's", v)
	}
	s.c.kill()

	// Backup: no state (exit 6), usage (exit 2), to standard output.
	if code, _, stderr := runTool(t, nil, "backup", "--seal-dir", t.TempDir(), "--out", filepath.Join(work, "x")); code != 6 {
		t.Fatalf("backup of an empty directory: exit %d\n%s", code, stderr)
	}
	if code, _, _ := runTool(t, nil, "backup", "--seal-dir", s.c.sealDir); code != 2 {
		t.Fatalf("backup without --out: exit %d", code)
	}
	if code, _, _ := runTool(t, nil, "restore", "--bogus"); code != 2 {
		t.Fatalf("restore with an unknown flag: exit %d", code)
	}
	code, out, stderr := runTool(t, nil, "backup", "--seal-dir", s.c.sealDir, "--out", "-")
	if code != 0 {
		t.Fatalf("backup to standard output: exit %d, %d bytes\n%s", code, len(out), stderr)
	}
	dir := filepath.Join(work, "from-stdout")
	if code, _, stderr := runTool(t, out, "restore", "--seal-dir", dir, "--in", "-"); code != 0 {
		t.Fatalf("restore of the standard-output backup: exit %d\n%s", code, stderr)
	}
}

func flipByte(b []byte, i int) []byte {
	c := append([]byte{}, b...)
	c[i] ^= 0xff
	return c
}

// readSealed returns the seal directory's sealed files, for comparison.
func readSealed(t *testing.T, dir string) string {
	t.Helper()
	var out strings.Builder
	for _, name := range []string{"sealed_data", "sealed_key"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&out, "%s:%x;", name, b)
	}
	return out.String()
}

// A restored backup opens where the sealing key is the same, and leads to
// recovery mode where it differs (Gramine sealing with another signer's
// key); the recovery secret then restores it. Either way the update log
// records the restore (into an empty directory: what it replaced is not
// known), the recovery after it.
func TestRestoreOtherSealingKey(t *testing.T) {
	t.Parallel()
	g := newGramineSealing(t, "ProductKey")
	work := t.TempDir()
	file := filepath.Join(work, "b.qbk")
	runToolOK(t, "backup", "--seal-dir", g.c.sealDir, "--out", file)
	g.c.kill()

	same := filepath.Join(work, "same")
	runToolOK(t, "restore", "--seal-dir", same, "--in", file)
	c := startCoordinator(t, same, g.c.env...)
	hc := c.client(nil, nil)
	expectState(t, c, hc, 3, msgRunning)
	checkManifest(t, c, c.client(g.root, nil), g.root, g.raw)
	checkRestoreRecorded(t, c, g.root, "")
	c.kill()

	// Another machine: another sealing key.
	g.dev.SetSealingKey(t, "ProductKey", nil)
	other := filepath.Join(work, "other")
	runToolOK(t, "restore", "--seal-dir", other, "--in", file)
	g.c = startCoordinator(t, other, g.c.env...)
	expectState(t, g.c, g.c.client(nil, nil), 1, msgRecovery)
	if !strings.Contains(g.c.Logs(), "sealed by another enclave") {
		t.Errorf("the log does not say the key was sealed elsewhere:\n%s", g.c.Logs())
	}
	g.upload(t, "key1", 0)
	g.checkRecovered(t)
	checkRestoreRecorded(t, g.c, g.root, "quarry: state recovered")
}

// checkRestoreRecorded checks, with the independent verifier, that c's log
// records one restore into an empty directory, after the restored entries,
// followed by an entry whose update is then (if set).
func checkRestoreRecorded(t *testing.T, c *coordinator, root *x509.Certificate, then string) {
	t.Helper()
	log := independentLog(t, c, root, -1)
	rs, err := log.Restores()
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].ReplacedState != "none" || rs[0].Replaced != nil || rs[0].Seq != rs[0].RestoredCount+1 {
		t.Fatalf("restore records %+v", rs)
	}
	if then == "" {
		return
	}
	if uint64(len(log.Entries)) <= rs[0].Seq || !strings.Contains(log.Entries[rs[0].Seq].Entry, `"update":"`+then+`"`) {
		t.Fatalf("the entry after the restore record is not %q", then)
	}
}

// uploadPlain uploads the plain secret with value v.
func uploadPlain(c *coordinator, hc *http.Client, v string) error {
	body, _ := json.Marshal(map[string]any{"secrets": map[string]any{"plain": map[string]any{"key": []byte(v)}}})
	resp, err := hc.Post(c.url("/api/v2/secrets"), "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("upload %s: %s", v, resp.Status)
	}
	return nil
}

// segmentFiles lists the update log segment files of a seal directory.
func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "updatelog"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if _, err := strconv.ParseUint(e.Name(), 10, 64); err == nil {
			names = append(names, e.Name())
		}
	}
	return names
}

// A backup carries the update log segments, so a
// state whose log spans several segments restores into a fresh directory
// with its whole log: GET /api/v2/update shows every entry and
// `quarry manifest log --verify` passes. So does a backup taken while
// uploads run.
func TestBackupKeepsUpdateLog(t *testing.T) {
	t.Parallel()
	s := newSecretsSetup(t)
	root := fetchRoot(t, s.c, s.c.client(nil, nil))
	const uploads = 140 // with the manifest set: 141 entries, 2 full segments
	for i := range uploads {
		if err := uploadPlain(s.c, s.alice, "v"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	segs := segmentFiles(t, s.c.sealDir)
	if len(segs) < 2 {
		t.Fatalf("after %d uploads the seal directory has segments %v, want at least 2", uploads, segs)
	}
	quiet := updateLog(t, s.c, s.c.client(nil, nil))
	if len(quiet) <= uploads {
		t.Fatalf("the log has %d entries after %d uploads", len(quiet), uploads)
	}
	work := t.TempDir()
	idle := filepath.Join(work, "idle.qbk")
	if stderr := runToolOK(t, "backup", "--seal-dir", s.c.sealDir, "--out", idle); !strings.Contains(stderr, fmt.Sprintf("; %d update log segment(s);", len(segs))) {
		t.Fatalf("backup:\n%s", stderr)
	}

	// A backup while uploads run.
	stop := make(chan struct{})
	loopErr := make(chan error, 1)
	var acked atomic.Int64
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				loopErr <- nil
				return
			default:
			}
			if err := uploadPlain(s.c, s.alice, "w"+strconv.Itoa(i)); err != nil {
				loopErr <- err
				return
			}
			acked.Add(1)
		}
	}()
	for acked.Load() < 5 {
		time.Sleep(5 * time.Millisecond)
	}
	before := len(quiet) + int(acked.Load())
	busy := filepath.Join(work, "busy.qbk")
	runToolOK(t, "backup", "--seal-dir", s.c.sealDir, "--out", busy)
	// Enough further uploads that a new segment is written after the
	// backup.
	for start := acked.Load(); acked.Load() < start+70; {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	if err := <-loopErr; err != nil {
		t.Fatal(err)
	}
	final := updateLog(t, s.c, s.c.client(nil, nil))
	s.c.kill()

	rootFile := filepath.Join(work, "root.pem")
	if err := os.WriteFile(rootFile, pemCert(root), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct {
		name string
		file string
		want func(got []string) bool
	}{
		{"idle", idle, func(got []string) bool { return slices.Equal(got, quiet) }},
		{"busy", busy, func(got []string) bool {
			return len(got) >= before && len(got) <= len(final) && slices.Equal(got, final[:len(got)])
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			dir := filepath.Join(work, "restored-"+b.name)
			stderr := runToolOK(t, "restore", "--seal-dir", dir, "--in", b.file)
			if strings.Contains(stderr, "(0 update log segment(s) written)") {
				t.Fatalf("restore wrote no segments:\n%s", stderr)
			}
			c := startCoordinator(t, dir)
			defer c.kill()
			expectState(t, c, c.client(nil, nil), 3, msgRunning)
			got := updateLog(t, c, c.client(nil, nil))
			if !b.want(got) {
				t.Fatalf("restored log has %d entries; %d before the backups, %d at the busy backup's start, %d in all",
					len(got), len(quiet), before, len(final))
			}
			code, out, errOut := logCLI(t, c, rootFile, "--verify", "--output", "json")
			if code != 0 {
				t.Fatalf("--verify on the restored Coordinator: exit %d %s %s", code, out, errOut)
			}
			var sum logSummary
			if err := json.Unmarshal([]byte(out), &sum); err != nil || !sum.Verified || sum.Entries < uint64(len(got)) {
				t.Fatalf("summary %+v, %v (%d entries restored)", sum, err, len(got))
			}
			// It keeps working: one more upload lands in the restored log.
			alice := s.f.users["alice"].cert
			if err := uploadPlain(c, c.client(root, &alice), "after"); err != nil {
				t.Fatal(err)
			}
			if n := len(updateLog(t, c, c.client(nil, nil))); n != len(got)+1 {
				t.Fatalf("after one more upload the log has %d entries, want %d", n, len(got)+1)
			}
		})
	}
}
