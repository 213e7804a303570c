// Package sigstructtest makes SGX SIGSTRUCTs signed with a test key and the
// files they come in (a Gramine .sig is the SIGSTRUCT itself; ELF files with
// an .oeinfo or .note.sgxmeta section), for tests of package sigstruct and
// of 'quarry package-info'.
package sigstructtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"math/big"

	"github.com/quarry-cc/quarry/internal/attest/sigstruct"
)

// Key is an RSA-3072 key with public exponent 3, as SGX requires.
type Key struct {
	n, d *big.Int
}

// Primes of the test key (generated for these tests, p ≡ q ≡ 2 mod 3 so
// that 3 is invertible; not secret).
const (
	testP = "fcf6d3641cd04f2a1c44223016f3d576b1f788bc062179337a5cc488f5c480266706b93c4aa9dfb59ad0e9a71a16fc57" +
		"7491128ba91ca99658b3a424e3dc3eaf6cb7ebdc9f3312526fa109d8752bd4a85c76776b99623ea8372619f89d1549bc" +
		"9057953c45866abde3ee88fbda7bf6872f045ff6abb6cf84491a493c1ccd704b4c7a7dd7e1256c9cb92fa165c8ac4af0" +
		"ad2581dc07a40650bee686184b7b390fb31efc4dd13a5f80fda0c7f2896e53fca5795cd9fec886db544729d06bbf1999"
	testQ = "dc846ca44a6b6b8b36c5076e7d75097538e9cfbebb554d2a45fd9ed218c28e5c6e732e3d975dcfa313d02f1f47425c4f" +
		"01269f9a2e9434eec25cfb9c290d0d38495baadfd9bfca2399f6a1ac65f496de0a507ea37140286bc8054cb6d63292c7" +
		"ba089d1d53e6b87aafa14062f1aa0daa1d47760e3d641c2e89e70ff5dbb9fc8af1d064a9af763224207241b811ba95c1" +
		"e044e5db8745f3652d5534d1d5fe0990473b89134f3f12359626104708bd9b207d5f72017934ddc11bfe6f5d163c2e51"
)

// TestKey returns the fixed test key (generating an exponent-3 key takes
// seconds).
func TestKey() *Key {
	p, _ := new(big.Int).SetString(testP, 16)
	q, _ := new(big.Int).SetString(testQ, 16)
	one := big.NewInt(1)
	phi := new(big.Int).Mul(new(big.Int).Sub(p, one), new(big.Int).Sub(q, one))
	return &Key{n: new(big.Int).Mul(p, q), d: new(big.Int).ModInverse(big.NewInt(3), phi)}
}

// Modulus returns the modulus as a SIGSTRUCT stores it (little-endian).
func (k *Key) Modulus() []byte { return le(k.n.FillBytes(make([]byte, 384))) }

// MRSIGNER is the SHA-256 of Modulus.
func (k *Key) MRSIGNER() [32]byte { return sha256.Sum256(k.Modulus()) }

// Fields are the values of a SIGSTRUCT to make.
type Fields struct {
	MRENCLAVE [32]byte
	ISVProdID uint16
	ISVSVN    uint16
}

// Sign returns a SIGSTRUCT with f's values, signed by k.
func (k *Key) Sign(f Fields) []byte {
	b := make([]byte, sigstruct.Size)
	copy(b[0:], []byte{0x06, 0, 0, 0, 0xe1, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0})
	binary.LittleEndian.PutUint32(b[20:], 0x20250101)
	copy(b[24:], []byte{0x01, 0x01, 0, 0, 0x60, 0, 0, 0, 0x60, 0, 0, 0, 0x01, 0, 0, 0})
	copy(b[128:], k.Modulus())
	binary.LittleEndian.PutUint32(b[512:], 3)
	copy(b[960:], f.MRENCLAVE[:])
	binary.LittleEndian.PutUint16(b[1024:], f.ISVProdID)
	binary.LittleEndian.PutUint16(b[1026:], f.ISVSVN)
	// The signed bytes: the first 128 and bytes 900–1027 (SDM Vol. 3D).
	sum := sha256.Sum256(append(bytes.Clone(b[:128]), b[900:1028]...))
	prefix := []byte{0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}
	em := make([]byte, 384)
	em[1] = 1
	t := append(prefix, sum[:]...)
	for i := 2; i < len(em)-len(t)-1; i++ {
		em[i] = 0xff
	}
	copy(em[len(em)-len(t):], t)
	s := new(big.Int).Exp(new(big.Int).SetBytes(em), k.d, k.n)
	copy(b[516:], le(s.FillBytes(make([]byte, 384))))
	return b
}

func le(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		out[len(b)-1-i] = c
	}
	return out
}

// Section is a section of an ELF file made by ELF.
type Section struct {
	Name string
	Note bool // SHT_NOTE instead of SHT_PROGBITS
	Data []byte
}

// ELF returns a minimal 64-bit little-endian x86-64 ELF shared object with
// the given sections and a section name table (ELF specification: file
// header, section header table).
func ELF(sections ...Section) []byte {
	const ehSize, shSize = 64, 64
	var shstr bytes.Buffer
	shstr.WriteByte(0)
	names := make([]uint32, len(sections))
	for i, s := range sections {
		names[i] = uint32(shstr.Len())
		shstr.WriteString(s.Name)
		shstr.WriteByte(0)
	}
	shstrName := uint32(shstr.Len())
	shstr.WriteString(".shstrtab")
	shstr.WriteByte(0)

	var body bytes.Buffer
	body.Write(make([]byte, ehSize))
	offsets := make([]uint64, len(sections))
	for i, s := range sections {
		offsets[i] = uint64(body.Len())
		body.Write(s.Data)
	}
	shstrOff := uint64(body.Len())
	body.Write(shstr.Bytes())
	for body.Len()%8 != 0 {
		body.WriteByte(0)
	}
	shoff := uint64(body.Len())

	sh := func(name, typ uint32, off, size uint64) {
		var h [shSize]byte
		binary.LittleEndian.PutUint32(h[0:], name)
		binary.LittleEndian.PutUint32(h[4:], typ)
		binary.LittleEndian.PutUint64(h[24:], off)
		binary.LittleEndian.PutUint64(h[32:], size)
		binary.LittleEndian.PutUint64(h[48:], 1) // alignment
		body.Write(h[:])
	}
	sh(0, 0, 0, 0) // the null section
	for i, s := range sections {
		typ := uint32(1) // SHT_PROGBITS
		if s.Note {
			typ = 7 // SHT_NOTE
		}
		sh(names[i], typ, offsets[i], uint64(len(s.Data)))
	}
	sh(shstrName, 3, shstrOff, uint64(shstr.Len())) // SHT_STRTAB

	out := body.Bytes()
	copy(out[0:], []byte{0x7f, 'E', 'L', 'F', 2, 1, 1})
	binary.LittleEndian.PutUint16(out[16:], 3)  // ET_DYN
	binary.LittleEndian.PutUint16(out[18:], 62) // EM_X86_64
	binary.LittleEndian.PutUint32(out[20:], 1)  // EV_CURRENT
	binary.LittleEndian.PutUint64(out[40:], shoff)
	binary.LittleEndian.PutUint16(out[52:], ehSize)
	binary.LittleEndian.PutUint16(out[54:], 56) // program header entry size
	binary.LittleEndian.PutUint16(out[58:], shSize)
	binary.LittleEndian.PutUint16(out[60:], uint16(len(sections)+2))
	binary.LittleEndian.PutUint16(out[62:], uint16(len(sections)+1))
	return out
}
