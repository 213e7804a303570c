package backup

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/app"
	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/filestore"
)

// state is one sealed state: its plaintext, data key, blob and the key
// file entry that opens it.
type state struct {
	plain []byte
	dek   []byte
	blob  []byte
	entry seal.KeyEntry
}

func newState(t testing.TB, plain string) state {
	t.Helper()
	dek, err := seal.NewDataKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := seal.Seal(nil, dek, []byte(`{"format":1}`), []byte(plain))
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

func keyFile(t testing.TB, entries ...seal.KeyEntry) []byte {
	t.Helper()
	k, err := seal.EncodeKeyFile(entries)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (s state) archive(t testing.TB) *Archive {
	return &Archive{Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Data: s.blob, Key: keyFile(t, s.entry)}
}

func encode(t testing.TB, a *Archive) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := a.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func writeFiles(t testing.TB, dir string, data, key []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{DataFile: data, KeyFile: key} {
		if b == nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// opens returns the plaintext that the pair in dir opens to, as a
// Coordinator with the simulation sealer would open it, or an error.
func opens(dir string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(dir, DataFile))
	if err != nil {
		return nil, err
	}
	key, err := os.ReadFile(filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, err
	}
	entries, err := seal.DecodeKeyFile(key)
	if err != nil {
		return nil, err
	}
	e, ok := seal.Find(entries, data)
	if !ok {
		return nil, errors.New("no entry bound to sealed_data")
	}
	dek, err := seal.SimulationKeySealer{}.UnsealKey(e.Sealed, e.Binding[:])
	if err != nil {
		return nil, err
	}
	_, plain, err := seal.Open(dek, data)
	return plain, err
}

func TestNamesMatchTheCoordinator(t *testing.T) {
	if DataFile != app.SealedDataFile || KeyFile != app.SealedKeyFile {
		t.Fatalf("file names %s, %s; the Coordinator uses %s, %s", DataFile, KeyFile, app.SealedDataFile, app.SealedKeyFile)
	}
	for _, env := range []map[string]string{
		{},
		{"EDG_CWD": "/somewhere"},
		{"EDG_COORDINATOR_SEAL_DIR": "/data/seal", "EDG_CWD": "/x"},
	} {
		getenv := func(k string) string { return env[k] }
		cfg, err := config.Load(getenv, nil, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if got := DefaultSealDir(getenv); got != cfg.SealDir {
			t.Errorf("env %v: default seal dir %q, the Coordinator's %q", env, got, cfg.SealDir)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	s := newState(t, "state one")
	a := s.archive(t)
	raw := encode(t, a)
	got, err := Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Created.Equal(a.Created) || !bytes.Equal(got.Data, a.Data) || !bytes.Equal(got.Key, a.Key) {
		t.Fatalf("decoded %+v, want %+v", got, a)
	}
	// A standard tar reader sees the four files.
	tr := tar.NewReader(bytes.NewReader(raw))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, ",") != "quarry-backup.json,sealed_data,sealed_key,SHA256SUM" {
		t.Fatalf("tar entries %v", names)
	}
	// Nothing in clear beyond the sealed files: the plaintext does not
	// appear.
	if bytes.Contains(raw, s.plain) {
		t.Fatal("the backup holds the state's plaintext")
	}
}

// Every truncation of a backup is refused with ErrInvalid.
func TestDecodeRefusesTruncation(t *testing.T) {
	raw := encode(t, newState(t, "state").archive(t))
	for n := 0; n < len(raw); n++ {
		if _, err := Decode(bytes.NewReader(raw[:n])); !errors.Is(err, ErrInvalid) {
			t.Fatalf("truncated to %d of %d bytes: err %v", n, len(raw), err)
		}
	}
	_, err := Decode(bytes.NewReader(raw[:len(raw)/2]))
	if err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("truncated in the middle: %v, want a message saying truncated", err)
	}
}

// Every single-byte change is refused, or (padding the tar reader skips)
// decodes to exactly the same archive.
func TestDecodeRefusesCorruption(t *testing.T) {
	a := newState(t, "state").archive(t)
	raw := encode(t, a)
	refused := 0
	for i := range raw {
		c := append([]byte{}, raw...)
		c[i] ^= 0x5a
		got, err := Decode(bytes.NewReader(c))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("byte %d changed: error %v does not wrap ErrInvalid", i, err)
			}
			refused++
			continue
		}
		if !got.Created.Equal(a.Created) || !bytes.Equal(got.Data, a.Data) || !bytes.Equal(got.Key, a.Key) {
			t.Fatalf("byte %d changed: accepted with other content", i)
		}
	}
	if refused == 0 {
		t.Fatal("no corruption was refused")
	}
	t.Logf("%d of %d single-byte changes refused, the rest in padding", refused, len(raw))
}

// rawTar builds a tar of the given entries (name, content) as they are.
func rawTar(t *testing.T, entries ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e[0], Size: int64(len(e[1])), Mode: 0o600}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e[1]))
	}
	tw.Close()
	return buf.Bytes()
}

