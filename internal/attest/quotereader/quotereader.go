// Package quotereader reads the little-endian, size-prefixed fields of DCAP
// quotes (SGX and TDX) with bounds checks: the first error is kept and
// every later read is a no-op, so parsers check once per section.
package quotereader

import (
	"encoding/binary"
	"fmt"
)

// Reader reads fields from B starting at Off and remembers the first error,
// which wraps Format.
type Reader struct {
	B      []byte
	Off    int
	Err    error
	Format error // the parser's "malformed" sentinel
}

// Remaining returns the number of unread bytes.
func (r *Reader) Remaining() int { return len(r.B) - r.Off }

// Take returns the next n bytes (capacity-limited) or nil after an error.
func (r *Reader) Take(n int, what string) []byte {
	if r.Err != nil {
		return nil
	}
	if n < 0 || n > r.Remaining() {
		r.Err = fmt.Errorf("%w: %s: need %d bytes at offset %d, %d remain", r.Format, what, n, r.Off, r.Remaining())
		return nil
	}
	s := r.B[r.Off : r.Off+n : r.Off+n]
	r.Off += n
	return s
}

// Array fills dst with the next len(dst) bytes.
func (r *Reader) Array(dst []byte, what string) { copy(dst, r.Take(len(dst), what)) }

// U16 reads a little-endian uint16.
func (r *Reader) U16(what string) uint16 {
	if s := r.Take(2, what); s != nil {
		return binary.LittleEndian.Uint16(s)
	}
	return 0
}

// U32 reads a little-endian uint32.
func (r *Reader) U32(what string) uint32 {
	if s := r.Take(4, what); s != nil {
		return binary.LittleEndian.Uint32(s)
	}
	return 0
}

// CertData reads a certification data field (u16 type, u32 size, data)
// that must end exactly at the end of B.
func (r *Reader) CertData(where string) (uint16, []byte) {
	typ := r.U16(where + ": certification data type")
	size := r.U32(where + ": certification data size")
	if r.Err != nil {
		return 0, nil
	}
	if rem := r.Remaining(); uint64(size) != uint64(rem) {
		r.Err = fmt.Errorf("%w: %s: certification data size %d, but %d bytes follow", r.Format, where, size, rem)
		return 0, nil
	}
	return typ, r.Take(int(size), where+": certification data")
}
