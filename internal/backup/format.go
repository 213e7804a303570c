// Package backup copies the Coordinator's sealed state (sealed_data and
// sealed_key in the seal directory, and the update log's sealed segments
// in its updatelog subdirectory) into a backup file and puts it back: the
// `coordinator backup` and `coordinator restore` commands
// (docs/backup.md).
//
// A backup holds exactly the sealed files, nothing decrypted: the state
// stays encrypted under its data key and the key stays sealed by whatever
// sealed it (in simulation that is no protection at all, as on disk).
//
// # Backup file format (version 2)
//
// A POSIX tar archive (ustar) of regular files, in this order:
//
//	quarry-backup.json  the descriptor: {"format":"quarry-seal-backup",
//	                    "version":2,"created":RFC 3339 time,"files":[
//	                    {"name":"sealed_data","size":N,"sha256":hex},
//	                    {"name":"sealed_key","size":N,"sha256":hex},
//	                    {"name":"updatelog/0",...}, ...]}
//	sealed_data         the sealed state, byte for byte
//	sealed_key          a key file with the one entry bound to that
//	                    sealed_data (or the legacy 32-byte key)
//	updatelog/<n>       zero or more sealed update log segments, byte for
//	                    byte, n decimal and strictly ascending
//	SHA256SUM           hex SHA-256 and a newline, over the entries
//	                    before it, each framed as name NUL size NUL content
//
// and nothing else; the descriptor lists the files in archive order, each
// entry is exactly the size the descriptor gives it, and none is a sparse
// file.
// Version 1 is the same without updatelog entries; it is still read.
// `tar -xf` unpacks it; `sha256sum` checks the files against the
// descriptor.
package backup

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
)

// The seal directory's file names (internal/app uses the same).
const (
	DataFile = "sealed_data"
	KeyFile  = "sealed_key"
)

// LogDir is the seal directory's subdirectory of update log segments
// (app.UpdateLogDir; a test keeps them equal). Segment n is the file
// LogDir/<n>.
const LogDir = "updatelog"

// Format names the backup format in the descriptor; Version is the format
// version this build writes. It reads versions 1 (no update log segments)
// and 2.
const (
	Format  = "quarry-seal-backup"
	Version = 2
)

const (
	descriptorName = "quarry-backup.json"
	checksumName   = "SHA256SUM"
	// maxDescriptor bounds the descriptor entry (about 80 bytes a
	// segment: room for some 200,000 segments, 12.8 million entries).
	maxDescriptor = 16 << 20
	// MaxFileSize bounds sealed_data (and so a backup) at 1 GiB; the
	// manifest and secrets limits keep real states far smaller.
	MaxFileSize = 1 << 30
	// maxKeyFile bounds sealed_key (two entries of at most 64 KiB each).
	maxKeyFile = 256 << 10
	// MaxSegmentSize bounds one update log segment file (64 entries);
	// MaxLogSize bounds all of them together.
	MaxSegmentSize = 64 << 20
	MaxLogSize     = 4 << 30
)

// ErrInvalid means a backup file is not a valid Quarry backup: truncated,
// corrupt (a checksum or hash does not match), of another format or an
// unsupported version, or holding files that do not belong together.
// Errors wrap it and say which.
var ErrInvalid = errors.New("not a valid Quarry backup")

// Archive is one backup: a consistent pair of sealed files and the update
// log segments stored beside them.
type Archive struct {
	// Created is when the backup was taken (second precision, UTC).
	Created time.Time
	// Data is sealed_data.
	Data []byte
	// Key is sealed_key, reduced to the entry bound to Data (or the
	// legacy raw key).
	Key []byte
	// Segments are the update log segment files, by ascending index.
	// They include every segment Data references (a segment is stored
	// before the first state that references it, and never changed once
	// referenced) and possibly later ones that no state references yet;
	// a Coordinator ignores those and writes them again.
	Segments []Segment
}

// Segment is one update log segment file, LogDir/<Index>.
type Segment struct {
	Index uint64
	// Blob is the sealed segment, byte for byte.
	Blob []byte
}

// Name is the segment's path in the seal directory and the archive.
func (s Segment) Name() string { return LogDir + "/" + strconv.FormatUint(s.Index, 10) }

// segmentHeader is the public header of a sealed segment (written by
// internal/core; a test keeps them equal).
type segmentHeader struct {
	Segment *uint64 `json:"updatelogSegment"`
}