// forged builds a backup whose hashes and checksum are all right, from a
// descriptor template (%s: data size/hash, key size/hash) and the files.
func forged(t *testing.T, version int, format string, data, key []byte, extra ...[2]string) []byte {
	desc := fmt.Sprintf(`{"format":%q,"version":%d,"created":"2026-01-02T03:04:05Z","files":[{"name":"sealed_data","size":%d,"sha256":%q},{"name":"sealed_key","size":%d,"sha256":%q}]}`,
		format, version, len(data), sum(data), len(key), sum(key))
	entries := [][2][]byte{{[]byte(descriptorName), []byte(desc)}, {[]byte(DataFile), data}, {[]byte(KeyFile), key}}
	list := [][2]string{{descriptorName, desc}, {DataFile, string(data)}, {KeyFile, string(key)}, {checksumName, checksum(entries) + "\n"}}
	return rawTar(t, append(list, extra...)...)
}

func TestDecodeRefusesForeignContent(t *testing.T) {
	s, other := newState(t, "one"), newState(t, "two")
	good := forged(t, Version, Format, s.blob, keyFile(t, s.entry))
	if _, err := Decode(bytes.NewReader(good)); err != nil {
		t.Fatalf("the forging helper makes invalid backups: %v", err)
	}
	cases := []struct {
		name, want string
		raw        []byte
	}{
		{"empty file", "truncated", nil},
		{"not a tar", "not a tar archive", bytes.Repeat([]byte("garbage "), 200)},
		{"newer version", fmt.Sprintf("format version %d", Version+1), forged(t, Version+1, Format, s.blob, keyFile(t, s.entry))},
		{"other format", "format \"something\"", forged(t, Version, "something", s.blob, keyFile(t, s.entry))},
		{"key of another state", "no entry bound to sealed_data", forged(t, Version, Format, s.blob, keyFile(t, other.entry))},
		{"data not sealed", "sealed_data", forged(t, Version, Format, []byte("plain text, not sealed"), keyFile(t, s.entry))},
		{"key file corrupt", "sealed_key", forged(t, Version, Format, s.blob, []byte("QRYKEY\x00\x01\x09"))},
		{"entry after the checksum", "after the checksum", forged(t, Version, Format, s.blob, keyFile(t, s.entry), [2]string{"evil", "x"})},
		{"entries out of order", "where quarry-backup.json belongs", rawTar(t, [2]string{DataFile, string(s.blob)})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(bytes.NewReader(c.raw))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want ErrInvalid saying %q", err, c.want)
			}
		})
	}
}

