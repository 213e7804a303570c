package sgxquote

import (
	"encoding/binary"
	"fmt"
)

// Open Enclave remote report header values.
const (
	oeVersion          = 1
	oeReportTypeRemote = 2 // OE_REPORT_TYPE_SGX_REMOTE
)

// Wrap prefixes a raw quote with the Open Enclave remote report header
// (u32 version 1, u32 type 2, u64 quote length; little-endian), the form
// EGo's GetRemoteReport returns and MarbleRun's tools expect.
func Wrap(quote []byte) []byte {
	out := make([]byte, OEHeaderSize, OEHeaderSize+len(quote))
	binary.LittleEndian.PutUint32(out[0:], oeVersion)
	binary.LittleEndian.PutUint32(out[4:], oeReportTypeRemote)
	binary.LittleEndian.PutUint64(out[8:], uint64(len(quote)))
	return append(out, quote...)
}

// IsWrapped reports whether b starts like an Open Enclave remote report
// (version 1, type 2). A raw quote never does: it starts with its version.
func IsWrapped(b []byte) bool {
	return len(b) >= 8 && binary.LittleEndian.Uint32(b) == oeVersion && binary.LittleEndian.Uint32(b[4:]) == oeReportTypeRemote
}

// Unwrap removes the Open Enclave header and returns the quote it carries,
// which aliases b. The header's length must equal the rest of b exactly.
func Unwrap(b []byte) ([]byte, error) {
	if len(b) < OEHeaderSize {
		return nil, fmt.Errorf("%w: OE report: %d bytes, shorter than its %d-byte header", ErrFormat, len(b), OEHeaderSize)
	}
	if !IsWrapped(b) {
		return nil, fmt.Errorf("%w: OE report: header version %d, type %d (want 1, 2)", ErrFormat,
			binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]))
	}
	if n := binary.LittleEndian.Uint64(b[8:]); n != uint64(len(b)-OEHeaderSize) {
		return nil, fmt.Errorf("%w: OE report: header says %d quote bytes, %d follow", ErrFormat, n, len(b)-OEHeaderSize)
	}
	return b[OEHeaderSize:], nil
}

// ParseAny parses either a raw quote or an Open Enclave remote report.
func ParseAny(b []byte) (*Quote, error) {
	if IsWrapped(b) {
		raw, err := Unwrap(b)
		if err != nil {
			return nil, err
		}
		b = raw
	}
	return Parse(b)
}

// IsRaw reports whether b looks like a raw SGX quote by MarbleRun's rule
// (util.IsRawSGXQuote): at least 48 bytes, version 3, attestation key type
// at most 3, TEE type 0, and non-zero QE and PCE SVNs. MarbleRun wraps such
// input in an OE header before verifying it.
func IsRaw(b []byte) bool {
	if len(b) < HeaderSize {
		return false
	}
	return binary.LittleEndian.Uint16(b[0:]) == Version3 &&
		binary.LittleEndian.Uint16(b[2:]) <= 3 &&
		binary.LittleEndian.Uint32(b[4:]) == TEETypeSGX &&
		binary.LittleEndian.Uint16(b[8:]) != 0 &&
		binary.LittleEndian.Uint16(b[10:]) != 0
}
