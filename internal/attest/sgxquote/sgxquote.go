// Package sgxquote parses Intel SGX DCAP quotes: version 3, and versions 4
// and 5 when they carry an SGX enclave report body. It also adds and removes
// the 16-byte Open Enclave "remote report" header that EGo and MarbleRun put
// in front of a quote. Parsing is bounded by the input, checks every declared
// size exactly, rejects trailing bytes and never panics. DeclaredLen and
// Declared find where a quote (SGX or TDX) ends by its own size fields, for
// callers that ignore what follows it as Intel's verification library does.
// It does not verify anything; see package dcap.
package sgxquote

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/quarry-cc/quarry/internal/attest/quotereader"
)

// Sizes of the fixed parts of a quote.
const (
	HeaderSize     = 48  // quote header
	ReportBodySize = 384 // sgx_report_body_t
	SignatureSize  = 64  // ECDSA P-256 r‖s, big-endian
	PublicKeySize  = 64  // ECDSA P-256 X‖Y, big-endian
	OEHeaderSize   = 16  // Open Enclave remote report header
)

// Quote versions this package parses.
const (
	Version3 = 3
	Version4 = 4
	Version5 = 5
)

// AttestationKeyECDSAP256 is the only attestation key type supported
// (att_key_type 2, ECDSA-256-with-P-256).
const AttestationKeyECDSAP256 = 2

// TEE types in the header (tee_type, v4 and later; zero in v3).
const (
	TEETypeSGX = 0x00
	TEETypeTDX = 0x81
)

// BodyTypeSGX is the v5 body type of an SGX enclave report.
const BodyTypeSGX = 1

// Certification data types (sgx_ql_cert_key_type_t).
const (
	CertTypePPIDCleartext = 1
	CertTypePPIDRSA2048   = 2
	CertTypePPIDRSA3072   = 3
	CertTypePCKLeaf       = 4
	CertTypePCKChain      = 5 // PEM(PCK leaf) ‖ PEM(intermediate) ‖ PEM(root)
	CertTypeQEReport      = 6 // v4/v5: QE report certification data wrapping 1–5
)

// IntelQEVendorID returns the QE vendor ID of Intel's quoting enclave,
// 939A7233-F79C-4CA9-940A-0DB3957F0607.
func IntelQEVendorID() [16]byte {
	return [16]byte{0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9, 0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07}
}

var (
	// ErrFormat means the input is not a well-formed quote (or OE report):
	// a size does not match, a field is truncated or bytes trail.
	ErrFormat = errors.New("sgxquote: malformed quote")
	// ErrUnsupported means the input is well-formed but uses a version, key
	// type, TEE type or certification data type this package does not handle.
	ErrUnsupported = errors.New("sgxquote: unsupported quote")
)

// Header is the 48-byte quote header. In v4 and v5 the bytes of QESVN and
// PCESVN are reserved.
type Header struct {
	Version    uint16
	AttKeyType uint16
	TEEType    uint32 // att_key_data_0 in v3
	QESVN      uint16
	PCESVN     uint16
	QEVendorID [16]byte
	UserData   [20]byte
}

// ReadHeader reads the 48-byte quote header that SGX and TDX quotes share;
// a short input leaves r.Err set.
func ReadHeader(r *quotereader.Reader) Header {
	var h Header
	h.Version = r.U16("version")
	h.AttKeyType = r.U16("attestation key type")
	h.TEEType = r.U32("TEE type")
	h.QESVN = r.U16("QE SVN")
	h.PCESVN = r.U16("PCE SVN")
	r.Array(h.QEVendorID[:], "QE vendor ID")
	r.Array(h.UserData[:], "user data")
	return h
}

// Quote is a parsed SGX DCAP quote. It holds its own copy of the input.
// Byte slices it returns must not be modified.
type Quote struct {
	Header Header
	// BodyType is the v5 body type (always BodyTypeSGX); zero for v3 and v4.
	BodyType uint16
	// Body is the ISV enclave's report body.
	Body ReportBody
	// Signature is the ECDSA signature by the attestation key over SignedData.
	Signature [SignatureSize]byte
	// AttestationKey is the attestation public key X‖Y.
	AttestationKey [PublicKeySize]byte
	// QEReport is the quoting enclave's report body.
	QEReport ReportBody
	// QEReportSignature is the PCK key's signature over QEReport.
	QEReportSignature [SignatureSize]byte
	// QEAuthData is the QE authentication data bound into QEReport.
	QEAuthData []byte
	// CertType and CertData are the certification data that identifies the
	// PCK key: in v3 the quote's own, in v4/v5 the data inside type 6.
	CertType uint16
	CertData []byte

	raw    []byte
	signed []byte
}

// Raw returns the whole quote (without an OE header).
func (q *Quote) Raw() []byte { return q.raw }

// SignedData returns the bytes the attestation key signs: the header and the
// body (v3, v4), or the header, body type, body size and body (v5).
func (q *Quote) SignedData() []byte { return q.signed }