func TestTakeWithoutCoordinator(t *testing.T) {
	old, cur := newState(t, "old"), newState(t, "current")
	dir := t.TempDir()
	// The key file of a commit: the current key and the previous one.
	writeFiles(t, dir, cur.blob, keyFile(t, cur.entry, old.entry))
	a, info, err := Take(context.Background(), dir, TakeOptions{Now: func() time.Time { return time.Unix(1700000000, 5) }})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Locked || info.Attempts != 1 {
		t.Errorf("info %+v, want locked after 1 attempt", info)
	}
	if !a.Created.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("created %v", a.Created)
	}
	// Only the entry of the backed-up data is kept.
	if !bytes.Equal(a.Key, keyFile(t, cur.entry)) || !bytes.Equal(a.Data, cur.blob) {
		t.Fatal("the archive is not the current pair with its one entry")
	}
	// The lock is released afterwards.
	unlock, err := filestore.LockDir(dir)
	if err != nil {
		t.Fatalf("Take left the directory locked: %v", err)
	}
	unlock()
}

func TestTakeLegacyKey(t *testing.T) {
	s := newState(t, "legacy")
	dir := t.TempDir()
	writeFiles(t, dir, s.blob, s.dek) // the 32-byte raw key
	a, _, err := Take(context.Background(), dir, TakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Key, s.dek) {
		t.Fatal("the legacy key file was not kept as it is")
	}
}

func TestTakeRefusals(t *testing.T) {
	s, other := newState(t, "s"), newState(t, "other")
	cases := []struct {
		name      string
		data, key []byte
		want      error
	}{
		{"no sealed_data", nil, keyFile(t, s.entry), ErrNoState},
		{"no sealed_key", s.blob, nil, ErrInconsistent},
		{"key of another state (recovery mode)", s.blob, keyFile(t, other.entry), ErrInconsistent},
		{"corrupt key file", s.blob, []byte("corrupt"), ErrInconsistent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, c.data, c.key)
			_, info, err := Take(context.Background(), dir, TakeOptions{})
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if info.Attempts != 1 {
				t.Errorf("%d attempts while holding the lock, want 1", info.Attempts)
			}
		})
	}
	if _, _, err := Take(context.Background(), filepath.Join(t.TempDir(), "missing"), TakeOptions{}); !errors.Is(err, ErrNoState) {
		t.Fatalf("missing directory: %v", err)
	}
	corrupt := t.TempDir()
	writeFiles(t, corrupt, []byte("not sealed"), keyFile(t, s.entry))
	if _, _, err := Take(context.Background(), corrupt, TakeOptions{}); err == nil || !strings.Contains(err.Error(), "not a sealed state") {
		t.Fatalf("corrupt sealed_data: %v", err)
	}
}

// While a Coordinator holds the lock, Take reads without it and retries
// until the key file read after the data is bound to it.
func TestTakeRetriesWhileLocked(t *testing.T) {
	s1, s2, s3 := newState(t, "1"), newState(t, "2"), newState(t, "3")
	dir := t.TempDir()
	writeFiles(t, dir, s1.blob, keyFile(t, s1.entry))
	unlock, err := filestore.LockDir(dir) // the "Coordinator"
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()

	// Each attempt reads data then key; the first three see a key file
	// two commits ahead of the data (no entry for it).
	reads := 0
	read := func(p string) ([]byte, error) {
		reads++
		attempt := (reads + 1) / 2
		if strings.HasSuffix(p, DataFile) {
			return s1.blob, nil
		}
		if attempt <= 3 {
			return keyFile(t, s3.entry, s2.entry), nil
		}
		return keyFile(t, s2.entry, s1.entry), nil
	}
	noPause := func(int) time.Duration { return 0 }
	a, info, err := Take(context.Background(), dir, TakeOptions{Pause: noPause, readFile: read})
	if err != nil {
		t.Fatal(err)
	}
	if info.Locked || info.Attempts != 4 {
		t.Fatalf("info %+v, want unlocked after 4 attempts", info)
	}
	if !bytes.Equal(a.Data, s1.blob) || !bytes.Equal(a.Key, keyFile(t, s1.entry)) {
		t.Fatal("not the consistent pair")
	}

	always := func(p string) ([]byte, error) {
		if strings.HasSuffix(p, DataFile) {
			return s1.blob, nil
		}
		return keyFile(t, s3.entry, s2.entry), nil
	}
	_, info, err = Take(context.Background(), dir, TakeOptions{Attempts: 7, Pause: noPause, readFile: always})
	if !errors.Is(err, ErrInconsistent) || info.Attempts != 7 || !strings.Contains(err.Error(), "after 7 attempts") {
		t.Fatalf("err %v after %d attempts, want ErrInconsistent after 7", err, info.Attempts)
	}
}

