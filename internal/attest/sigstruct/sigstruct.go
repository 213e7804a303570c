// Package sigstruct reads an SGX enclave's signature structure (SIGSTRUCT,
// Intel SDM Vol. 3D, "Enclave Signature Structure") and the identity it
// gives the enclave: MRENCLAVE (UniqueID), MRSIGNER (SignerID, the SHA-256
// of the signer's RSA modulus), ISVPRODID (ProductID) and ISVSVN
// (SecurityVersion). It finds the SIGSTRUCT in a Gramine .sig file, in the
// .oeinfo section of an Open Enclave or EGo binary and in the .note.sgxmeta
// section of an Intel SGX SDK enclave (Occlum's libocclum-libos.signed.so),
// and checks its RSA signature. Pure Go; it parses only.
package sigstruct

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
)

// Size is the size of a SIGSTRUCT.
const Size = 1808

// Offsets and sizes of the fields read (little-endian, SDM Vol. 3D table
// "Layout of Enclave Signature Structure").
const (
	offHeader     = 0    // 16 bytes
	offVendor     = 16   // 4
	offDate       = 20   // 4
	offHeader2    = 24   // 16
	offModulus    = 128  // 384
	offExponent   = 512  // 4
	offSignature  = 516  // 384
	offMiscSelect = 900  // 4
	offEnclave    = 960  // 32: ENCLAVEHASH (MRENCLAVE)
	offISVProdID  = 1024 // 2
	offISVSVN     = 1026 // 2
	keySize       = 384  // RSA-3072
)

// header and header2 are the constant fields every SIGSTRUCT starts with.
var (
	header  = []byte{0x06, 0, 0, 0, 0xe1, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0}
	header2 = []byte{0x01, 0x01, 0, 0, 0x60, 0, 0, 0, 0x60, 0, 0, 0, 0x01, 0, 0, 0}
)

var (
	// ErrNotFound means the input holds no SIGSTRUCT.
	ErrNotFound = errors.New("sigstruct: no SGX SIGSTRUCT found")
	// ErrSignature means a SIGSTRUCT was found but its RSA signature does
	// not verify with its own modulus: the enclave is not (validly) signed
	// and would not initialise with these values.
	ErrSignature = errors.New("sigstruct: the SIGSTRUCT's signature does not verify with its modulus")
)

// SigStruct is a parsed SIGSTRUCT.
type SigStruct struct {
	MRENCLAVE [32]byte
	MRSIGNER  [32]byte // SHA-256 of the modulus as stored (little-endian)
	ISVProdID uint16
	ISVSVN    uint16
	Vendor    uint32 // 0x8086 for Intel's enclaves, else 0
	Date      uint32 // BCD yyyymmdd
	raw       []byte
}

// Raw returns the SIGSTRUCT's bytes.
func (s *SigStruct) Raw() []byte { return s.raw }

// Parse parses exactly one SIGSTRUCT.
func Parse(b []byte) (*SigStruct, error) {
	if len(b) != Size {
		return nil, fmt.Errorf("%w: %d bytes, a SIGSTRUCT has %d", ErrNotFound, len(b), Size)
	}
	if !bytes.Equal(b[offHeader:offHeader+16], header) || !bytes.Equal(b[offHeader2:offHeader2+16], header2) {
		return nil, fmt.Errorf("%w: the constant header fields do not match", ErrNotFound)
	}
	s := &SigStruct{
		ISVProdID: binary.LittleEndian.Uint16(b[offISVProdID:]),
		ISVSVN:    binary.LittleEndian.Uint16(b[offISVSVN:]),
		Vendor:    binary.LittleEndian.Uint32(b[offVendor:]),
		Date:      binary.LittleEndian.Uint32(b[offDate:]),
		raw:       bytes.Clone(b),
	}
	copy(s.MRENCLAVE[:], b[offEnclave:offEnclave+32])
	s.MRSIGNER = sha256.Sum256(b[offModulus : offModulus+keySize])
	return s, nil
}

// Find returns the first SIGSTRUCT inside data: at an offset where both
// constant header fields are in place.
func Find(data []byte) (*SigStruct, error) {
	for off := 0; ; {
		i := bytes.Index(data[off:], header)
		if i < 0 {
			return nil, ErrNotFound
		}
		start := off + i
		if start+Size <= len(data) {
			if s, err := Parse(data[start : start+Size]); err == nil {
				return s, nil
			}
		}
		off = start + 1
	}
}

// FromELF returns the SIGSTRUCT of an enclave binary: in its .oeinfo
// section (Open Enclave, EGo) or its .note.sgxmeta section (Intel SGX SDK,
// Occlum). The section's name is returned too.
func FromELF(f *elf.File) (*SigStruct, string, error) {
	for _, name := range []string{".oeinfo", ".note.sgxmeta"} {
		sec := f.Section(name)
		if sec == nil {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			return nil, name, fmt.Errorf("reading section %s: %w", name, err)
		}
		s, err := Find(data)
		if err != nil {
			return nil, name, fmt.Errorf("section %s: %w", name, err)
		}
		return s, name, nil
	}
	return nil, "", fmt.Errorf("%w: the ELF file has neither an .oeinfo nor a .note.sgxmeta section", ErrNotFound)
}

// VerifySignature checks the SIGSTRUCT's RSA-3072 signature (public
// exponent 3, PKCS #1 v1.5 with SHA-256, all numbers little-endian) over
// its first 128 bytes and bytes 900–1027, with its own modulus.
func (s *SigStruct) VerifySignature() error {
	b := s.raw
	if e := binary.LittleEndian.Uint32(b[offExponent:]); e != 3 {
		return fmt.Errorf("%w: exponent %d, SGX requires 3", ErrSignature, e)
	}
	n := new(big.Int).SetBytes(reversed(b[offModulus : offModulus+keySize]))
	sig := new(big.Int).SetBytes(reversed(b[offSignature : offSignature+keySize]))
	if n.Sign() == 0 || sig.Cmp(n) >= 0 {
		return ErrSignature
	}
	em := new(big.Int).Exp(sig, big.NewInt(3), n).FillBytes(make([]byte, keySize))
	want, err := encodePKCS1v15(SignedData(b))
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(em, want) != 1 {
		return ErrSignature
	}
	return nil
}

// SignedData returns the bytes a SIGSTRUCT's signature covers: bytes 0–127
// and 900–1027.
func SignedData(raw []byte) []byte {
	return append(bytes.Clone(raw[:128]), raw[offMiscSelect:offMiscSelect+128]...)
}

// encodePKCS1v15 is the EMSA-PKCS1-v1_5 encoding (RFC 8017, 9.2) of the
// SHA-256 of msg for a 3072-bit modulus.
func encodePKCS1v15(msg []byte) ([]byte, error) {
	// DigestInfo prefix of SHA-256 (RFC 8017, 9.2, note 1).
	prefix := []byte{0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}
	if !crypto.SHA256.Available() {
		return nil, errors.New("sigstruct: SHA-256 unavailable")
	}
	sum := sha256.Sum256(msg)
	t := append(prefix, sum[:]...)
	em := make([]byte, keySize)
	em[1] = 0x01
	for i := 2; i < keySize-len(t)-1; i++ {
		em[i] = 0xff
	}
	copy(em[keySize-len(t):], t)
	return em, nil
}

func reversed(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		out[len(b)-1-i] = c
	}
	return out
}