// checkSegment verifies that blob is a well-formed sealed blob whose
// header names segment index. It cannot open it (the segment key is in
// the sealed state).
func checkSegment(index uint64, blob []byte) error {
	if len(blob) > MaxSegmentSize {
		return fmt.Errorf("%d bytes exceeds %d", len(blob), MaxSegmentSize)
	}
	raw, err := seal.ReadHeader(blob)
	if err != nil {
		return err
	}
	var h segmentHeader
	if err := json.Unmarshal(raw, &h); err != nil || h.Segment == nil {
		return errors.New("not an update log segment (its header names no segment)")
	}
	if *h.Segment != index {
		return fmt.Errorf("its header names segment %d", *h.Segment)
	}
	return nil
}

// parseSegmentName returns n for a canonical decimal file name "n".
func parseSegmentName(name string) (uint64, bool) {
	n, err := strconv.ParseUint(name, 10, 64)
	if err != nil || strconv.FormatUint(n, 10) != name {
		return 0, false
	}
	return n, true
}

type descriptor struct {
	Format  string     `json:"format"`
	Version int        `json:"version"`
	Created time.Time  `json:"created"`
	Files   []fileDesc `json:"files"`
}

type fileDesc struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// checksum is the SHA256SUM entry's hash over the entries before it.
func checksum(entries [][2][]byte) string {
	h := sha256.New()
	for _, e := range entries {
		h.Write(e[0])
		h.Write([]byte{0})
		h.Write([]byte(strconv.Itoa(len(e[1]))))
		h.Write([]byte{0})
		h.Write(e[1])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Check verifies that the archive's files belong together: sealed_data is
// a well-formed sealed blob and sealed_key a key file with an entry bound
// to it. It does not (cannot, without the sealing key) decrypt anything.
func (a *Archive) Check() error {
	if len(a.Data) > MaxFileSize {
		return fmt.Errorf("%w: sealed_data of %d bytes exceeds %d", ErrInvalid, len(a.Data), MaxFileSize)
	}
	if len(a.Key) > maxKeyFile {
		return fmt.Errorf("%w: sealed_key of %d bytes exceeds %d", ErrInvalid, len(a.Key), maxKeyFile)
	}
	if _, err := seal.ReadHeader(a.Data); err != nil {
		return fmt.Errorf("%w: sealed_data: %w", ErrInvalid, err)
	}
	entries, err := seal.DecodeKeyFile(a.Key)
	if err != nil {
		return fmt.Errorf("%w: sealed_key: %w", ErrInvalid, err)
	}
	if _, ok := seal.Find(entries, a.Data); !ok {
		return fmt.Errorf("%w: sealed_key has no entry bound to sealed_data", ErrInvalid)
	}
	var total int64
	for i, s := range a.Segments {
		if i > 0 && s.Index <= a.Segments[i-1].Index {
			return fmt.Errorf("%w: update log segments out of order (%d after %d)", ErrInvalid, s.Index, a.Segments[i-1].Index)
		}
		if err := checkSegment(s.Index, s.Blob); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalid, s.Name(), err)
		}
		if total += int64(len(s.Blob)); total > MaxLogSize {
			return fmt.Errorf("%w: the update log segments exceed %d bytes", ErrInvalid, int64(MaxLogSize))
		}
	}
	return nil
}

