package sgxquote

import (
	"encoding/binary"
	"fmt"
)

// tdxReport10Size is the size of a v4 TDX quote's body (TD report 1.0); see
// package tdxquote.
const tdxReport10Size = 584

// DeclaredLen returns the length of the DCAP quote at the start of b as its
// own fields declare it: the 48-byte header, in version 5 the body type and
// body size, the body (an SGX report, or in a version 4 TDX quote a TD
// report 1.0), and the signature data with its 4-byte length. It reads SGX
// and TDX quotes of versions 3 to 5. Intel's verification library ignores
// bytes after that length; a caller that does the same keeps b[:n]. It
// fails when b is shorter than the declared quote or the header is not one
// of these.
func DeclaredLen(b []byte) (int, error) {
	if len(b) < HeaderSize {
		return 0, fmt.Errorf("%w: %d bytes, shorter than a quote header", ErrFormat, len(b))
	}
	version := binary.LittleEndian.Uint16(b)
	tee := binary.LittleEndian.Uint32(b[4:])
	off := uint64(HeaderSize)
	var body uint64
	switch {
	case version == Version5:
		if len(b) < HeaderSize+6 {
			return 0, fmt.Errorf("%w: a version 5 quote of %d bytes ends inside its body descriptor", ErrFormat, len(b))
		}
		body = uint64(binary.LittleEndian.Uint32(b[HeaderSize+2:]))
		off += 6
	case (version == Version3 || version == Version4) && tee == TEETypeSGX:
		body = ReportBodySize
	case version == Version4 && tee == TEETypeTDX:
		body = tdxReport10Size
	default:
		return 0, fmt.Errorf("%w: version %d, TEE type %#x", ErrUnsupported, version, tee)
	}
	off += body
	if off+4 > uint64(len(b)) {
		return 0, fmt.Errorf("%w: the quote declares a body of %d bytes, but only %d bytes follow its header", ErrFormat, body, uint64(len(b))-HeaderSize)
	}
	end := off + 4 + uint64(binary.LittleEndian.Uint32(b[off:]))
	if end > uint64(len(b)) {
		return 0, fmt.Errorf("%w: the quote declares %d bytes, but has %d", ErrFormat, end, len(b))
	}
	return int(end), nil
}

// Declared returns the quote that b holds as declared, without bytes after
// it: a raw quote (SGX or TDX) cut to DeclaredLen, or an Open Enclave
// report whose quote is cut so, with the header's length set to it. The
// OE header may declare more bytes than the quote (they are ignored, as by
// Open Enclave's verification), not more than follow it. The result may
// alias b.
func Declared(b []byte) ([]byte, error) {
	if !IsWrapped(b) {
		n, err := DeclaredLen(b)
		if err != nil {
			return nil, err
		}
		return b[:n:n], nil
	}
	if len(b) < OEHeaderSize {
		return nil, fmt.Errorf("%w: OE report: %d bytes, shorter than its %d-byte header", ErrFormat, len(b), OEHeaderSize)
	}
	rest := b[OEHeaderSize:]
	declared := binary.LittleEndian.Uint64(b[8:])
	if declared > uint64(len(rest)) {
		return nil, fmt.Errorf("%w: OE report: header says %d quote bytes, %d follow", ErrFormat, declared, len(rest))
	}
	rest = rest[:declared]
	n, err := DeclaredLen(rest)
	if err != nil {
		return nil, err
	}
	if n == len(b)-OEHeaderSize {
		return b, nil
	}
	return Wrap(rest[:n]), nil
}
