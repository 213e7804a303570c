package integration

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/cli"
	lv "github.com/quarry-cc/quarry/test/logverifier"
)

// independentLog verifies c's whole log with the verifier written from
// docs/update-log.md alone (test/logverifier: standard library only), in
// pages of pageSize (-1: the server's default).
func independentLog(t *testing.T, c *coordinator, root *x509.Certificate, pageSize int) *lv.Log {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log, err := lv.Verify(ctx, lv.HTTPFetch(c.client(root, nil), "https://"+c.addr), root, pageSize)
	if err != nil {
		t.Fatalf("the independent verifier refuses the log (pages of %d): %v", pageSize, err)
	}
	return log
}

// usersOf returns the "users" of the "quarry: manifest changed" entries.
func usersOf(t *testing.T, log *lv.Log) [][]string {
	t.Helper()
	var out [][]string
	for _, e := range log.Select("quarry: manifest changed") {
		m, err := lv.Fields(e)
		if err != nil {
			t.Fatal(err)
		}
		list, ok := m["users"].([]any)
		if !ok {
			t.Fatalf("entry %d: users is %T", e.Seq, m["users"])
		}
		users := []string{}
		for _, u := range list {
			users = append(users, fmt.Sprint(u))
		}
		out = append(out, users)
	}
	return out
}

