package secrets

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/quarry-cc/quarry/manifest"
)

func TestUUIDString(t *testing.T) {
	u := UUID{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
	if got, want := u.String(), "00112233-4455-6677-8899-aabbccddeeff"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got, want := (UUID{}).String(), "00000000-0000-0000-0000-000000000000"; got != want {
		t.Errorf("zero String() = %q, want %q", got, want)
	}
}

// rfc5869 is an independent HKDF-SHA256 (RFC 5869 §2.2, §2.3) written from
// the RFC with crypto/hmac, to cross-check the derivation.
func rfc5869(ikm, salt, info []byte, length int) []byte {
	ext := hmac.New(sha256.New, salt)
	ext.Write(ikm)
	prk := ext.Sum(nil)
	var okm, t []byte
	for i := byte(1); len(okm) < length; i++ {
		exp := hmac.New(sha256.New, prk)
		exp.Write(t)
		exp.Write(info)
		exp.Write([]byte{i})
		t = exp.Sum(nil)
		okm = append(okm, t...)
	}
	return okm[:length]
}

func TestRFC5869Helper(t *testing.T) {
	// RFC 5869 Appendix A.1 (test case 1).
	ikm, _ := hex.DecodeString("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b")
	salt, _ := hex.DecodeString("000102030405060708090a0b0c")
	info, _ := hex.DecodeString("f0f1f2f3f4f5f6f7f8f9")
	want := "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
	if got := hex.EncodeToString(rfc5869(ikm, salt, info, 42)); got != want {
		t.Fatalf("helper OKM = %s, want %s", got, want)
	}
}

func TestDerivePerMarble(t *testing.T) {
	root := bytes.Repeat([]byte{0x5a}, 32)
	def := manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 256}
	id := UUID{0xde, 0xad, 0xbe, 0xef, 0, 1, 0x40, 2, 0x80, 3, 4, 5, 6, 7, 8, 9}
	b := Binding{UUID: id, Marble: "backend"}

	s, err := DerivePerMarble(root, "dbkey", def, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Private) != 32 || !bytes.Equal(s.Private, s.Public) || s.Cert != nil || !s.IsSet() {
		t.Fatalf("derived secret = %+v", s)
	}
	if s.Type != def.Type || s.Size != def.Size || s.Shared {
		t.Errorf("definition fields = %+v", s)
	}
	want := rfc5869(root, []byte("deadbeef-0001-4002-8003-040506070809dbkey"), []byte("backend"), 32)
	if !bytes.Equal(s.Private, want) {
		t.Errorf("key = %x, want %x (HKDF-SHA256 of docs/design/behaviour.md#secret-generation)", s.Private, want)
	}

	// Determinism: the same inputs give the same key, every time.
	for range 5 {
		again, err := DerivePerMarble(root, "dbkey", def, b)
		if err != nil || !bytes.Equal(again.Private, s.Private) {
			t.Fatalf("second derivation differs: %x, %v", again.Private, err)
		}
	}

	// Every input matters, except the Marble name when binding is disabled.
	other := map[string]func() (Secret, error){
		"uuid": func() (Secret, error) {
			c := b
			c.UUID[15] ^= 1
			return DerivePerMarble(root, "dbkey", def, c)
		},
		"marble": func() (Secret, error) {
			c := b
			c.Marble = "frontend"
			return DerivePerMarble(root, "dbkey", def, c)
		},
		"secret name": func() (Secret, error) { return DerivePerMarble(root, "dbkey2", def, b) },
		"root secret": func() (Secret, error) { return DerivePerMarble(bytes.Repeat([]byte{0xa5}, 32), "dbkey", def, b) },
	}
	for what, derive := range other {
		o, err := derive()
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(o.Private, s.Private) {
			t.Errorf("changing the %s did not change the key", what)
		}
	}

	unbound := Binding{UUID: id, Marble: "backend", DisableSecretBinding: true}
	u1, err := DerivePerMarble(root, "dbkey", def, unbound)
	if err != nil {
		t.Fatal(err)
	}
	unbound.Marble = "frontend"
	u2, err := DerivePerMarble(root, "dbkey", def, unbound)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(u1.Private, u2.Private) {
		t.Error("with DisableSecretBinding the Marble name changed the key")
	}
	if want := rfc5869(root, []byte("deadbeef-0001-4002-8003-040506070809dbkey"), nil, 32); !bytes.Equal(u1.Private, want) {
		t.Errorf("unbound key = %x, want %x (empty info)", u1.Private, want)
	}
	if bytes.Equal(u1.Private, s.Private) {
		t.Error("bound and unbound keys are equal")
	}

	// Lengths follow Size.
	for _, size := range []uint{8, 128, 512, MaxPerMarbleSymmetricBits} {
		d, err := DerivePerMarble(root, "k", manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: size}, b)
		if err != nil || uint(len(d.Private)) != size/8 {
			t.Errorf("size %d: len = %d, err = %v", size, len(d.Private), err)
		}
	}
}

func TestDerivePerMarbleErrors(t *testing.T) {
	root := []byte("0123456789abcdef0123456789abcdef")
	tests := []struct {
		name    string
		root    []byte
		def     manifest.Secret
		wantErr error
	}{
		{"not symmetric", root, manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 256}, ErrInvalid},
		{"size 0", root, manifest.Secret{Type: manifest.SecretTypeSymmetric}, ErrInvalid},
		{"size not a multiple of 8", root, manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 12}, ErrInvalid},
		{"beyond HKDF", root, manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: MaxPerMarbleSymmetricBits + 8}, ErrInvalid},
		{"no root secret", nil, manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 128}, ErrNoRootSecret},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DerivePerMarble(tt.root, "k", tt.def, Binding{Marble: "m"})
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("error = %v, want %v", err, tt.wantErr)
			}
			var se *Error
			if !errors.As(err, &se) || se.Secret != "k" {
				t.Errorf("error %v does not name secret k", err)
			}
		})
	}
}