func TestRestoreIntoEmptyDirectory(t *testing.T) {
	s := newState(t, "restored")
	dir := filepath.Join(t.TempDir(), "new")
	res, err := Restore(context.Background(), dir, s.archive(t), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Unchanged || len(res.Aside) != 0 {
		t.Errorf("result %+v", res)
	}
	plain, err := opens(dir)
	if err != nil || !bytes.Equal(plain, s.plain) {
		t.Fatalf("restored directory opens to %q, %v", plain, err)
	}
	// Again: nothing to do.
	res, err = Restore(context.Background(), dir, s.archive(t), false, nil)
	if err != nil || !res.Unchanged {
		t.Fatalf("second restore: %+v, %v", res, err)
	}
}

// snapshot returns the directory's files and contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == ".lock" { // created by the lock
			continue
		}
		if e.IsDir() {
			for k, v := range snapshot(t, filepath.Join(dir, e.Name())) {
				out[e.Name()+"/"+k] = v
			}
			continue
		}
		out[e.Name()] = string(readFile(t, filepath.Join(dir, e.Name())))
	}
	return out
}

func TestRestoreRefusesRunningCoordinator(t *testing.T) {
	cur, s := newState(t, "current"), newState(t, "backup")
	dir := t.TempDir()
	writeFiles(t, dir, cur.blob, keyFile(t, cur.entry))
	unlock, err := filestore.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	before := snapshot(t, dir)
	_, err = Restore(context.Background(), dir, s.archive(t), true, nil)
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("err %v, want ErrInUse", err)
	}
	if after := snapshot(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("the directory changed")
	}
}

func TestRestoreOverAnotherState(t *testing.T) {
	cur, s := newState(t, "current"), newState(t, "backup")
	dir := t.TempDir()
	curKey := keyFile(t, cur.entry)
	writeFiles(t, dir, cur.blob, curKey)
	before := snapshot(t, dir)

	_, err := Restore(context.Background(), dir, s.archive(t), false, nil)
	var exists *ExistingStateError
	if !errors.As(err, &exists) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("err %v, want an ExistingStateError naming --force", err)
	}
	if after := snapshot(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("a refused restore changed the directory")
	}

	now := func() time.Time { return time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC) }
	res, err := Restore(context.Background(), dir, s.archive(t), true, now)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := opens(dir)
	if err != nil || !bytes.Equal(plain, s.plain) {
		t.Fatalf("restored directory opens to %q, %v", plain, err)
	}
	// The replaced files are kept, byte for byte.
	keptData := filepath.Join(dir, DataFile+".before-restore-20260506T070809Z")
	keptKey := filepath.Join(dir, KeyFile+".before-restore-20260506T070809Z")
	if len(res.Aside) != 2 || !bytes.Equal(readFile(t, keptData), cur.blob) || !bytes.Equal(readFile(t, keptKey), curKey) {
		t.Fatalf("aside %v", res.Aside)
	}
	// Refused restores of a forced-over state report it too: the old
	// state is "another state" now.
	old := &Archive{Created: time.Now(), Data: cur.blob, Key: curKey}
	if _, err := Restore(context.Background(), dir, old, false, nil); !errors.As(err, &exists) {
		t.Fatalf("restoring the old state back without --force: %v", err)
	}
}

// A sealed_key without sealed_data opens nothing: restore needs no --force
// but keeps it aside.
func TestRestoreOverOrphanKey(t *testing.T) {
	orphan, s := newState(t, "orphan"), newState(t, "backup")
	dir := t.TempDir()
	writeFiles(t, dir, nil, keyFile(t, orphan.entry))
	res, err := Restore(context.Background(), dir, s.archive(t), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Aside) != 1 || !strings.Contains(res.Aside[0], KeyFile+".before-restore-") {
		t.Fatalf("aside %v", res.Aside)
	}
	if plain, err := opens(dir); err != nil || !bytes.Equal(plain, s.plain) {
		t.Fatalf("opens to %q, %v", plain, err)
	}
}

