package sgxquote

import (
	"bytes"
	"encoding/binary"
	"encoding/pem"
)

// Offsets inside the signature data (after its u32 length) of the
// certification data of type 6 (v4, v5, TDX): the ISV signature and the
// attestation key come first, then the type (u16) and the size (u32).
const nestedCertSizeOffset = 4 + SignatureSize + PublicKeySize + 2

// Compact returns the quote with what no signature covers cut from its
// certification data: a PCK certificate chain (type 5) becomes its
// certificates in canonical PEM (64-character lines), followed by the NUL
// byte DCAP ends it with if it had one, so padding or whitespace that a
// sender added is gone; the declared sizes are adjusted. The signed parts
// and the certificates stay byte for byte, so the result verifies as the
// quote does. A quote whose chain is already canonical (what DCAP makes),
// or without a type-5 chain, is returned as Raw. It never returns more
// bytes than Raw.
func (q *Quote) Compact() []byte {
	return CompactCertData(q.raw, len(q.signed), q.Header.Version >= Version4, q.CertType, q.CertData)
}

// CompactCertData implements Compact for a parsed quote of either kind
// (SGX or TDX): raw is the whole quote, which ends with its certification
// data cd of type certType; signedLen is the length of the signed part,
// after which the signature data's length follows; nested says the
// certification data lies inside type 6 (v4 and later).
func CompactCertData(raw []byte, signedLen int, nested bool, certType uint16, cd []byte) []byte {
	keep := canonicalChain(certType, cd)
	cut := len(cd) - len(keep)
	if keep == nil || cut <= 0 || len(raw) < signedLen+4 {
		return raw
	}
	out := make([]byte, 0, len(raw)-cut)
	out = append(out, raw[:len(raw)-len(cd)]...)
	out = append(out, keep...)
	shrink := func(off int) {
		binary.LittleEndian.PutUint32(out[off:], binary.LittleEndian.Uint32(out[off:])-uint32(cut))
	}
	shrink(signedLen) // the signature data length
	if nested {
		shrink(signedLen + nestedCertSizeOffset) // the size of type 6
	}
	shrink(len(out) - len(keep) - 4) // the size of the chain
	return out
}

// canonicalChain returns certification data of type 5 re-encoded from its
// certificates, or nil when it is of another type or does not decode.
func canonicalChain(certType uint16, cd []byte) []byte {
	if certType != CertTypePCKChain {
		return nil
	}
	certs, err := ParsePEMChain(cd)
	if err != nil {
		return nil
	}
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	if bytes.HasSuffix(cd, []byte{0}) {
		out = append(out, 0)
	}
	return out
}