// Parse parses a raw quote (no OE header). The whole input must be the quote.
func Parse(b []byte) (*Quote, error) {
	raw := bytes.Clone(b)
	r := &quotereader.Reader{B: raw, Format: ErrFormat}
	q := &Quote{raw: raw}

	h := &q.Header
	*h = ReadHeader(r)
	if r.Err != nil {
		return nil, r.Err
	}
	switch h.Version {
	case Version3, Version4, Version5:
	default:
		return nil, fmt.Errorf("%w: version %d (want 3, 4 or 5)", ErrUnsupported, h.Version)
	}
	if h.AttKeyType != AttestationKeyECDSAP256 {
		return nil, fmt.Errorf("%w: attestation key type %d (want %d, ECDSA P-256)", ErrUnsupported, h.AttKeyType, AttestationKeyECDSAP256)
	}
	switch {
	case h.TEEType == TEETypeTDX:
		return nil, fmt.Errorf("%w: TDX quote (TEE type 0x81)", ErrUnsupported)
	case h.TEEType != TEETypeSGX:
		return nil, fmt.Errorf("%w: TEE type %#x (want 0, SGX)", ErrUnsupported, h.TEEType)
	}

	if h.Version == Version5 {
		q.BodyType = r.U16("body type")
		size := r.U32("body size")
		if r.Err != nil {
			return nil, r.Err
		}
		if q.BodyType != BodyTypeSGX {
			return nil, fmt.Errorf("%w: v5 body type %d (want %d, SGX report)", ErrUnsupported, q.BodyType, BodyTypeSGX)
		}
		if size != ReportBodySize {
			return nil, fmt.Errorf("%w: v5 SGX body size %d (want %d)", ErrFormat, size, ReportBodySize)
		}
	}
	r.Array(q.Body[:], "report body")
	q.signed = raw[:r.Off]
	sigLen := r.U32("signature data length")
	if r.Err != nil {
		return nil, r.Err
	}
	if rem := r.Remaining(); uint64(sigLen) != uint64(rem) {
		return nil, fmt.Errorf("%w: signature data length %d, but %d bytes follow", ErrFormat, sigLen, rem)
	}
	r.Array(q.Signature[:], "ISV signature")
	r.Array(q.AttestationKey[:], "attestation key")
	if r.Err != nil {
		return nil, r.Err
	}

	if h.Version == Version3 {
		if err := q.parseQEData(r, "quote"); err != nil {
			return nil, err
		}
		if q.CertType < CertTypePPIDCleartext || q.CertType > CertTypePCKChain {
			return nil, fmt.Errorf("%w: v3 certification data type %d (want 1–5)", ErrUnsupported, q.CertType)
		}
		return q, nil
	}

	// v4/v5: the certification data must be type 6, the QE report
	// certification data, which in turn holds the PCK certification data.
	outerType, outer := r.CertData("quote")
	if r.Err != nil {
		return nil, r.Err
	}
	if outerType != CertTypeQEReport {
		return nil, fmt.Errorf("%w: v%d certification data type %d (want 6)", ErrUnsupported, h.Version, outerType)
	}
	if err := q.parseQEData(&quotereader.Reader{B: outer, Format: ErrFormat}, "QE report certification data"); err != nil {
		return nil, err
	}
	if q.CertType < CertTypePPIDCleartext || q.CertType > CertTypePCKChain {
		return nil, fmt.Errorf("%w: certification data type %d inside type 6 (want 1–5)", ErrUnsupported, q.CertType)
	}
	return q, nil
}

// parseQEData reads QE report, QE report signature, QE authentication data
// and certification data, which must end exactly at the end of r.
func (q *Quote) parseQEData(r *quotereader.Reader, where string) error {
	r.Array(q.QEReport[:], "QE report")
	r.Array(q.QEReportSignature[:], "QE report signature")
	authLen := r.U16("QE authentication data size")
	q.QEAuthData = r.Take(int(authLen), "QE authentication data")
	q.CertType, q.CertData = r.CertData(where)
	if r.Err != nil {
		return r.Err
	}
	return nil
}

// PCKChain decodes certification data of type 5: the PEM certificates of the
// PCK leaf, its intermediate CA and the root, in that order. Whitespace
// between and after the blocks and trailing NUL bytes are tolerated; any other
// content is an error. It does not verify the chain.
func (q *Quote) PCKChain() ([]*x509.Certificate, error) {
	if q.CertType != CertTypePCKChain {
		return nil, fmt.Errorf("%w: certification data type %d (want 5, PCK certificate chain)", ErrUnsupported, q.CertType)
	}
	return ParsePEMChain(q.CertData)
}

// ParsePEMChain decodes a sequence of PEM "CERTIFICATE" blocks. Only
// whitespace may surround the blocks; trailing NUL bytes are tolerated.
func ParsePEMChain(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := bytes.TrimRight(data, "\x00")
	for {
		rest = bytes.TrimLeft(rest, " \t\r\n")
		if len(rest) == 0 {
			break
		}
		if !bytes.HasPrefix(rest, []byte("-----BEGIN ")) {
			return nil, fmt.Errorf("%w: certificate chain: unexpected data after certificate %d", ErrFormat, len(certs))
		}
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%w: certificate chain: undecodable PEM block %d", ErrFormat, len(certs)+1)
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			return nil, fmt.Errorf("%w: certificate chain: PEM block %d is %q, want CERTIFICATE", ErrFormat, len(certs)+1, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: certificate chain: certificate %d: %w", ErrFormat, len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%w: certificate chain: no certificates", ErrFormat)
	}
	return certs, nil
}
