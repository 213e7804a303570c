// Package tdxquote parses Intel TDX DCAP quotes: version 4 with a TD 1.0
// report body and version 5 with a body descriptor (TD 1.0 or TD 1.5), TEE
// type 0x81. Parsing is bounded by the input, checks every declared size
// exactly and never panics. Zero padding after the quote's declared end is
// tolerated (Intel's parser ignores trailing bytes and real quotes carry
// zero padding); any other trailing byte is rejected. It does not verify
// anything; see package dcap.
package tdxquote

import (
	"bytes"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/quarry-cc/quarry/internal/attest/quotereader"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

// Sizes of the TDX-specific parts of a quote.
const (
	HeaderSize         = sgxquote.HeaderSize // 48
	TDReport10Size     = 584                 // TD report body 1.0
	TDReport15Size     = 648                 // TD report body 1.5
	BodyDescriptorSize = 6                   // v5: u16 body type, u32 body size
	MeasurementSize    = 48                  // SHA-384 registers (MRTD, RTMRs, …)
	MaxQuoteSize       = 1 << 16             // bound on a quote; real ones are ~5 KB
)

// Quote versions with a TD report.
const (
	Version4 = 4
	Version5 = 5
)

// TEETypeTDX is the header's TEE type of a TDX quote.
const TEETypeTDX = sgxquote.TEETypeTDX

// v5 body types (v4 quotes carry an implicit TD 1.0 body, BodyTypeTD10).
const (
	BodyTypeSGX  = 1
	BodyTypeTD10 = 2
	BodyTypeTD15 = 3
)

var (
	// ErrFormat means the input is not a well-formed TDX quote.
	ErrFormat = errors.New("tdxquote: malformed quote")
	// ErrUnsupported means the input is well-formed but not a TDX quote
	// this package handles (version, key type, TEE type, body or
	// certification data type).
	ErrUnsupported = errors.New("tdxquote: unsupported quote")
)

// IsTDX reports whether b starts like a TDX quote: version 4 or 5 and TEE
// type 0x81. It looks at the header only.
func IsTDX(b []byte) bool {
	if len(b) < 8 {
		return false
	}
	v := binary.LittleEndian.Uint16(b)
	return (v == Version4 || v == Version5) && binary.LittleEndian.Uint32(b[4:]) == TEETypeTDX
}

// TDReport is a TD report body (TD 1.0, or TD 1.5 with TEETCBSVN2 and
// MRSERVICETD). Integers inside the byte arrays are little-endian.
type TDReport struct {
	TEETCBSVN      [16]byte
	MRSEAM         [MeasurementSize]byte
	MRSIGNERSEAM   [MeasurementSize]byte
	SEAMAttributes [8]byte
	TDAttributes   [8]byte
	XFAM           [8]byte
	MRTD           [MeasurementSize]byte
	MRCONFIGID     [MeasurementSize]byte
	MROWNER        [MeasurementSize]byte
	MROWNERCONFIG  [MeasurementSize]byte
	RTMR           [4][MeasurementSize]byte
	ReportData     [64]byte
	// TD 1.5 only (zero in TD 1.0).
	TEETCBSVN2  [16]byte
	MRSERVICETD [MeasurementSize]byte
}

// TD attribute bits (Intel TDX Module ABI specification, TDATTRIBUTES).
const (
	// TDAttributeDebug is bit 0, DEBUG: the host may read and write the
	// TD's private memory and state.
	TDAttributeDebug = 1 << 0
	// TDAttributesDebugGroup are bits 7:0, the "TD under debug" group:
	// DEBUG and bits reserved for other debug features. A TD with any of
	// them set is not trustworthy, so any of them makes a debug TD.
	TDAttributesDebugGroup = 0xff
	// TDAttributeSEPTVEDisable is bit 28, SEPT_VE_DISABLE: EPT violations
	// on pending private pages do not raise #VE in the TD.
	TDAttributeSEPTVEDisable = 1 << 28
)

// TDAttributesValue returns TDATTRIBUTES as a number.
func (r *TDReport) TDAttributesValue() uint64 { return binary.LittleEndian.Uint64(r.TDAttributes[:]) }

// XFAMValue returns XFAM as a number.
func (r *TDReport) XFAMValue() uint64 { return binary.LittleEndian.Uint64(r.XFAM[:]) }

// Debug reports whether the TD is a debug TD: any bit of the "TD under
// debug" group (TDATTRIBUTES bits 7:0, TDAttributesDebugGroup) is set, not
// only DEBUG (bit 0).
func (r *TDReport) Debug() bool { return r.TDAttributesValue()&TDAttributesDebugGroup != 0 }

// ModuleMajor returns the TDX module's major version (TEE_TCB_SVN[1]).
func (r *TDReport) ModuleMajor() uint8 { return r.TEETCBSVN[1] }

// ModuleSVN returns the TDX module's SVN (TEE_TCB_SVN[0]).
func (r *TDReport) ModuleSVN() uint8 { return r.TEETCBSVN[0] }

func (r *TDReport) parse(rd *quotereader.Reader, size int) {
	rd.Array(r.TEETCBSVN[:], "TEE_TCB_SVN")
	rd.Array(r.MRSEAM[:], "MRSEAM")
	rd.Array(r.MRSIGNERSEAM[:], "MRSIGNERSEAM")
	rd.Array(r.SEAMAttributes[:], "SEAMATTRIBUTES")
	rd.Array(r.TDAttributes[:], "TDATTRIBUTES")
	rd.Array(r.XFAM[:], "XFAM")
	rd.Array(r.MRTD[:], "MRTD")
	rd.Array(r.MRCONFIGID[:], "MRCONFIGID")
	rd.Array(r.MROWNER[:], "MROWNER")
	rd.Array(r.MROWNERCONFIG[:], "MROWNERCONFIG")
	for i := range r.RTMR {
		rd.Array(r.RTMR[i][:], fmt.Sprintf("RTMR%d", i))
	}
	rd.Array(r.ReportData[:], "REPORTDATA")
	if size == TDReport15Size {
		rd.Array(r.TEETCBSVN2[:], "TEE_TCB_SVN2")
		rd.Array(r.MRSERVICETD[:], "MRSERVICETD")
	}
}

// Marshal returns the body's bytes: 584 for TD 1.0, 648 for TD 1.5.
func (r *TDReport) Marshal(bodyType uint16) []byte {
	var b []byte
	for _, f := range [][]byte{r.TEETCBSVN[:], r.MRSEAM[:], r.MRSIGNERSEAM[:], r.SEAMAttributes[:], r.TDAttributes[:],
		r.XFAM[:], r.MRTD[:], r.MRCONFIGID[:], r.MROWNER[:], r.MROWNERCONFIG[:],
		r.RTMR[0][:], r.RTMR[1][:], r.RTMR[2][:], r.RTMR[3][:], r.ReportData[:]} {
		b = append(b, f...)
	}
	if bodyType == BodyTypeTD15 {
		b = append(b, r.TEETCBSVN2[:]...)
		b = append(b, r.MRSERVICETD[:]...)
	}
	return b
}

// Quote is a parsed TDX quote. It holds its own copy of the input. Byte
// slices it returns must not be modified.
type Quote struct {
	Header sgxquote.Header
	// BodyType is BodyTypeTD10 or BodyTypeTD15 (v4: always TD10).
	BodyType uint16
	// Body is the TD report.
	Body TDReport
	// Signature is the attestation key's ECDSA signature over SignedData.
	Signature [sgxquote.SignatureSize]byte
	// AttestationKey is the attestation public key X‖Y.
	AttestationKey [sgxquote.PublicKeySize]byte
	// QEReport is the TD quoting enclave's report body.
	QEReport sgxquote.ReportBody
	// QEReportSignature is the PCK key's signature over QEReport.
	QEReportSignature [sgxquote.SignatureSize]byte
	// QEAuthData is the QE authentication data bound into QEReport.
	QEAuthData []byte
	// CertType and CertData are the certification data inside type 6.
	CertType uint16
	CertData []byte
	// Padding is the number of zero bytes after the quote's declared end
	// that were ignored.
	Padding int

	raw    []byte
	signed []byte
}

// Raw returns the quote up to its declared end (without padding).
func (q *Quote) Raw() []byte { return q.raw }

// SignedData returns the bytes the attestation key signs: header and body
// (v4), or header, body descriptor and body (v5).
func (q *Quote) SignedData() []byte { return q.signed }

// PCKChain decodes certification data of type 5 (PCK leaf, intermediate,
// root). It does not verify the chain.
func (q *Quote) PCKChain() ([]*x509.Certificate, error) {
	if q.CertType != sgxquote.CertTypePCKChain {
		return nil, fmt.Errorf("%w: certification data type %d (want 5, PCK certificate chain)", ErrUnsupported, q.CertType)
	}
	certs, err := sgxquote.ParsePEMChain(q.CertData)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	return certs, nil
}

// Parse parses a raw TDX quote.
func Parse(b []byte) (*Quote, error) {
	if len(b) > MaxQuoteSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrFormat, len(b), MaxQuoteSize)
	}
	raw := bytes.Clone(b)
	r := &quotereader.Reader{B: raw, Format: ErrFormat}
	q := &Quote{}
	h := &q.Header
	*h = sgxquote.ReadHeader(r)
	if r.Err != nil {
		return nil, r.Err
	}
	if h.Version != Version4 && h.Version != Version5 {
		return nil, fmt.Errorf("%w: version %d (want 4 or 5 for TDX)", ErrUnsupported, h.Version)
	}
	if h.AttKeyType != sgxquote.AttestationKeyECDSAP256 {
		return nil, fmt.Errorf("%w: attestation key type %d (want %d, ECDSA P-256)", ErrUnsupported, h.AttKeyType, sgxquote.AttestationKeyECDSAP256)
	}
	if h.TEEType != TEETypeTDX {
		return nil, fmt.Errorf("%w: TEE type %#x (want 0x81, TDX)", ErrUnsupported, h.TEEType)
	}

	size := TDReport10Size
	q.BodyType = BodyTypeTD10
	if h.Version == Version5 {
		q.BodyType = r.U16("body type")
		declared := r.U32("body size")
		if r.Err != nil {
			return nil, r.Err
		}
		switch q.BodyType {
		case BodyTypeTD10:
		case BodyTypeTD15:
			size = TDReport15Size
		default:
			return nil, fmt.Errorf("%w: v5 body type %d under TEE type TDX (want 2, TD 1.0, or 3, TD 1.5)", ErrUnsupported, q.BodyType)
		}
		if uint64(declared) != uint64(size) {
			return nil, fmt.Errorf("%w: v5 body type %d with size %d (want %d)", ErrFormat, q.BodyType, declared, size)
		}
	}
	q.Body.parse(r, size)
	if r.Err != nil {
		return nil, r.Err
	}
	q.signed = raw[:r.Off:r.Off]
	sigLen := r.U32("signature data length")
	if r.Err != nil {
		return nil, r.Err
	}
	if uint64(sigLen) > uint64(r.Remaining()) {
		return nil, fmt.Errorf("%w: signature data length %d, but only %d bytes follow", ErrFormat, sigLen, r.Remaining())
	}
	end := r.Off + int(sigLen)
	for i, c := range raw[end:] {
		if c != 0 {
			return nil, fmt.Errorf("%w: non-zero byte %#02x at offset %d after the quote's declared end %d", ErrFormat, c, end+i, end)
		}
	}
	q.Padding = len(raw) - end
	raw = raw[:end:end]
	q.raw = raw
	r.B = raw

	r.Array(q.Signature[:], "quote signature")
	r.Array(q.AttestationKey[:], "attestation key")
	outerType, outer := r.CertData("quote")
	if r.Err != nil {
		return nil, r.Err
	}
	if outerType != sgxquote.CertTypeQEReport {
		return nil, fmt.Errorf("%w: v%d certification data type %d (want 6, QE report certification data)", ErrUnsupported, h.Version, outerType)
	}
	in := &quotereader.Reader{B: outer, Format: ErrFormat}
	in.Array(q.QEReport[:], "QE report")
	in.Array(q.QEReportSignature[:], "QE report signature")
	authLen := in.U16("QE authentication data size")
	q.QEAuthData = in.Take(int(authLen), "QE authentication data")
	q.CertType, q.CertData = in.CertData("QE report certification data")
	if in.Err != nil {
		return nil, in.Err
	}
	if q.CertType < sgxquote.CertTypePPIDCleartext || q.CertType > sgxquote.CertTypePCKChain {
		return nil, fmt.Errorf("%w: certification data type %d inside type 6 (want 1–5)", ErrUnsupported, q.CertType)
	}
	return q, nil
}

// Compact returns the quote without its padding and with what no
// signature covers cut from its certification data (sgxquote.Compact):
// the PCK certificate chain in canonical PEM, sizes adjusted. The result
// verifies as the quote does and is never longer than Raw.
func (q *Quote) Compact() []byte {
	return sgxquote.CompactCertData(q.raw, len(q.signed), true, q.CertType, q.CertData)
}
