package sigstruct_test

import (
	"bytes"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"debug/elf"
	"errors"
	"math/big"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/sigstruct"
	"github.com/quarry-cc/quarry/internal/attest/sigstruct/sigstructtest"
)

func testKey(*testing.T) *sigstructtest.Key { return sigstructtest.TestKey() }

var fields = sigstructtest.Fields{MRENCLAVE: [32]byte{0xde, 0xad, 31: 0x01}, ISVProdID: 0x0102, ISVSVN: 0x0304}

func checkFields(t *testing.T, s *sigstruct.SigStruct, k *sigstructtest.Key) {
	t.Helper()
	if s.MRENCLAVE != fields.MRENCLAVE || s.ISVProdID != 0x0102 || s.ISVSVN != 0x0304 {
		t.Errorf("MRENCLAVE %x ISVPRODID %#x ISVSVN %#x, want %x %#x %#x", s.MRENCLAVE, s.ISVProdID, s.ISVSVN, fields.MRENCLAVE, fields.ISVProdID, fields.ISVSVN)
	}
	if want := sha256.Sum256(k.Modulus()); s.MRSIGNER != want {
		t.Errorf("MRSIGNER %x, want the SHA-256 of the little-endian modulus %x", s.MRSIGNER, want)
	}
	if err := s.VerifySignature(); err != nil {
		t.Errorf("signature: %v", err)
	}
}

func TestParseAndVerify(t *testing.T) {
	k := testKey(t)
	raw := k.Sign(fields)
	s, err := sigstruct.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, s, k)

	// The same signature through Go's RSA verification: the encoding and
	// byte order are the standard ones.
	be := func(b []byte) []byte {
		out := make([]byte, len(b))
		for i, c := range b {
			out[len(b)-1-i] = c
		}
		return out
	}
	pub := &rsa.PublicKey{N: new(big.Int).SetBytes(be(raw[128:512])), E: 3}
	sum := sha256.Sum256(append(bytes.Clone(raw[:128]), raw[900:1028]...))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], be(raw[516:900])); err != nil {
		t.Errorf("crypto/rsa: %v", err)
	}

	// Any change to a signed field breaks the signature; the values read
	// are still those of the bytes.
	for name, off := range map[string]int{"MRENCLAVE": 960, "ISVSVN": 1026, "ISVPRODID": 1024, "date": 20, "MISCSELECT": 900} {
		bad := bytes.Clone(raw)
		bad[off] ^= 1
		s, err := sigstruct.Parse(bad)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := s.VerifySignature(); !errors.Is(err, sigstruct.ErrSignature) {
			t.Errorf("%s changed: %v, want ErrSignature", name, err)
		}
	}
	// Another key's modulus: another MRSIGNER, and the signature fails.
	other := bytes.Clone(raw)
	other[128] ^= 0x80
	if s, _ := sigstruct.Parse(other); s.MRSIGNER == sha256.Sum256(k.Modulus()) || s.VerifySignature() == nil {
		t.Error("a changed modulus kept the MRSIGNER or the signature")
	}
	// An exponent other than 3.
	e := bytes.Clone(raw)
	e[512] = 65
	if s, _ := sigstruct.Parse(e); !errors.Is(s.VerifySignature(), sigstruct.ErrSignature) {
		t.Error("exponent 65 accepted")
	}
}

func TestParseRefuses(t *testing.T) {
	raw := testKey(t).Sign(fields)
	for name, b := range map[string][]byte{
		"short":           raw[:sigstruct.Size-1],
		"long":            append(bytes.Clone(raw), 0),
		"header":          func() []byte { b := bytes.Clone(raw); b[0] = 7; return b }(),
		"second header":   func() []byte { b := bytes.Clone(raw); b[24] = 2; return b }(),
		"zeros":           make([]byte, sigstruct.Size),
		"header, no more": raw[:16],
	} {
		if _, err := sigstruct.Parse(b); !errors.Is(err, sigstruct.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", name, err)
		}
	}
}

func TestFind(t *testing.T) {
	k := testKey(t)
	raw := k.Sign(fields)
	// A decoy header without the second header field comes first, as
	// metadata may hold the same bytes by chance.
	decoy := append([]byte{0x06, 0, 0, 0, 0xe1, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0}, make([]byte, 40)...)
	data := append(append(append([]byte("metadata before"), decoy...), raw...), "after"...)
	s, err := sigstruct.Find(data)
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, s, k)
	if _, err := sigstruct.Find(append(decoy, raw[:sigstruct.Size-1]...)); !errors.Is(err, sigstruct.ErrNotFound) {
		t.Errorf("a truncated SIGSTRUCT: %v", err)
	}
}

func TestFromELF(t *testing.T) {
	k := testKey(t)
	raw := k.Sign(fields)
	for _, tc := range []struct {
		name    string
		file    []byte
		section string
	}{
		{"EGo / Open Enclave", sigstructtest.ELF(sigstructtest.Section{Name: ".text", Data: []byte{0xc3}},
			sigstructtest.Section{Name: ".oeinfo", Data: append(make([]byte, 100), raw...)}), ".oeinfo"},
		{"SGX SDK / Occlum", sigstructtest.ELF(sigstructtest.Section{Name: ".note.sgxmeta", Note: true, Data: append([]byte("sgx_metadata\x00\x00\x00\x00"), raw...)}), ".note.sgxmeta"},
	} {
		f, err := elf.NewFile(bytes.NewReader(tc.file))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		s, sec, err := sigstruct.FromELF(f)
		if err != nil || sec != tc.section {
			t.Fatalf("%s: section %q, %v", tc.name, sec, err)
		}
		checkFields(t, s, k)
	}
	f, err := elf.NewFile(bytes.NewReader(sigstructtest.ELF(sigstructtest.Section{Name: ".text", Data: raw})))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := sigstruct.FromELF(f); !errors.Is(err, sigstruct.ErrNotFound) {
		t.Errorf("an ELF without enclave sections: %v", err)
	}
	f, _ = elf.NewFile(bytes.NewReader(sigstructtest.ELF(sigstructtest.Section{Name: ".oeinfo", Data: make([]byte, 4096)})))
	if _, _, err := sigstruct.FromELF(f); !errors.Is(err, sigstruct.ErrNotFound) {
		t.Errorf("an unsigned enclave (.oeinfo of zeros): %v", err)
	}
}