// A restore stopped before any of its writes (a crash) leaves a directory
// that opens to the old state or the restored one, never neither; the
// restored state is never in place without the marker that names it.
func TestRestoreCrashSafe(t *testing.T) {
	cur, s := newState(t, "current"), newState(t, "backup")
	// The marker, the key file with both keys, the data, the key file.
	const steps = 4
	for step := 0; step <= steps; step++ {
		t.Run(fmt.Sprint("crash before step ", step), func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, cur.blob, keyFile(t, cur.entry))
			_, err := restore(context.Background(), dir, s.archive(t), true, nil, func(i int) bool { return i == step })
			if step < steps && !errors.Is(err, errCrashed) {
				t.Fatalf("err %v, the restore has %d steps", err, steps)
			}
			plain, err := opens(dir)
			if err != nil {
				t.Fatalf("does not open after a crash before step %d: %v", step, err)
			}
			want := s.plain
			if step < 3 {
				want = cur.plain
			}
			if !bytes.Equal(plain, want) {
				t.Fatalf("opens to %q, want %q", plain, want)
			}
			m, ok := readMarker(t, dir)
			if ok != (step >= 1) {
				t.Fatalf("crash before step %d: marker present %v", step, ok)
			}
			if ok && m.SealedData != sum(s.blob) {
				t.Fatalf("the marker names sealed_data %s, not the backup's", m.SealedData)
			}
		})
	}
}

func TestRestoreRefusesInvalidArchive(t *testing.T) {
	s, other := newState(t, "s"), newState(t, "other")
	dir := t.TempDir()
	bad := &Archive{Data: s.blob, Key: keyFile(t, other.entry)}
	if _, err := Restore(context.Background(), dir, bad, true, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("err %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("the directory changed: %v", entries)
	}
}

func FuzzDecode(f *testing.F) {
	s := newState(f, "fuzz")
	good := encode(f, s.archive(f))
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	f.Add(encode(f, withSegments(f, s.archive(f), 0, 1)))
	// Sparse files that claim far more than they hold (sparse_test.go).
	for _, format := range []string{"1.0", "0.1", "0.0", "gnu"} {
		f.Add(sparseBackup(f, format, 1<<20))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var a *Archive
		var err error
		// The memory Decode takes grows with the file, never with the
		// sizes the file claims.
		if used := allocated(func() { a, err = Decode(bytes.NewReader(raw)) }); used > uint64(4*len(raw))+8<<20 {
			t.Fatalf("Decode of %d bytes allocated %d bytes", len(raw), used)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		// Whatever is accepted passes Check and encodes again to a
		// backup that decodes to the same.
		if err := a.Check(); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := a.Encode(&buf); err != nil {
			t.Fatal(err)
		}
		b, err := Decode(&buf)
		if err != nil || !bytes.Equal(a.Data, b.Data) || !bytes.Equal(a.Key, b.Key) || !a.Created.Equal(b.Created) ||
			fmt.Sprint(a.Segments) != fmt.Sprint(b.Segments) {
			t.Fatalf("re-encoded backup: %v", err)
		}
	})
}

// BenchmarkBackupRestore: Take, Encode, Decode and Restore of a 1 MiB state.
func BenchmarkBackupRestore(b *testing.B) {
	s := newState(b, strings.Repeat("x", 1<<20))
	src := b.TempDir()
	writeFiles(b, src, s.blob, keyFile(b, s.entry))
	b.SetBytes(int64(len(s.blob)))
	for i := 0; b.Loop(); i++ {
		a, _, err := Take(context.Background(), src, TakeOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var buf bytes.Buffer
		if err := a.Encode(&buf); err != nil {
			b.Fatal(err)
		}
		got, err := Decode(&buf)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Restore(context.Background(), filepath.Join(b.TempDir(), strconv.Itoa(i)), got, false, nil); err != nil {
			b.Fatal(err)
		}
	}
}
