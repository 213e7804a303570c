package backup

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/app"
	"github.com/quarry-cc/quarry/internal/seal"
)

// segmentBlob seals a segment file as internal/core does: header
// {"updatelogSegment":n}, plaintext under a 32-byte key. The integration
// test checks the real Coordinator's segments are taken.
func segmentBlob(t testing.TB, n uint64, plain string) []byte {
	t.Helper()
	hdr, _ := json.Marshal(map[string]uint64{"updatelogSegment": n})
	b, err := seal.Seal(nil, bytes.Repeat([]byte{7}, 32), hdr, []byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withSegments adds segments with the given indices to a.
func withSegments(t testing.TB, a *Archive, idx ...uint64) *Archive {
	for _, n := range idx {
		a.Segments = append(a.Segments, Segment{Index: n, Blob: segmentBlob(t, n, fmt.Sprintf("segment %d of %q", n, a.Data[len(a.Data)-8:]))})
	}
	return a
}

func writeSegmentFile(t testing.TB, dir, name string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, LogDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, LogDir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLogDirMatchesTheCoordinator(t *testing.T) {
	if LogDir != app.UpdateLogDir {
		t.Fatalf("LogDir %q, the Coordinator's %q", LogDir, app.UpdateLogDir)
	}
}

func TestRoundTripWithSegments(t *testing.T) {
	a := withSegments(t, newState(t, "state").archive(t), 0, 1, 2, 10)
	raw := encode(t, a)
	got, err := Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Segments) != fmt.Sprint(a.Segments) || !bytes.Equal(got.Data, a.Data) {
		t.Fatalf("decoded %d segments, want %d", len(got.Segments), len(a.Segments))
	}
	names := listTar(t, raw)
	if strings.Join(names, ",") != "quarry-backup.json,sealed_data,sealed_key,updatelog/0,updatelog/1,updatelog/2,updatelog/10,SHA256SUM" {
		t.Fatalf("tar entries %v", names)
	}
	// The descriptor says version 2 and lists the segments.
	var d descriptor
	if err := json.Unmarshal(firstEntry(t, raw), &d); err != nil || d.Version != 2 || len(d.Files) != 6 || d.Files[5].Name != "updatelog/10" {
		t.Fatalf("descriptor %+v, %v", d, err)
	}
}

// Every truncation of a backup with segments is refused, and so is every
// single-byte change inside a segment entry's content.
func TestDecodeRefusesDamagedSegmentEntry(t *testing.T) {
	a := withSegments(t, newState(t, "state").archive(t), 0, 1)
	raw := encode(t, a)
	for n := 0; n < len(raw); n++ {
		if _, err := Decode(bytes.NewReader(raw[:n])); !errors.Is(err, ErrInvalid) {
			t.Fatalf("truncated to %d of %d bytes: err %v", n, len(raw), err)
		}
	}
	seg := a.Segments[1].Blob
	at := bytes.Index(raw, seg)
	if at < 0 {
		t.Fatal("segment not found in the archive")
	}
	for i := range seg {
		bad := bytes.Clone(raw)
		bad[at+i] ^= 0x20
		_, err := Decode(bytes.NewReader(bad))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "updatelog/1") {
			t.Fatalf("byte %d of updatelog/1 changed: err %v", i, err)
		}
	}
}

// forgedV2 builds a version-2 backup with consistent hashes and checksum
// from the given segment entries (name, content) as they are.
func forgedV2(t *testing.T, s state, segs ...[2]string) []byte {
	key := keyFile(t, s.entry)
	files := [][2][]byte{{[]byte(DataFile), s.blob}, {[]byte(KeyFile), key}}
	for _, sg := range segs {
		files = append(files, [2][]byte{[]byte(sg[0]), []byte(sg[1])})
	}
	d := descriptor{Format: Format, Version: 2}
	for _, f := range files {
		d.Files = append(d.Files, fileDesc{Name: string(f[0]), Size: int64(len(f[1])), SHA256: sum(f[1])})
	}
	desc, _ := json.Marshal(d)
	entries := append([][2][]byte{{[]byte(descriptorName), desc}}, files...)
	list := [][2]string{}
	for _, e := range entries {
		list = append(list, [2]string{string(e[0]), string(e[1])})
	}
	list = append(list, [2]string{checksumName, checksum(entries) + "\n"})
	return rawTar(t, list...)
}

func TestDecodeRefusesForeignSegments(t *testing.T) {
	s := newState(t, "one")
	seg0, seg1 := string(segmentBlob(t, 0, "a")), string(segmentBlob(t, 1, "b"))
	if _, err := Decode(bytes.NewReader(forgedV2(t, s, [2]string{"updatelog/0", seg0}, [2]string{"updatelog/1", seg1}))); err != nil {
		t.Fatalf("the forging helper makes invalid backups: %v", err)
	}
	other, _ := seal.Seal(nil, bytes.Repeat([]byte{1}, 32), []byte(`{"format":1}`), []byte("x"))
	cases := []struct {
		name, want string
		raw        []byte
	}{
		{"not sealed", "updatelog/0", forgedV2(t, s, [2]string{"updatelog/0", "plain text"})},
		{"header names another segment", "names segment 1", forgedV2(t, s, [2]string{"updatelog/0", seg1})},
		{"sealed blob that is no segment", "names no segment", forgedV2(t, s, [2]string{"updatelog/0", string(other)})},
		{"out of order", "after updatelog/1", forgedV2(t, s, [2]string{"updatelog/1", seg1}, [2]string{"updatelog/0", seg0})},
		{"twice", "after updatelog/0", forgedV2(t, s, [2]string{"updatelog/0", seg0}, [2]string{"updatelog/0", seg0})},
		{"not canonical", "no update log segment", forgedV2(t, s, [2]string{"updatelog/01", seg1})},
		{"path escape", "no update log segment", forgedV2(t, s, [2]string{"updatelog/../sealed_data", seg0})},
		{"other file", "no update log segment", forgedV2(t, s, [2]string{"evil", seg0})},
		{"segment in version 1", "nothing else in version 1", func() []byte {
			raw := forgedV2(t, s, [2]string{"updatelog/0", seg0})
			return bytes.Replace(raw, []byte(`"version":2`), []byte(`"version":1`), 1)
		}()},
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

// A version-1 backup (no segments) decodes and restores as before.
func TestVersion1BackupStillRestores(t *testing.T) {
	s := newState(t, "old backup")
	a, err := Decode(bytes.NewReader(forged(t, 1, Format, s.blob, keyFile(t, s.entry))))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Segments) != 0 {
		t.Fatalf("%d segments", len(a.Segments))
	}
	dir := filepath.Join(t.TempDir(), "new")
	res, err := Restore(context.Background(), dir, a, false, nil)
	if err != nil || res.Segments != 0 {
		t.Fatalf("%+v, %v", res, err)
	}
	if plain, err := opens(dir); err != nil || !bytes.Equal(plain, s.plain) {
		t.Fatalf("opens to %q, %v", plain, err)
	}
	if _, err := os.Stat(filepath.Join(dir, LogDir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("restore of a version-1 backup made %s: %v", LogDir, err)
	}
}

// Take copies every segment file, skipping temporary and aside files,
// other names, and files that are not a sealed segment naming their index.
func TestTakeCopiesSegments(t *testing.T) {
	s := newState(t, "state")
	dir := t.TempDir()
	writeFiles(t, dir, s.blob, keyFile(t, s.entry))
	want := map[uint64][]byte{}
	for _, n := range []uint64{0, 1, 2, 64} {
		want[n] = segmentBlob(t, n, "entries "+strconv.FormatUint(n, 10))
		writeSegmentFile(t, dir, strconv.FormatUint(n, 10), want[n])
	}
	torn := segmentBlob(t, 3, "torn")
	writeSegmentFile(t, dir, "3", torn[:20])
	writeSegmentFile(t, dir, "4", want[1]) // names segment 1
	writeSegmentFile(t, dir, "2.tmp", []byte("partial"))
	writeSegmentFile(t, dir, "1.before-restore-20260101T000000Z", segmentBlob(t, 1, "old"))
	writeSegmentFile(t, dir, "05", segmentBlob(t, 5, "x"))

	a, info, err := Take(context.Background(), dir, TakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, sg := range a.Segments {
		got = append(got, sg.Index)
		if !bytes.Equal(sg.Blob, want[sg.Index]) {
			t.Errorf("segment %d differs", sg.Index)
		}
	}
	if fmt.Sprint(got) != "[0 1 2 64]" {
		t.Fatalf("took segments %v", got)
	}
	if len(info.Skipped) != 2 || !strings.HasPrefix(info.Skipped[0], "updatelog/3:") || !strings.HasPrefix(info.Skipped[1], "updatelog/4:") {
		t.Fatalf("skipped %q", info.Skipped)
	}
	// And the backup restores them.
	var buf bytes.Buffer
	if err := a.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	to := t.TempDir()
	if res, err := Restore(context.Background(), to, back, false, nil); err != nil || res.Segments != 4 {
		t.Fatalf("%+v, %v", res, err)
	}
	for n, b := range want {
		if got := readFile(t, filepath.Join(to, LogDir, strconv.FormatUint(n, 10))); !bytes.Equal(got, b) {
			t.Errorf("restored segment %d differs", n)
		}
	}
}

func TestRestoreSegments(t *testing.T) {
	ctx := context.Background()
	s := newState(t, "backup")
	a := withSegments(t, s.archive(t), 0, 1)

	t.Run("missing segments of the same state are written", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := Restore(ctx, dir, a, false, nil); err != nil {
			t.Fatal(err)
		}
		if res, err := Restore(ctx, dir, a, false, nil); err != nil || !res.Unchanged {
			t.Fatalf("again: %+v, %v", res, err)
		}
		if err := os.Remove(filepath.Join(dir, LogDir, "1")); err != nil {
			t.Fatal(err)
		}
		res, err := Restore(ctx, dir, a, false, nil)
		if err != nil || res.Unchanged || res.Segments != 1 || len(res.Aside) != 0 {
			t.Fatalf("%+v, %v", res, err)
		}
		if !bytes.Equal(readFile(t, filepath.Join(dir, LogDir, "1")), a.Segments[1].Blob) {
			t.Fatal("segment 1 not restored")
		}
	})

	t.Run("a differing segment needs --force and is kept aside", func(t *testing.T) {
		dir := t.TempDir()
		mine := segmentBlob(t, 1, "mine")
		writeSegmentFile(t, dir, "1", mine)
		before := snapshot(t, dir)
		_, err := Restore(ctx, dir, a, false, nil)
		var e *ExistingSegmentsError
		if !errors.As(err, &e) || len(e.Files) != 1 || e.Files[0] != "updatelog/1" || !strings.Contains(err.Error(), "--force") {
			t.Fatalf("err %v, want an ExistingSegmentsError for updatelog/1 naming --force", err)
		}
		if after := snapshot(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatal("a refused restore changed the directory")
		}
		res, err := Restore(ctx, dir, a, true, nil)
		if err != nil || res.Segments != 2 || len(res.Aside) != 1 {
			t.Fatalf("%+v, %v", res, err)
		}
		if !bytes.Equal(readFile(t, res.Aside[0]), mine) || !strings.Contains(res.Aside[0], filepath.Join(LogDir, "1.before-restore-")) {
			t.Fatalf("aside %v", res.Aside)
		}
		if !bytes.Equal(readFile(t, filepath.Join(dir, LogDir, "1")), a.Segments[1].Blob) {
			t.Fatal("segment 1 not restored")
		}
	})

	t.Run("over another state the other segments are kept aside", func(t *testing.T) {
		dir := t.TempDir()
		cur := newState(t, "current")
		writeFiles(t, dir, cur.blob, keyFile(t, cur.entry))
		writeSegmentFile(t, dir, "0", a.Segments[0].Blob) // the same
		extra := segmentBlob(t, 2, "the newer state's")
		writeSegmentFile(t, dir, "2", extra)
		res, err := Restore(ctx, dir, a, true, nil)
		if err != nil || res.Segments != 1 {
			t.Fatalf("%+v, %v", res, err)
		}
		var kept string
		for _, p := range res.Aside {
			if strings.Contains(p, filepath.Join(LogDir, "2.before-restore-")) {
				kept = p
			}
		}
		if kept == "" || !bytes.Equal(readFile(t, kept), extra) || len(res.Aside) != 3 {
			t.Fatalf("aside %v", res.Aside)
		}
		if plain, err := opens(dir); err != nil || !bytes.Equal(plain, s.plain) {
			t.Fatalf("opens to %q, %v", plain, err)
		}
	})
}

// A restore stopped before any write step leaves the old or the restored
// state; every segment is in place before the pair is written.
func TestRestoreWithSegmentsCrashSafe(t *testing.T) {
	cur, s := newState(t, "current"), newState(t, "backup")
	a := withSegments(t, s.archive(t), 0, 1)
	const steps = 2 + 1 + 3 // the segments, the marker, the pair
	for step := 0; step <= steps; step++ {
		t.Run(fmt.Sprint("crash before step ", step), func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, cur.blob, keyFile(t, cur.entry))
			_, err := restore(context.Background(), dir, a, true, nil, func(i int) bool { return i == step })
			if step < steps && !errors.Is(err, errCrashed) {
				t.Fatalf("err %v, the restore has %d steps", err, steps)
			}
			plain, err := opens(dir)
			if err != nil {
				t.Fatalf("does not open after a crash before step %d: %v", step, err)
			}
			if bytes.Equal(plain, s.plain) {
				for _, sg := range a.Segments {
					if b, err := os.ReadFile(filepath.Join(dir, LogDir, strconv.FormatUint(sg.Index, 10))); err != nil || !bytes.Equal(b, sg.Blob) {
						t.Fatalf("the restored state is in place before %s", sg.Name())
					}
				}
			} else if !bytes.Equal(plain, cur.plain) {
				t.Fatalf("opens to %q", plain)
			}
			if want := step >= 2+1+2; bytes.Equal(plain, s.plain) != want {
				t.Fatalf("crash before step %d: restored state %v, want %v", step, !want, want)
			}
		})
	}
}

// `coordinator restore` exits 4 for differing segments without --force.
func TestMainRestoreDifferingSegments(t *testing.T) {
	s := newState(t, "state")
	a := withSegments(t, s.archive(t), 0)
	file := filepath.Join(t.TempDir(), "b.qbk")
	if err := os.WriteFile(file, encode(t, a), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeSegmentFile(t, dir, "0", segmentBlob(t, 0, "other"))
	var stderr bytes.Buffer
	getenv := func(string) string { return "" }
	if code := Main("restore", []string{"--seal-dir", dir, "--in", file}, getenv, nil, &bytes.Buffer{}, &stderr); code != ExitExists {
		t.Fatalf("exit %d, want %d\n%s", code, ExitExists, stderr.String())
	}
	if !strings.Contains(stderr.String(), "updatelog/0") {
		t.Fatalf("message %q names no segment", stderr.String())
	}
	stderr.Reset()
	if code := Main("restore", []string{"--seal-dir", dir, "--in", file, "--force"}, getenv, nil, &bytes.Buffer{}, &stderr); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "1 update log segment(s) written") {
		t.Fatalf("message %q", stderr.String())
	}
}

// listTar returns the entry names of a tar archive.
func listTar(t *testing.T, raw []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(raw))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			return names
		}
		names = append(names, h.Name)
	}
}

// firstEntry returns the first entry's content.
func firstEntry(t *testing.T, raw []byte) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(raw))
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