// Encode writes the archive in the backup file format.
func (a *Archive) Encode(w io.Writer) error {
	if err := a.Check(); err != nil {
		return err
	}
	created := a.Created.UTC().Truncate(time.Second)
	files := [][2][]byte{{[]byte(DataFile), a.Data}, {[]byte(KeyFile), a.Key}}
	for _, s := range a.Segments {
		files = append(files, [2][]byte{[]byte(s.Name()), s.Blob})
	}
	d := descriptor{Format: Format, Version: Version, Created: created}
	for _, f := range files {
		d.Files = append(d.Files, fileDesc{Name: string(f[0]), Size: int64(len(f[1])), SHA256: sum(f[1])})
	}
	desc, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	desc = append(desc, '\n')
	if len(desc) > maxDescriptor {
		return fmt.Errorf("backup: the descriptor of %d files exceeds %d bytes", len(files), maxDescriptor)
	}
	entries := append([][2][]byte{{[]byte(descriptorName), desc}}, files...)
	entries = append(entries, [2][]byte{[]byte(checksumName), []byte(checksum(entries) + "\n")})

	tw := tar.NewWriter(w)
	for _, e := range entries {
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     string(e[0]),
			Size:     int64(len(e[1])),
			Mode:     0o600,
			ModTime:  created,
			Format:   tar.FormatUSTAR,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("backup: write %s: %w", e[0], err)
		}
		if _, err := tw.Write(e[1]); err != nil {
			return fmt.Errorf("backup: write %s: %w", e[0], err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("backup: finish archive: %w", err)
	}
	return nil
}

// Decode reads and verifies a backup file: the format and version, every
// entry, the descriptor's sizes and hashes, the checksum, that nothing
// else follows, and Check. Any problem is an error wrapping ErrInvalid
// that says what is wrong.
//
// What it reads is bounded before it is read: each entry must be a plain
// regular file (no sparse file, whose holes the tar reader would expand
// into zeros), exactly as large as the descriptor declares, and within the
// format's limit for that file; and no entry may yield more bytes than the
// archive itself supplied. So the memory a backup file can make Decode use
// grows with the file's real size, never with sizes it claims.
func Decode(r io.Reader) (*Archive, error) {
	cr := &countingReader{r: r}
	tr := tar.NewReader(cr)
	content := &contentReader{r: tr, in: cr}
	// next reads the entry want: its size must be declared (declared < 0:
	// the descriptor itself, which declares nothing) and at most limit.
	next := func(want string, declared, limit int64) ([]byte, error) {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: truncated: the archive ends before %s", ErrInvalid, want)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading the entry for %s: %s", ErrInvalid, want, describe(err))
		}
		if hdr.Name != want {
			return nil, fmt.Errorf("%w: entry %q where %s belongs", ErrInvalid, hdr.Name, want)
		}
		if isSparse(hdr) {
			return nil, fmt.Errorf("%w: %s is a sparse file (GNU sparse format); a Quarry backup holds plain regular files only (was the archive repacked by another tool?)", ErrInvalid, want)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("%w: %s is not a regular file (type %q)", ErrInvalid, want, hdr.Typeflag)
		}
		if hdr.Size < 0 || hdr.Size > limit {
			return nil, fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrInvalid, want, hdr.Size, limit)
		}
		if declared >= 0 && hdr.Size != declared {
			return nil, fmt.Errorf("%w: the entry %s is %d bytes, the descriptor declares %d: corrupt", ErrInvalid, want, hdr.Size, declared)
		}
		b, err := readContent(content, hdr.Size)
		if err != nil {
			return nil, fmt.Errorf("%w: reading %s: %s", ErrInvalid, want, describe(err))
		}
		return b, nil
	}

	rawDesc, err := next(descriptorName, -1, maxDescriptor)
	if err != nil {
		return nil, err
	}
	var desc descriptor
	dec := json.NewDecoder(bytes.NewReader(rawDesc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&desc); err != nil {
		return nil, fmt.Errorf("%w: descriptor %s: %v", ErrInvalid, descriptorName, err)
	}
	if desc.Format != Format {
		return nil, fmt.Errorf("%w: descriptor names format %q, not %q", ErrInvalid, desc.Format, Format)
	}
	if desc.Version != 1 && desc.Version != Version {
		return nil, fmt.Errorf("%w: format version %d (this build reads versions 1 to %d; a newer Quarry wrote it?)", ErrInvalid, desc.Version, Version)
	}
	if len(desc.Files) < 2 || desc.Files[0].Name != DataFile || desc.Files[1].Name != KeyFile ||
		(desc.Version == 1 && len(desc.Files) != 2) {
		return nil, fmt.Errorf("%w: the descriptor must list %s and %s first, in that order (and nothing else in version 1)", ErrInvalid, DataFile, KeyFile)
	}
	for _, f := range []struct {
		d     fileDesc
		limit int64
	}{{desc.Files[0], MaxFileSize}, {desc.Files[1], maxKeyFile}} {
		if f.d.Size < 0 || f.d.Size > f.limit {
			return nil, fmt.Errorf("%w: the descriptor declares %s of %d bytes; at most %d are allowed", ErrInvalid, f.d.Name, f.d.Size, f.limit)
		}
	}
	// The segments: LogDir/<n>, n strictly ascending.
	var segs []Segment
	var total int64
	for i, f := range desc.Files[2:] {
		n, ok := uint64(0), false
		if rest, cut := strings.CutPrefix(f.Name, LogDir+"/"); cut {
			n, ok = parseSegmentName(rest)
		}
		if !ok {
			return nil, fmt.Errorf("%w: the descriptor lists %q, which is no update log segment", ErrInvalid, f.Name)
		}
		if i > 0 && n <= segs[i-1].Index {
			return nil, fmt.Errorf("%w: the descriptor lists %s after %s", ErrInvalid, f.Name, segs[i-1].Name())
		}
		if f.Size < 0 || f.Size > MaxSegmentSize {
			return nil, fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrInvalid, f.Name, f.Size, MaxSegmentSize)
		}
		if total += f.Size; total > MaxLogSize {
			return nil, fmt.Errorf("%w: the update log segments exceed %d bytes", ErrInvalid, int64(MaxLogSize))
		}
		segs = append(segs, Segment{Index: n})
	}
	data, err := next(DataFile, desc.Files[0].Size, MaxFileSize)
	if err != nil {
		return nil, err
	}
	key, err := next(KeyFile, desc.Files[1].Size, maxKeyFile)
	if err != nil {
		return nil, err
	}
	blobs := [][]byte{data, key}
	for i := range segs {
		if segs[i].Blob, err = next(segs[i].Name(), desc.Files[2+i].Size, MaxSegmentSize); err != nil {
			return nil, err
		}
		blobs = append(blobs, segs[i].Blob)
	}
	entries := [][2][]byte{{[]byte(descriptorName), rawDesc}}
	for i, b := range blobs {
		f := desc.Files[i]
		if int64(len(b)) != f.Size || sum(b) != f.SHA256 {
			return nil, fmt.Errorf("%w: %s (%d bytes, SHA-256 %s) does not match the descriptor (%d bytes, SHA-256 %s): corrupt", ErrInvalid, f.Name, len(b), sum(b), f.Size, f.SHA256)
		}
		entries = append(entries, [2][]byte{[]byte(f.Name), b})
	}
	got, err := next(checksumName, 2*sha256.Size+1, 2*sha256.Size+1)
	if err != nil {
		return nil, err
	}
	want := checksum(entries) + "\n"
	if string(got) != want {
		return nil, fmt.Errorf("%w: the checksum does not match the content: corrupt", ErrInvalid)
	}
	// The end of the checksum entry's (padded) content, then the two zero
	// blocks that end a tar archive.
	end := (cr.n+blockSize-1)/blockSize*blockSize + 2*blockSize
	switch hdr, err := tr.Next(); {
	case errors.Is(err, io.EOF) && cr.n < end:
		return nil, fmt.Errorf("%w: truncated: the end-of-archive marker is missing", ErrInvalid)
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fmt.Errorf("%w: after the checksum: %s", ErrInvalid, describe(err))
	default:
		return nil, fmt.Errorf("%w: unexpected entry %q after the checksum", ErrInvalid, hdr.Name)
	}
	a := &Archive{Created: desc.Created, Data: data, Key: key, Segments: segs}
	if err := a.Check(); err != nil {
		return nil, err
	}
	return a, nil
}

