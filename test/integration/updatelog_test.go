package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/cli"
)

// logCLI runs quarry manifest log with args against c, the root pinned
// from rootFile; it returns the exit code, stdout and stderr.
func logCLI(t *testing.T, c *coordinator, rootFile string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := map[string]string{cli.EnvCoordinator: c.addr}
	code := cli.Run(t.Context(), cli.Params{
		Args:   append([]string{"manifest", "log", "--root", rootFile}, args...),
		Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] },
	})
	return code, stdout.String(), stderr.String()
}

type logSummary struct {
	Verified     bool                `json:"verified"`
	Entries      uint64              `json:"entries"`
	Since        *uint64             `json:"since"`
	FirstTime    string              `json:"firstTime"`
	LastTime     string              `json:"lastTime"`
	Fingerprints []string            `json:"fingerprints"`
	Checkpoint   logchain.Checkpoint `json:"checkpoint"`
}

func uploadUserKey(t *testing.T, c *coordinator, hc *http.Client) {
	t.Helper()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	expect(t, do(t, hc, http.MethodPost, c.url("/api/v2/secrets"), map[string]any{"secrets": map[string]any{"userkey": map[string]any{"key": key}}}), http.StatusOK, "success")
}

func fp(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// The CLI's --verify passes on a real Coordinator after a scripted
// history (set, package update, secret uploads, full multi-party update,
// recovery), proves an append-only extension of a saved checkpoint, and
// names a checkpoint of another root; the existing endpoints do not show
// Quarry's own entries.
func TestUpdateLogVerifyScriptedHistory(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupWith(t, func(f *fixture) {})
	alice, bob := s.f.users["alice"].cert, s.f.users["bob"].cert
	ha, hb := s.c.client(nil, &alice), s.c.client(nil, &bob)
	expect(t, do(t, ha, http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": packageUpdate(2)}), http.StatusOK, "success")
	uploadUserKey(t, s.c, ha)
	uploadUserKey(t, s.c, ha)
	next := s.f.set("Secrets.extra", map[string]any{"Type": "symmetric-key", "Size": 128, "Shared": true}).bytes(t)
	expect(t, do(t, ha, http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": next}), http.StatusOK, "success")
	expect(t, do(t, hb, http.MethodPost, s.c.url("/api/v2/update-manifest"), map[string][]byte{"manifest": next}), http.StatusOK, "success")
	s.breakKey(t)
	expect(t, postRecover(t, s.c, s.secrets["key1"], sign(t, s.keys["key1"], s.secrets["key1"])), http.StatusOK, "success")

	rootFile := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(rootFile, pemCert(s.root), 0o644); err != nil {
		t.Fatal(err)
	}
	cpFile := filepath.Join(t.TempDir(), "checkpoint.json")
	code, out, errOut := logCLI(t, s.c, rootFile, "--verify", "--output", "json", "--save-checkpoint", cpFile)
	if code != cli.ExitOK {
		t.Fatalf("--verify: exit %d %s %s", code, out, errOut)
	}
	var sum logSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("--output json: %v: %s", err, out)
	}
	// set, package update, 2 uploads, initiated, acknowledged, updated,
	// manifest changed (own), recovered (own).
	if !sum.Verified || sum.Entries != 9 || sum.Checkpoint.Count != 9 || sum.FirstTime == "" || sum.LastTime < sum.FirstTime {
		t.Fatalf("summary %+v", sum)
	}
	if !slices.Contains(sum.Fingerprints, fp(s.raw)) || !slices.Contains(sum.Fingerprints, fp(next)) {
		t.Fatalf("fingerprints %v, want the old %s and the new %s", sum.Fingerprints, fp(s.raw), fp(next))
	}
	// The existing endpoint: MarbleRun's seven entries, none of Quarry's own.
	r := do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/update"), nil)
	expect(t, r, http.StatusOK, "success")
	var legacy struct {
		UpdateLog []string `json:"updateLog"`
	}
	decode(t, r, &legacy)
	if len(legacy.UpdateLog) != 7 || strings.Contains(strings.Join(legacy.UpdateLog, "\n"), "quarry: ") {
		t.Fatalf("GET /api/v2/update shows %q", legacy.UpdateLog)
	}

	// Bad paging parameters: 400 fail, nothing else.
	for _, q := range []string{"after=x", "after=-1", "limit=1e3", "after=99999"} {
		r := do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/update-log?"+q), nil)
		expect(t, r, http.StatusBadRequest, "fail")
	}
	// CLI usage errors.
	if code, _, errOut := logCLI(t, s.c, rootFile, "--since-checkpoint", cpFile); code == cli.ExitOK || !strings.Contains(errOut, "need --verify") {
		t.Fatalf("--since-checkpoint without --verify: exit %d %q", code, errOut)
	}
	junk := filepath.Join(t.TempDir(), "junk.json")
	if err := os.WriteFile(junk, []byte(`{"count":1,"extra":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := logCLI(t, s.c, rootFile, "--verify", "--since-checkpoint", junk); code == cli.ExitOK || !strings.Contains(errOut, "not a saved checkpoint") {
		t.Fatalf("--since-checkpoint with junk: exit %d %q", code, errOut)
	}

	// More changes, then the saved checkpoint is extended.
	uploadUserKey(t, s.c, ha)
	code, out, errOut = logCLI(t, s.c, rootFile, "--verify", "--since-checkpoint", cpFile)
	if code != cli.ExitOK || !strings.Contains(out, "extends the saved checkpoint (9 entries) by 1 entry, to 10 entries") {
		t.Fatalf("--since-checkpoint: exit %d %q %q", code, out, errOut)
	}
	// A saved checkpoint changed after signing, and one signed by another
	// root: named, exit non-zero.
	raw, err := os.ReadFile(cpFile)
	if err != nil {
		t.Fatal(err)
	}
	var saved logchain.Checkpoint
	if err := json.Unmarshal(raw, &saved); err != nil {
		t.Fatal(err)
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := logchain.Sign(rand.Reader, other, saved.HeadOf(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	changed := saved
	changed.Count--
	for name, cp := range map[string]logchain.Checkpoint{"another root": forged, "changed": changed} {
		b, _ := json.Marshal(cp)
		if err := os.WriteFile(cpFile, b, 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errOut = logCLI(t, s.c, rootFile, "--verify", "--since-checkpoint", cpFile)
		if code == cli.ExitOK || !strings.Contains(errOut, logchain.ErrCheckpointSignature.Error()) {
			t.Fatalf("saved checkpoint (%s): exit %d %q %q", name, code, out, errOut)
		}
	}
}

// SIGKILL during appends never leaves a log that fails verification; only
// the unacknowledged change may be lost. The rounds cross segment
// boundaries (64 entries).
func TestUpdateLogSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupWith(t, func(f *fixture) {})
	alice := s.f.users["alice"].cert
	stored := uint64(1) // the manifest set
	for round := range 4 {
		acked := make(chan uint64, 1)
		stop := make(chan struct{})
		go func() {
			n := uint64(0)
			defer func() { acked <- n }()
			hc := s.c.client(nil, &alice)
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := tortureDo(hc, http.MethodPost, s.c.url("/api/v2/secrets"), map[string]any{"secrets": map[string]any{"userkey": map[string]any{"key": make([]byte, 32)}}})
				if err != nil || r.HTTPStatus != http.StatusOK {
					return
				}
				n++
			}
		}()
		time.Sleep(time.Duration(400+150*round) * time.Millisecond)
		s.c.kill()
		close(stop)
		n := <-acked
		s.c.start()
		got := verifiedCount(t, s.c.addr, s.root, alice)
		t.Logf("round %d: %d uploads acknowledged before SIGKILL; the log verifies with %d entries", round, n, got)
		if n == 0 || got < stored+n || got > stored+n+1 {
			t.Fatalf("round %d: %d entries verified, want %d acknowledged (+1 unacknowledged at most)", round, got, stored+n)
		}
		stored = got
	}
	rootFile := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(rootFile, pemCert(s.root), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := logCLI(t, s.c, rootFile, "--verify"); code != cli.ExitOK {
		t.Fatalf("--verify after SIGKILLs: exit %d %q %q", code, out, errOut)
	}
}

// verifiedCount verifies the whole log with the SDK against root and
// returns its length.
func verifiedCount(t *testing.T, addr string, root *x509.Certificate, cert tls.Certificate) uint64 {
	t.Helper()
	c, err := client.New(addr, client.WithRootCertificate(root), client.WithClientCertificate(cert))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	v, err := c.VerifyUpdateLog(ctx, nil)
	if err != nil {
		t.Fatalf("verifying the log: %v", err)
	}
	return v.Checkpoint.Count
}

// A segment file of the update log taken from another copy of the same
// state (here: a copy of the seal directory that went on on its own, as a
// restored backup would) is sealed with the same key and intact, but does
// not chain with the segments and the state beside it: the Coordinator
// refuses to serve the log (500, the broken link named in its log) instead
// of showing the other copy's entries, and --verify fails.
func TestUpdateLogSplicedSegmentRefused(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupWith(t, func(f *fixture) {})
	alice := s.f.users["alice"].cert
	uploads := func(c *coordinator, n int) {
		t.Helper()
		hc := c.client(nil, &alice)
		for range n {
			uploadUserKey(t, c, hc)
		}
	}
	// Segment 0 (entries 1-64) is written once the state holds 65 entries.
	uploads(s.c, 70)
	if err := s.c.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	forkDir := t.TempDir()
	if err := os.CopyFS(forkDir, os.DirFS(s.c.sealDir)); err != nil {
		t.Fatal(err)
	}
	// Both copies go on and write their own segment 1 (entries 65-128).
	s.c.start()
	uploads(s.c, 70)
	if err := s.c.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	fork := startCoordinator(t, forkDir)
	uploads(fork, 70)
	hc := fork.client(nil, nil)
	expect(t, do(t, hc, http.MethodGet, fork.url("/api/v2/update"), nil), http.StatusOK, "success")
	if err := fork.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	seg := func(dir string) string { return filepath.Join(dir, "updatelog", "1") }
	theirs, err := os.ReadFile(seg(s.c.sealDir))
	if err != nil {
		t.Fatal(err)
	}
	mine, err := os.ReadFile(seg(forkDir))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(theirs, mine) {
		t.Fatal("the copies wrote the same segment 1")
	}
	if err := os.WriteFile(seg(forkDir), theirs, 0o600); err != nil {
		t.Fatal(err)
	}

	fork.start()
	hc = fork.client(nil, nil)
	r := do(t, hc, http.MethodGet, fork.url("/api/v2/update"), nil)
	expect(t, r, http.StatusInternalServerError, "error")
	r = do(t, hc, http.MethodGet, fork.url("/api/v2/update-log?after=100&limit=5"), nil)
	expect(t, r, http.StatusInternalServerError, "error")
	logs := fork.Logs()
	if !strings.Contains(logs, "update log segments do not chain") || !strings.Contains(logs, "segment 1") {
		t.Fatalf("the Coordinator's log does not name the broken link:\n%s", logs)
	}
	// The entries the foreign segment does not touch are still served.
	expect(t, do(t, hc, http.MethodGet, fork.url("/api/v2/update-log?after=10&limit=5"), nil), http.StatusOK, "success")

	rootFile := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(rootFile, pemCert(s.root), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := logCLI(t, fork, rootFile, "--verify"); code == cli.ExitOK || !strings.Contains(errOut, "does NOT verify") {
		t.Fatalf("--verify with a foreign segment: exit %d %q %q", code, out, errOut)
	}
}
