package backup

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

// readMarker returns the restore marker in dir, if there is one.
func readMarker(t testing.TB, dir string) (updatelog.RestoreMarker, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, updatelog.RestoreMarkerFile))
	if os.IsNotExist(err) {
		return updatelog.RestoreMarker{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	m, err := updatelog.DecodeRestoreMarker(b)
	if err != nil {
		t.Fatalf("the marker does not decode: %v\n%s", err, b)
	}
	return m, true
}

// checkpointOf signs a head of count entries (the hash made from the
// count) with a new P-384 key.
func checkpointOf(t testing.TB, count uint64) logchain.Checkpoint {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var h logchain.Hash
	h[0], h[31] = byte(count), 0xaa
	cp, err := logchain.Sign(rand.Reader, k, logchain.Head{Count: count, Hash: h}, time.Date(2026, 3, 4, 5, 6, 7, 890_000_000, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// newStateWithCheckpoint is newState whose public header carries cp, as
// a Coordinator's commit writes it.
func newStateWithCheckpoint(t testing.TB, plain string, cp *logchain.Checkpoint) state {
	t.Helper()
	dek, err := seal.NewDataKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := json.Marshal(struct {
		Format int `json:"format"`
		updatelog.HeaderCheckpoint
	}{1, updatelog.HeaderCheckpoint{UpdateLog: cp}})
	if err != nil {
		t.Fatal(err)
	}
	blob, err := seal.Seal(nil, dek, hdr, []byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	b := seal.Binding(blob)
	sealed, err := seal.SimulationKeySealer{}.SealKey(dek, b[:], "")
	if err != nil {
		t.Fatal(err)
	}
	return state{plain: []byte(plain), dek: dek, blob: blob, entry: seal.KeyEntry{Binding: b, Sealed: sealed}}
}

// A restore that replaces the state leaves a marker for the next start:
// the restored sealed_data's SHA-256, the backup's time, and the
// checkpoint of the state it replaced as that state's header carries it
// (none for an empty directory, unknown for a header without one). A
// restore that changes nothing leaves none.
func TestRestoreLeavesMarker(t *testing.T) {
	ctx := context.Background()
	replacedCP, backupCP := checkpointOf(t, 90), checkpointOf(t, 40)
	b := newStateWithCheckpoint(t, "backup", &backupCP)
	for _, tc := range []struct {
		name     string
		cur      *state
		want     string
		replaced *logchain.Checkpoint
	}{
		{"empty directory", nil, logchain.ReplacedNone, nil},
		{"a state with a checkpoint", ptr(newStateWithCheckpoint(t, "current", &replacedCP)), logchain.ReplacedCheckpoint, &replacedCP},
		{"a state without one", ptr(newState(t, "older version")), logchain.ReplacedUnknown, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.cur != nil {
				writeFiles(t, dir, tc.cur.blob, keyFile(t, tc.cur.entry))
			}
			res, err := Restore(ctx, dir, b.archive(t), true, func() time.Time { return time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC) })
			if err != nil {
				t.Fatal(err)
			}
			m, ok := readMarker(t, dir)
			if !ok {
				t.Fatal("no marker")
			}
			if m.SealedData != sum(b.blob) || m.BackupCreated != "2026-01-02T03:04:05Z" || m.Restored != "2026-05-06T07:08:09Z" || m.ReplacedState != tc.want {
				t.Fatalf("marker %+v", m)
			}
			if (m.Replaced == nil) != (tc.replaced == nil) || (m.Replaced != nil && (m.Replaced.HeadOf() != tc.replaced.HeadOf() || !bytes.Equal(m.Replaced.Signature, tc.replaced.Signature))) {
				t.Fatalf("replaced %+v, want %+v", m.Replaced, tc.replaced)
			}
			if res.Marker == nil || res.Restored == nil || res.Restored.HeadOf() != backupCP.HeadOf() {
				t.Fatalf("result %+v", res)
			}
		})
	}

	t.Run("the same state again", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, b.blob, keyFile(t, b.entry))
		res, err := Restore(ctx, dir, b.archive(t), false, nil)
		if err != nil || !res.Unchanged || res.Marker != nil {
			t.Fatalf("%+v, %v", res, err)
		}
		if _, ok := readMarker(t, dir); ok {
			t.Fatal("a restore that changed nothing left a marker")
		}
	})

	// Two restores without a start between them: the second replaces a
	// state no Coordinator has served, so its marker keeps what the first
	// one replaced.
	t.Run("unrecorded restore restored over", func(t *testing.T) {
		dir := t.TempDir()
		cur := newStateWithCheckpoint(t, "current", &replacedCP)
		writeFiles(t, dir, cur.blob, keyFile(t, cur.entry))
		if _, err := Restore(ctx, dir, b.archive(t), true, nil); err != nil {
			t.Fatal(err)
		}
		laterCP := checkpointOf(t, 20)
		other := newStateWithCheckpoint(t, "other backup", &laterCP)
		if _, err := Restore(ctx, dir, other.archive(t), true, nil); err != nil {
			t.Fatal(err)
		}
		m, ok := readMarker(t, dir)
		if !ok || m.SealedData != sum(other.blob) || m.ReplacedState != logchain.ReplacedCheckpoint || m.Replaced.HeadOf() != replacedCP.HeadOf() {
			t.Fatalf("marker %+v", m)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// `coordinator restore` says what the restore does to the signed log:
// the entries after the backup's leave it, and the next start records the
// restore.
func TestMainRestoreNamesDiscardedEntries(t *testing.T) {
	replacedCP, backupCP := checkpointOf(t, 90), checkpointOf(t, 40)
	b := newStateWithCheckpoint(t, "backup", &backupCP)
	file := filepath.Join(t.TempDir(), "b.qbk")
	if err := os.WriteFile(file, encode(t, b.archive(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cur := newStateWithCheckpoint(t, "current", &replacedCP)
	writeFiles(t, dir, cur.blob, keyFile(t, cur.entry))
	var stderr bytes.Buffer
	getenv := func(string) string { return "" }
	if code := Main("restore", []string{"--seal-dir", dir, "--in", file, "--force"}, getenv, nil, &bytes.Buffer{}, &stderr); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	for _, want := range []string{
		"the update log goes back to the backup's 40 entries; the state replaced had 90 (head " + replacedCP.Head.String() + "): entries 41 to 90 leave the signed history",
		"records this restore in its update log when it next opens the state",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}
