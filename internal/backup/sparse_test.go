package backup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// Hand-made tar blocks: archive/tar's writer cannot write sparse files
// (it drops GNU.sparse records), so the tests build them from the format
// (POSIX pax, GNU tar's sparse formats 0.0, 0.1 and 1.0 and its old 'S'
// type).

// tarHeader is a ustar header block (gnu: the GNU magic instead).
func tarHeader(name string, typ byte, size int64, gnu bool) []byte {
	b := make([]byte, blockSize)
	copy(b[0:100], name)
	copy(b[100:108], "0000600\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], fmt.Sprintf("%011o\x00", 1767225600))
	b[156] = typ
	if gnu {
		copy(b[257:265], "ustar  \x00")
	} else {
		copy(b[257:263], "ustar\x00")
		copy(b[263:265], "00")
	}
	return b
}

// checksummed sets a header block's checksum field.
func checksummed(b []byte) []byte {
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// padded pads content to whole blocks.
func padded(b []byte) []byte {
	if r := len(b) % blockSize; r != 0 {
		b = append(b, make([]byte, blockSize-r)...)
	}
	return b
}

// paxRecords encodes PAX records ("<len> key=value\n", len counting
// itself), in the order given.
func paxRecords(kv ...string) []byte {
	var out []byte
	for i := 0; i < len(kv); i += 2 {
		rec := " " + kv[i] + "=" + kv[i+1] + "\n"
		n := len(rec) + 1
		for len(strconv.Itoa(n))+len(rec) != n {
			n++
		}
		out = append(out, strconv.Itoa(n)+rec...)
	}
	return out
}

// entry is one regular ustar entry, header and padded content.
func regEntry(name string, content []byte) []byte {
	return append(checksummed(tarHeader(name, '0', int64(len(content)), false)), padded(bytes.Clone(content))...)
}

// paxEntry is a PAX extended header followed by a regular entry.
func paxEntry(name string, content []byte, records []byte) []byte {
	out := append(checksummed(tarHeader("PaxHeaders/"+name, 'x', int64(len(records)), false)), padded(bytes.Clone(records))...)
	return append(out, regEntry(name, content)...)
}

// sparseDescriptor is a version-2 descriptor that declares sealed_data of
// size bytes (with a hash it will not match) and a real sealed_key.
func sparseDescriptor(size int64, key []byte) []byte {
	return fmt.Appendf(nil, `{"format":%q,"version":2,"created":"2026-01-02T03:04:05Z","files":[{"name":"sealed_data","size":%d,"sha256":%q},{"name":"sealed_key","size":%d,"sha256":%q}]}`,
		Format, size, strings.Repeat("0", 64), len(key), sum(key))
}

// sparseBackup is a backup whose sealed_data is a sparse file of realSize
// bytes stored as one data byte at its end, in the given sparse format:
// "1.0" (PAX, the map in the data), "0.1" (PAX GNU.sparse.map), "0.0"
// (PAX GNU.sparse.offset/numbytes) or "gnu" (the old GNU 'S' type). The
// whole file is a few KiB.
func sparseBackup(t testing.TB, format string, realSize int64) []byte {
	t.Helper()
	s := newState(t, "sparse")
	key := keyFile(t, s.entry)
	out := regEntry(descriptorName, sparseDescriptor(realSize, key))
	last := strconv.FormatInt(realSize-1, 10)
	real := strconv.FormatInt(realSize, 10)
	switch format {
	case "1.0":
		data := padded([]byte("1\n" + last + "\n1\n"))
		data = append(data, 'x')
		out = append(out, paxEntry("GNUSparseFile.0/sealed_data", data, paxRecords(
			"GNU.sparse.major", "1", "GNU.sparse.minor", "0", "GNU.sparse.name", DataFile, "GNU.sparse.realsize", real))...)
	case "0.1":
		out = append(out, paxEntry(DataFile, []byte("x"), paxRecords(
			"GNU.sparse.numblocks", "1", "GNU.sparse.map", last+",1", "GNU.sparse.size", real))...)
	case "0.0":
		out = append(out, paxEntry(DataFile, []byte("x"), paxRecords(
			"GNU.sparse.numblocks", "1", "GNU.sparse.offset", last, "GNU.sparse.numbytes", "1", "GNU.sparse.size", real))...)
	case "gnu":
		h := tarHeader(DataFile, 'S', 1, true)
		copy(h[386:398], fmt.Sprintf("%011o\x00", realSize-1)) // offset of the data
		copy(h[398:410], fmt.Sprintf("%011o\x00", 1))          // its length
		copy(h[483:495], fmt.Sprintf("%011o\x00", realSize))   // the real size
		out = append(out, checksummed(h)...)
		out = append(out, padded([]byte("x"))...)
	default:
		t.Fatalf("unknown sparse format %q", format)
	}
	out = append(out, regEntry(KeyFile, key)...)
	return append(out, make([]byte, 2*blockSize)...)
}

// allocated returns the bytes f allocated on the heap (runtime.MemStats:
// TotalAlloc, which counts every allocation, freed or not, so it is at
// least the peak f reached). Nothing else may run meanwhile.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestDecodeRefusesSparseEntries: a backup of a few KiB whose sealed_data
// is a sparse file claiming 64 MiB, in each of GNU tar's sparse formats,
// is refused as sparse before its holes are expanded: Decode allocates a
// few hundred KiB, not the claimed size.
func TestDecodeRefusesSparseEntries(t *testing.T) {
	const claimed = 64 << 20
	for _, format := range []string{"1.0", "0.1", "0.0", "gnu"} {
		t.Run(format, func(t *testing.T) {
			raw := sparseBackup(t, format, claimed)
			if len(raw) > 8<<10 {
				t.Fatalf("the crafted backup is %d bytes", len(raw))
			}
			var err error
			used := allocated(func() { _, err = Decode(bytes.NewReader(raw)) })
			t.Logf("%d-byte backup claiming %d bytes: %d bytes allocated; %v", len(raw), claimed, used, err)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "sealed_data is a sparse file") {
				t.Errorf("err %v, want ErrInvalid naming sealed_data as a sparse file", err)
			}
			if used > 2<<20 {
				t.Errorf("Decode allocated %d bytes for a %d-byte backup", used, len(raw))
			}
		})
	}
}

// TestDecodeRefusesEntriesOverTheirDeclaredSize: an entry larger than the
// descriptor declares is refused before it is read, and so is a descriptor
// that declares more than the format allows.
func TestDecodeRefusesEntriesOverTheirDeclaredSize(t *testing.T) {
	s := newState(t, "declared")
	key := keyFile(t, s.entry)
	good := forged(t, Version, Format, s.blob, key)
	if _, err := Decode(bytes.NewReader(good)); err != nil {
		t.Fatalf("the forging helper makes invalid backups: %v", err)
	}
	// The descriptor declares a shorter sealed_data than the entry holds.
	short := fmt.Appendf(nil, `{"format":%q,"version":2,"created":"2026-01-02T03:04:05Z","files":[{"name":"sealed_data","size":%d,"sha256":%q},{"name":"sealed_key","size":%d,"sha256":%q}]}`,
		Format, len(s.blob)-1, sum(s.blob), len(key), sum(key))
	raw := append(regEntry(descriptorName, short), regEntry(DataFile, s.blob)...)
	raw = append(append(raw, regEntry(KeyFile, key)...), make([]byte, 2*blockSize)...)
	_, err := Decode(bytes.NewReader(raw))
	want := fmt.Sprintf("the entry sealed_data is %d bytes, the descriptor declares %d", len(s.blob), len(s.blob)-1)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err %v, want ErrInvalid saying %q", err, want)
	}
	// More than the format allows, declared: refused before any entry.
	for name, desc := range map[string][]byte{
		"sealed_data": sparseDescriptor(MaxFileSize+1, key),
		"sealed_key": fmt.Appendf(nil, `{"format":%q,"version":2,"created":"2026-01-02T03:04:05Z","files":[{"name":"sealed_data","size":1,"sha256":%q},{"name":"sealed_key","size":%d,"sha256":%q}]}`,
			Format, sum(nil), maxKeyFile+1, sum(nil)),
	} {
		raw := append(regEntry(descriptorName, desc), make([]byte, 2*blockSize)...)
		_, err := Decode(bytes.NewReader(raw))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "the descriptor declares "+name) {
			t.Errorf("%s over its limit: err %v", name, err)
		}
	}
	// A regular entry whose header claims more than the archive holds
	// is truncated, and costs no more memory than the archive.
	desc := sparseDescriptor(64<<20, key)
	raw = append(regEntry(descriptorName, desc), checksummed(tarHeader(DataFile, '0', 64<<20, false))...)
	raw = append(raw, make([]byte, 4*blockSize)...)
	used := allocated(func() { _, err = Decode(bytes.NewReader(raw)) })
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "truncated") || used > 2<<20 {
		t.Fatalf("a header claiming 64 MiB in a %d-byte file: %v, %d bytes allocated", len(raw), err, used)
	}
}

// zeros yields zeros without end.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestContentReaderBoundsExpansion: a reader that yields more than the
// archive supplied (as an expanded sparse file would) fails at once.
func TestContentReaderBoundsExpansion(t *testing.T) {
	in := &countingReader{r: strings.NewReader("abc")}
	io.ReadAll(in)
	c := &contentReader{r: zeros{}, in: in}
	b, err := readContent(c, 1<<30)
	if !errors.Is(err, errExpands) || b != nil {
		t.Fatalf("readContent of a synthesising reader: %d bytes, %v", len(b), err)
	}
	if c.out > 1<<20 {
		t.Fatalf("it handed out %d bytes before failing", c.out)
	}
	// As many bytes as were supplied pass.
	c = &contentReader{r: strings.NewReader("xyz"), in: in}
	if b, err := readContent(c, 3); err != nil || string(b) != "xyz" {
		t.Fatalf("%q, %v", b, err)
	}
}