// saveCheckpoint runs quarry manifest log --verify --save-checkpoint and
// checks that the file is, byte for byte, the checkpoint the independent
// verifier accepted, in the documented file form.
func saveCheckpoint(t *testing.T, c *coordinator, rootFile string, want *lv.Log, file string) lv.Checkpoint {
	t.Helper()
	code, out, errOut := logCLI(t, c, rootFile, "--verify", "--save-checkpoint", file)
	if code != cli.ExitOK {
		t.Fatalf("--verify --save-checkpoint: exit %d %s %s", code, out, errOut)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := lv.ParseSaved(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, lv.EncodeSaved(want.Checkpoint)) {
		t.Fatalf("the CLI saved\n%s\nthe independent verifier accepted\n%s", raw, lv.EncodeSaved(want.Checkpoint))
	}
	if !strings.Contains(out, fmt.Sprintf("update log verified: %d entries\n", want.Checkpoint.Count)) {
		t.Fatalf("the CLI's summary:\n%s", out)
	}
	return cp
}

// A verifier written from docs/update-log.md alone, sharing no code with
// Quarry, accepts the real log of a Coordinator across segments, at every
// page size (also while uploads go on), through two full updates each started by one user and
// acknowledged by the other (whose "quarry: manifest changed" names both,
// the initiator first), a backup and a forced restore (recorded in the
// log with the count and head it discarded), a restart and a recovery; it
// agrees with `quarry manifest log --verify` on every saved checkpoint,
// byte for byte, and on which saved checkpoints the log extends. The API
// refuses out-of-bounds pages naming the bounds.
func TestUpdateLogIndependentVerifier(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupWith(t, func(f *fixture) {})
	alice, bob := s.f.users["alice"].cert, s.f.users["bob"].cert
	ha, hb := s.c.client(nil, &alice), s.c.client(nil, &bob)
	work := t.TempDir()
	rootFile := filepath.Join(work, "root.pem")
	if err := os.WriteFile(rootFile, pemCert(s.root), 0o644); err != nil {
		t.Fatal(err)
	}

	// A package update, uploads across two segments, and two full
	// updates, each by one user and acknowledged by the other.
	expect(t, do(t, ha, http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": packageUpdate(2)}), http.StatusOK, "success")
	for range 100 {
		uploadUserKey(t, s.c, ha)
	}
	first := s.f.set("Secrets.extra", map[string]any{"Type": "symmetric-key", "Size": 128, "Shared": true}).bytes(t)
	expect(t, do(t, ha, http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": first}), http.StatusOK, "success")
	expect(t, do(t, hb, http.MethodPost, s.c.url("/api/v2/update-manifest"), map[string][]byte{"manifest": first}), http.StatusOK, "success")
	second := s.f.set("Secrets.more", map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true}).bytes(t)
	expect(t, do(t, hb, http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": second}), http.StatusOK, "success")
	expect(t, do(t, ha, http.MethodPost, s.c.url("/api/v2/update-manifest"), map[string][]byte{"manifest": second}), http.StatusOK, "success")
	for range 40 {
		uploadUserKey(t, s.c, ha)
	}

	// Verified while uploads go on: pages carry later checkpoints.
	done := make(chan int)
	go func() {
		n := 0
		defer func() { done <- n }()
		for range 30 {
			r, err := tortureDo(ha, http.MethodPost, s.c.url("/api/v2/secrets"), map[string]any{"secrets": map[string]any{"userkey": map[string]any{"key": make([]byte, 32)}}})
			if err != nil || r.HTTPStatus != http.StatusOK {
				return
			}
			n++
		}
	}()
	for range 3 {
		independentLog(t, s.c, s.root, 7)
	}
	if n := <-done; n != 30 {
		t.Fatalf("%d of 30 concurrent uploads succeeded", n)
	}

	var logs []*lv.Log
	for _, size := range []int{1, 7, 64, 65, 1000, 10000, -1} {
		logs = append(logs, independentLog(t, s.c, s.root, size))
	}
	log := logs[0]
	for _, other := range logs[1:] {
		if other.Checkpoint.Count != log.Checkpoint.Count || other.Checkpoint.Head != log.Checkpoint.Head {
			t.Fatalf("page sizes disagree: %+v and %+v", log.Checkpoint, other.Checkpoint)
		}
	}
	if log.Checkpoint.Count < 150 {
		t.Fatalf("%d entries", log.Checkpoint.Count)
	}
	if got := usersOf(t, log); len(got) != 2 || !slices.Equal(got[0], []string{"alice", "bob"}) || !slices.Equal(got[1], []string{"bob", "alice"}) {
		t.Fatalf("quarry: manifest changed names %q, want [[alice bob] [bob alice]]", got)
	}
	beforeBackup := saveCheckpoint(t, s.c, rootFile, log, filepath.Join(work, "before-backup.json"))

	// A backup, then more changes that the restore will discard.
	backup := filepath.Join(work, "b.qbk")
	runToolOK(t, "backup", "--seal-dir", s.c.sealDir, "--out", backup)
	backedUp := independentLog(t, s.c, s.root, -1).Checkpoint.Count
	for range 80 {
		uploadUserKey(t, s.c, ha)
	}
	log = independentLog(t, s.c, s.root, 50)
	discarded := saveCheckpoint(t, s.c, rootFile, log, filepath.Join(work, "discarded.json"))
	if v, err := lv.Check(s.root, beforeBackup, log); err != nil || !v.Extends {
		t.Fatalf("the log before the restore does not extend the checkpoint before the backup: %+v %v", v, err)
	}

	if err := s.c.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	stderr := runToolOK(t, "restore", "--seal-dir", s.c.sealDir, "--in", backup, "--force")
	if want := fmt.Sprintf("entries %d to %d leave the signed history", backedUp+1, discarded.Count); !strings.Contains(stderr, want) {
		t.Fatalf("restore does not say %q:\n%s", want, stderr)
	}
	s.c.start()
	log = independentLog(t, s.c, s.root, 33)
	rs, err := log.Restores()
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("%d restore records", len(rs))
	}
	r := rs[0]
	at, _ := log.HashAt(backedUp)
	if r.Seq != backedUp+1 || r.RestoredCount != backedUp || r.RestoredHead != at.String() || r.ReplacedState != "checkpoint" ||
		r.Replaced == nil || r.Replaced.Count != discarded.Count || r.Replaced.Head != discarded.Head || lv.VerifyCheckpoint(s.root, *r.Replaced) != nil {
		t.Fatalf("restore record %+v (restored %d, discarded checkpoint %d %s)", r, backedUp, discarded.Count, discarded.Head)
	}
	// The independent verifier and the CLI agree: the restore discarded
	// the later checkpoint, the earlier one is extended.
	if v, err := lv.Check(s.root, discarded, log); err != nil || v.Extends || !v.Exact || v.Restore.Seq != r.Seq {
		t.Fatalf("the discarded checkpoint: %+v %v", v, err)
	}
	if v, err := lv.Check(s.root, beforeBackup, log); err != nil || !v.Extends {
		t.Fatalf("the checkpoint before the backup: %+v %v", v, err)
	}
	code, out, errOut := logCLI(t, s.c, rootFile, "--verify", "--since-checkpoint", filepath.Join(work, "discarded.json"))
	want := fmt.Sprintf("the log was restored from a backup at entry %d, discarding entries %d..%d of your checkpoint", backedUp, backedUp+1, discarded.Count)
	if code != cli.ExitVerification || !strings.Contains(errOut, want) || !strings.Contains(errOut, "does NOT extend the saved checkpoint") {
		t.Fatalf("--since-checkpoint with the discarded checkpoint: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
	}
	code, out, errOut = logCLI(t, s.c, rootFile, "--verify", "--since-checkpoint", filepath.Join(work, "before-backup.json"))
	if code != cli.ExitOK || !strings.Contains(out, fmt.Sprintf("it extends the saved checkpoint (%d entries)", beforeBackup.Count)) ||
		!strings.Contains(out, fmt.Sprintf("at entry %d, recorded at entry %d: the log it replaced had %d entries", backedUp, backedUp+1, discarded.Count)) {
		t.Fatalf("--since-checkpoint with the checkpoint before the backup: exit %d %q %q", code, out, errOut)
	}
	afterRestore := saveCheckpoint(t, s.c, rootFile, log, filepath.Join(work, "after-restore.json"))

	// A restart records nothing more; a recovery extends the log.
	s.c.restart()
	if again := independentLog(t, s.c, s.root, -1); again.Checkpoint.Count != log.Checkpoint.Count {
		t.Fatalf("a restart changed the log: %d entries, before %d", again.Checkpoint.Count, log.Checkpoint.Count)
	}
	s.breakKey(t)
	expect(t, postRecover(t, s.c, s.secrets["key1"], sign(t, s.keys["key1"], s.secrets["key1"])), http.StatusOK, "success")
	log = independentLog(t, s.c, s.root, 64)
	if v, err := lv.Check(s.root, afterRestore, log); err != nil || !v.Extends {
		t.Fatalf("after the recovery: %+v %v", v, err)
	}
	if n := len(log.Select("quarry: state recovered")); n != 1 {
		t.Fatalf("%d recovery entries", n)
	}
	saveCheckpoint(t, s.c, rootFile, log, filepath.Join(work, "after-recovery.json"))

	// Tampered copies of the real log are refused offline.
	es := log.Entries
	tampered := map[string][]lv.Entry{
		"an entry changed": slices.Concat(es[:10], []lv.Entry{{Seq: 11, Entry: strings.Replace(es[10].Entry, "alice", "mallory", 1), Hash: es[10].Hash}}, es[11:]),
		"an entry removed": slices.Concat(es[:10], es[11:]),
		"two swapped":      slices.Concat(es[:10], []lv.Entry{es[11], es[10]}, es[12:]),
		"the restore record removed, the rest renumbered": func() []lv.Entry {
			var out []lv.Entry
			for _, e := range es {
				if e.Seq != r.Seq {
					out = append(out, e)
				}
			}
			return out
		}(),
	}
	for name, t2 := range tampered {
		if err := lv.VerifyEntries(s.root, log.Checkpoint, t2); err == nil {
			t.Errorf("%s: the independent verifier accepts it", name)
		}
	}
	if err := lv.VerifyEntries(s.root, log.Checkpoint, es); err != nil {
		t.Fatalf("the real log offline: %v", err)
	}

	// Pages out of bounds: 400 fail naming the bounds, never quietly
	// changed; the default page is 1000 entries.
	fetch := lv.HTTPFetch(s.c.client(s.root, nil), "https://"+s.c.addr)
	for _, limit := range []int{0, 10001} {
		p, status, msg, err := fetch(t.Context(), 0, limit)
		if err != nil || p != nil || status != http.StatusBadRequest || !strings.Contains(msg, "it must be 1 to 10000") {
			t.Fatalf("limit=%d: page %v, HTTP %d %q, %v", limit, p != nil, status, msg, err)
		}
	}
	if p, status, msg, err := fetch(t.Context(), log.Checkpoint.Count+1, 5); err != nil || p != nil || status != http.StatusBadRequest || !strings.Contains(msg, "beyond the log's") {
		t.Fatalf("after beyond the end: HTTP %d %q, %v", status, msg, err)
	}
	p, _, _, err := fetch(t.Context(), 0, -1)
	if err != nil || p == nil || uint64(len(p.Entries)) != min(1000, p.Checkpoint.Count) {
		t.Fatalf("default page: %v", err)
	}

	// Outside state 3: 409 fail naming what was asked.
	fresh := startCoordinator(t, "")
	p, status, msg, err := lv.HTTPFetch(fresh.client(nil, nil), "https://"+fresh.addr)(t.Context(), 0, -1)
	if err != nil || p != nil || status != http.StatusConflict || !strings.Contains(msg, "cannot read the verifiable update log in state 2") {
		t.Fatalf("state 2: HTTP %d %q, %v", status, msg, err)
	}
}
