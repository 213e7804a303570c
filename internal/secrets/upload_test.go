package secrets

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/testpki"
	"github.com/quarry-cc/quarry/manifest"
)

// keyPair is a test key with a self-signed certificate and its encodings.
type keyPair struct {
	cert   []byte // DER
	pkcs8  []byte
	pkix   []byte
	legacy []byte // PKCS#1 (RSA) or SEC1 (ECDSA); nil for Ed25519
}

func newKeyPair(key crypto.Signer) (keyPair, error) {
	var kp keyPair
	var err error
	// A nil TB: a failure panics, which fails the test that asked.
	kp.cert = testpki.SelfSigned(nil, "uploaded", testpki.Key(key), testpki.Serial(1),
		testpki.Valid(testNow, testNow.Add(24*time.Hour))).DER()
	if kp.pkcs8, err = x509.MarshalPKCS8PrivateKey(key); err != nil {
		return kp, err
	}
	if kp.pkix, err = x509.MarshalPKIXPublicKey(key.Public()); err != nil {
		return kp, err
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		kp.legacy = x509.MarshalPKCS1PrivateKey(k)
	case *ecdsa.PrivateKey:
		if kp.legacy, err = x509.MarshalECPrivateKey(k); err != nil {
			return kp, err
		}
	}
	return kp, nil
}

// uploadKeys are generated once per test binary.
var uploadKeys = sync.OnceValues(func() (map[string]keyPair, error) {
	gen := map[string]func() (crypto.Signer, error){
		"p256":     func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) },
		"p256-b":   func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) },
		"p384":     func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P384(), rand.Reader) },
		"rsa1024":  func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 1024) },
		"rsa2048":  func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 2048) },
		"ed25519":  func() (crypto.Signer, error) { _, k, err := ed25519.GenerateKey(rand.Reader); return k, err },
		"ed2551-b": func() (crypto.Signer, error) { _, k, err := ed25519.GenerateKey(rand.Reader); return k, err },
	}
	out := map[string]keyPair{}
	for name, g := range gen {
		k, err := g()
		if err != nil {
			return nil, err
		}
		if out[name], err = newKeyPair(k); err != nil {
			return nil, err
		}
	}
	return out, nil
})