const blockSize = 512

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// isSparse reports whether hdr is a GNU sparse file: the old GNU type 'S',
// or a PAX entry with GNU.sparse records (formats 0.0, 0.1 and 1.0), which
// the tar reader expands to its real size by filling the holes with zeros.
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// errExpands: entries yielded more bytes than the archive holds.
var errExpands = errors.New("the entries yield more bytes than the archive holds (an expanded sparse or otherwise synthesised entry)")

// contentReader hands out the content of the archive's entries and fails
// as soon as, all entries together, it has handed out more bytes than were
// read from the archive: plain entries are stored byte for byte, so only
// an entry the tar reader synthesises (such as a sparse file's holes) can
// do that. It bounds the total expansion by the archive's own size.
type contentReader struct {
	r   io.Reader
	in  *countingReader
	out int64
}

func (c *contentReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.out += int64(n)
	if c.out > c.in.n {
		return n, errExpands
	}
	return n, err
}

// readContent reads exactly size bytes. The buffer grows with the data
// read (doubling, never past size), not with the size claimed, so a header
// that claims more than the archive holds costs no more memory than the
// archive does.
func readContent(r io.Reader, size int64) ([]byte, error) {
	const first = 64 << 10
	buf := make([]byte, 0, min(size, first))
	for int64(len(buf)) < size {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(size-int64(len(buf)), int64(len(buf)))))
		}
		n, err := r.Read(buf[len(buf):int(min(int64(cap(buf)), size))])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) && int64(len(buf)) < size {
			return nil, io.ErrUnexpectedEOF
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
	}
	return buf, nil
}

// describe turns a tar reading error into words.
func describe(err error) string {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "truncated (unexpected end of file)"
	}
	if errors.Is(err, tar.ErrHeader) {
		return "not a tar archive, or a corrupt entry header"
	}
	return err.Error()
}