func TestApplyUpload(t *testing.T) {
	keys, err := uploadKeys()
	if err != nil {
		t.Fatal(err)
	}
	p256, p256b, p384 := keys["p256"], keys["p256-b"], keys["p384"]
	rsa1024, rsa2048 := keys["rsa1024"], keys["rsa2048"]
	ed, edb := keys["ed25519"], keys["ed2551-b"]

	def := func(typ string, size uint) Secret {
		return Secret{Type: typ, Size: size, UserDefined: true, Shared: true, ValidFor: 9}
	}
	sym128 := def(manifest.SecretTypeSymmetric, 128)
	plain := def(manifest.SecretTypePlain, 0)
	ecdsa256 := def(manifest.SecretTypeCertECDSA, 256)
	ecdsaAny := def(manifest.SecretTypeCertECDSA, 0)
	rsaS2048 := def(manifest.SecretTypeCertRSA, 2048)
	rsaAny := def(manifest.SecretTypeCertRSA, 0)
	ed0 := def(manifest.SecretTypeCertED25519, 0)
	key16 := bytes.Repeat([]byte{7}, 16)

	tests := []struct {
		name    string
		current Secret
		upload  Upload
		want    Secret // on success; the definition fields must be kept
		wantErr string // a part of the message; "" for success
	}{
		// Only user-defined secrets.
		{"not user-defined", Secret{Type: manifest.SecretTypeSymmetric, Size: 128, Shared: true}, Upload{Key: key16}, Secret{}, "secret s is not writeable"},
		{"per-marble not user-defined", Secret{Type: manifest.SecretTypeCertECDSA, Size: 256}, Upload{Cert: p256.cert}, Secret{}, "secret s is not writeable"},
		{"unknown type", Secret{Type: "bogus", UserDefined: true}, Upload{Key: key16}, Secret{}, "unknown type: bogus for secret: s"},

		// Both groups.
		{"key and cert", ecdsa256, Upload{Key: key16, Cert: p256.cert}, Secret{}, "either a key alone, or a certificate with its private and/or public key, not both"},
		{"key and private", sym128, Upload{Key: key16, Private: p256.pkcs8}, Secret{}, "not both"},
		{"key and public", plain, Upload{Key: key16, Public: p256.pkix}, Secret{}, "not both"},

		// symmetric-key.
		{"symmetric", sym128, Upload{Key: key16}, withValues(sym128, nil, key16, key16), ""},
		{"symmetric too short", sym128, Upload{Key: key16[:15]}, Secret{}, "declared size and actual size don't match: s"},
		{"symmetric too long", sym128, Upload{Key: append(key16, 1)}, Secret{}, "declared size and actual size don't match: s"},
		{"symmetric empty", sym128, Upload{}, Secret{}, "declared size and actual size don't match: s"},
		{"symmetric with cert", sym128, Upload{Cert: p256.cert}, Secret{}, "secret s is set to be of type symmetric-key but specified values for a certificate"},
		{"symmetric with private", sym128, Upload{Private: p256.pkcs8}, Secret{}, "type symmetric-key but specified values for a certificate"},
		{"symmetric with size 0", def(manifest.SecretTypeSymmetric, 0), Upload{Key: key16}, Secret{}, "invalid secret size: s"},
		{"symmetric with odd size", def(manifest.SecretTypeSymmetric, 12), Upload{Key: key16}, Secret{}, "invalid secret size: s"},

		// plain.
		{"plain", plain, Upload{Key: []byte("hello\x00world")}, withValues(plain, nil, []byte("hello\x00world"), []byte("hello\x00world")), ""},
		{"plain empty", plain, Upload{Key: []byte{}}, withValues(plain, nil, []byte{}, []byte{}), ""},
		{"plain absent key", plain, Upload{}, withValues(plain, nil, []byte{}, []byte{}), ""},
		{"plain with size ignored", def(manifest.SecretTypePlain, 64), Upload{Key: []byte("x")}, withValues(def(manifest.SecretTypePlain, 64), nil, []byte("x"), []byte("x")), ""},
		{"plain with cert", plain, Upload{Cert: p256.cert}, Secret{}, "secret s is set to be of type plain but specified values for a certificate"},
		{"plain with public", plain, Upload{Public: p256.pkix}, Secret{}, "type plain but specified values for a certificate"},

		// cert-ecdsa.
		{"ecdsa cert only", ecdsa256, Upload{Cert: p256.cert}, withValues(ecdsa256, p256.cert, nil, p256.pkix), ""},
		{"ecdsa cert and private", ecdsa256, Upload{Cert: p256.cert, Private: p256.pkcs8}, withValues(ecdsa256, p256.cert, p256.pkcs8, p256.pkix), ""},
		{"ecdsa cert and public", ecdsa256, Upload{Cert: p256.cert, Public: p256.pkix}, withValues(ecdsa256, p256.cert, nil, p256.pkix), ""},
		{"ecdsa cert, private and public", ecdsa256, Upload{Cert: p256.cert, Private: p256.pkcs8, Public: p256.pkix}, withValues(ecdsa256, p256.cert, p256.pkcs8, p256.pkix), ""},
		{"ecdsa mismatched private", ecdsa256, Upload{Cert: p256.cert, Private: p256b.pkcs8}, Secret{}, "secret s: the private key does not belong to the certificate's public key"},
		{"ecdsa private of another type", ecdsa256, Upload{Cert: p256.cert, Private: ed.pkcs8}, Secret{}, "the private key does not belong"},
		{"ecdsa mismatched public", ecdsa256, Upload{Cert: p256.cert, Public: p256b.pkix}, Secret{}, "secret s: the public key is not the certificate's public key"},
		{"ecdsa SEC1 private", ecdsa256, Upload{Cert: p256.cert, Private: p256.legacy}, Secret{}, "the private key is not a valid PKCS#8 private key"},
		{"ecdsa garbage private", ecdsa256, Upload{Cert: p256.cert, Private: []byte("garbage")}, Secret{}, "not a valid PKCS#8"},
		{"ecdsa garbage public", ecdsa256, Upload{Cert: p256.cert, Public: []byte("garbage")}, Secret{}, "the public key is not a valid PKIX public key"},
		{"ecdsa wrong curve", ecdsa256, Upload{Cert: p384.cert}, Secret{}, "secret s: the certificate's ECDSA key is on a 384-bit curve, but the secret's size is 256"},
		{"ecdsa size 0 takes any curve", ecdsaAny, Upload{Cert: p384.cert}, withValues(ecdsaAny, p384.cert, nil, p384.pkix), ""},
		{"ecdsa with RSA cert", ecdsa256, Upload{Cert: rsa2048.cert}, Secret{}, "secret s is of type cert-ecdsa, but the certificate has an RSA key"},
		{"ecdsa with Ed25519 cert", ecdsa256, Upload{Cert: ed.cert}, Secret{}, "secret s is of type cert-ecdsa, but the certificate has an Ed25519 key"},
		{"ecdsa missing cert", ecdsa256, Upload{Private: p256.pkcs8}, Secret{}, "secret s of type cert-ecdsa: a certificate is required"},
		{"ecdsa nothing", ecdsa256, Upload{}, Secret{}, "a certificate is required"},
		{"ecdsa garbage DER", ecdsa256, Upload{Cert: []byte("-----BEGIN CERTIFICATE-----")}, Secret{}, "secret s: the certificate is not a valid DER X.509 certificate"},
		{"ecdsa trailing data", ecdsa256, Upload{Cert: append(append([]byte{}, p256.cert...), 0)}, Secret{}, "not a valid DER X.509 certificate"},
		{"ecdsa with key", ecdsa256, Upload{Key: key16}, Secret{}, "secret s is set to be of type cert-ecdsa but specified values for a symmetric-key"},

		// cert-rsa.
		{"rsa cert and private", rsaS2048, Upload{Cert: rsa2048.cert, Private: rsa2048.pkcs8}, withValues(rsaS2048, rsa2048.cert, rsa2048.pkcs8, rsa2048.pkix), ""},
		{"rsa wrong size", rsaS2048, Upload{Cert: rsa1024.cert}, Secret{}, "secret s: the certificate's RSA key has 1024 bits, but the secret's size is 2048"},
		{"rsa size 0 takes any size", rsaAny, Upload{Cert: rsa1024.cert, Public: rsa1024.pkix}, withValues(rsaAny, rsa1024.cert, nil, rsa1024.pkix), ""},
		{"rsa mismatched private", rsaAny, Upload{Cert: rsa1024.cert, Private: rsa2048.pkcs8}, Secret{}, "the private key does not belong"},
		{"rsa PKCS#1 private", rsaS2048, Upload{Cert: rsa2048.cert, Private: rsa2048.legacy}, Secret{}, "not a valid PKCS#8"},
		{"rsa with ECDSA cert", rsaS2048, Upload{Cert: p256.cert}, Secret{}, "secret s is of type cert-rsa, but the certificate has an ECDSA key"},
		{"rsa with key", rsaS2048, Upload{Key: key16}, Secret{}, "type cert-rsa but specified values for a symmetric-key"},

		// cert-ed25519.
		{"ed25519 cert, private and public", ed0, Upload{Cert: ed.cert, Private: ed.pkcs8, Public: ed.pkix}, withValues(ed0, ed.cert, ed.pkcs8, ed.pkix), ""},
		{"ed25519 ignores size", def(manifest.SecretTypeCertED25519, 256), Upload{Cert: ed.cert}, withValues(def(manifest.SecretTypeCertED25519, 256), ed.cert, nil, ed.pkix), ""},
		{"ed25519 mismatched private", ed0, Upload{Cert: ed.cert, Private: edb.pkcs8}, Secret{}, "the private key does not belong"},
		{"ed25519 mismatched public", ed0, Upload{Cert: ed.cert, Public: edb.pkix}, Secret{}, "the public key is not the certificate's public key"},
		{"ed25519 with ECDSA cert", ed0, Upload{Cert: p256.cert}, Secret{}, "secret s is of type cert-ed25519, but the certificate has an ECDSA key"},
		{"ed25519 with RSA cert", ed0, Upload{Cert: rsa2048.cert}, Secret{}, "has an RSA key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ApplyUpload("s", tt.current, tt.upload)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("ApplyUpload succeeded: %+v", got)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("error %v does not wrap ErrInvalid", err)
				}
				var se *Error
				if !errors.As(err, &se) || se.Secret != "s" {
					t.Errorf("error %v is not an *Error about secret s", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ApplyUpload: %v", err)
			}
			if !got.IsSet() {
				t.Error("IsSet() = false after an upload")
			}
			if !equalSecret(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// withValues returns def with the given values.
func withValues(def Secret, cert, private, public []byte) Secret {
	def.Cert, def.Private, def.Public = cert, private, public
	return def
}

func TestApplyUploadCopiesInput(t *testing.T) {
	keys, err := uploadKeys()
	if err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte{1}, 16)
	s, err := ApplyUpload("k", Secret{Type: manifest.SecretTypeSymmetric, Size: 128, UserDefined: true}, Upload{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	key[0] = 9
	if s.Private[0] != 1 || s.Public[0] != 1 {
		t.Error("the stored key aliases the upload")
	}

	kp := keys["p256"]
	cert, priv := bytes.Clone(kp.cert), bytes.Clone(kp.pkcs8)
	s, err = ApplyUpload("c", Secret{Type: manifest.SecretTypeCertECDSA, Size: 256, UserDefined: true}, Upload{Cert: cert, Private: priv})
	if err != nil {
		t.Fatal(err)
	}
	cert[len(cert)-1] ^= 0xff
	priv[len(priv)-1] ^= 0xff
	if !bytes.Equal(s.Cert, kp.cert) || !bytes.Equal(s.Private, kp.pkcs8) {
		t.Error("the stored certificate or key aliases the upload")
	}
}

func TestApplyUploadOverwrites(t *testing.T) {
	cur := Secret{Type: manifest.SecretTypePlain, UserDefined: true, Private: []byte("old"), Public: []byte("old")}
	s, err := ApplyUpload("p", cur, Upload{Key: []byte("new")})
	if err != nil {
		t.Fatal(err)
	}
	if string(s.Private) != "new" || string(s.Public) != "new" {
		t.Errorf("got %+v", s)
	}
	// A cert upload replacing one with a private key drops the old key.
	keys, err := uploadKeys()
	if err != nil {
		t.Fatal(err)
	}
	cur = withValues(Secret{Type: manifest.SecretTypeCertECDSA, Size: 256, UserDefined: true}, keys["p256"].cert, keys["p256"].pkcs8, keys["p256"].pkix)
	s, err = ApplyUpload("c", cur, Upload{Cert: keys["p256-b"].cert})
	if err != nil {
		t.Fatal(err)
	}
	if s.Private != nil || !bytes.Equal(s.Cert, keys["p256-b"].cert) {
		t.Errorf("got %+v", s)
	}
}
