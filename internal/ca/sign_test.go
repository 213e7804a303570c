package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"
)

func ecKey(t testing.TB, c elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// issuerCert is a CA certificate of key, self-signed by x509.
func issuerCert(t testing.TB, key crypto.Signer) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "issuer"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Unix(1e9, 0), NotAfter: time.Unix(2e9, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCreateCertificateAsX509: the certificates CreateCertificate makes
// have exactly the to-be-signed part x509.CreateCertificate writes for the
// same request, the same signature algorithm, and a signature of the
// issuer's key that verifies; for signers it does not handle itself the
// result is x509's.
func TestCreateCertificateAsX509(t *testing.T) {
	leafKey := ecKey(t, elliptic.P256())
	templates := map[string]*x509.Certificate{
		"leaf": {SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "leaf", Organization: []string{"o"}},
			DNSNames: []string{"a.example", "b.example"}, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)},
			NotBefore: time.Unix(1.5e9, 0), NotAfter: time.Unix(1.6e9, 0), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}},
		"intermediate CA": {SerialNumber: big.NewInt(8), Subject: pkix.Name{CommonName: "inter"}, IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Unix(1.5e9, 0), NotAfter: time.Unix(1.6e9, 0)},
		"SHA-512 requested": {SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "sha512"}, SignatureAlgorithm: x509.ECDSAWithSHA512,
			NotBefore: time.Unix(1.5e9, 0), NotAfter: time.Unix(1.6e9, 0)},
	}
	for _, curve := range []elliptic.Curve{elliptic.P256(), elliptic.P384(), elliptic.P521()} {
		key := ecKey(t, curve)
		parent := issuerCert(t, key)
		for name, tmpl := range templates {
			t.Run(curve.Params().Name+"/"+name, func(t *testing.T) {
				got, err := CreateCertificate(rand.Reader, tmpl, parent, &leafKey.PublicKey, key)
				if err != nil {
					t.Fatal(err)
				}
				wantDER, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &leafKey.PublicKey, key)
				if err != nil {
					t.Fatal(err)
				}
				c, err := x509.ParseCertificate(got)
				if err != nil {
					t.Fatal(err)
				}
				want, _ := x509.ParseCertificate(wantDER)
				if !bytes.Equal(c.RawTBSCertificate, want.RawTBSCertificate) {
					t.Fatal("the to-be-signed part differs from x509's")
				}
				if c.SignatureAlgorithm != want.SignatureAlgorithm {
					t.Fatalf("signature algorithm %v, x509's %v", c.SignatureAlgorithm, want.SignatureAlgorithm)
				}
				if err := c.CheckSignatureFrom(parent); err != nil {
					t.Fatalf("the signature does not verify with the issuer's key: %v", err)
				}
				other := issuerCert(t, ecKey(t, curve))
				if err := c.CheckSignatureFrom(other); err == nil {
					t.Fatal("the signature verifies with another key")
				}
			})
		}
		// A self-signed certificate (the CA's own), too.
		t.Run(curve.Params().Name+"/self-signed", func(t *testing.T) {
			tmpl := templates["intermediate CA"]
			got, err := CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
			if err != nil {
				t.Fatal(err)
			}
			wantDER, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
			c, err := x509.ParseCertificate(got)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := x509.ParseCertificate(wantDER)
			if !bytes.Equal(c.RawTBSCertificate, want.RawTBSCertificate) || c.CheckSignatureFrom(c) != nil {
				t.Fatal("the self-signed certificate differs from x509's or does not verify")
			}
		})
	}

	// Ed25519 signs deterministically: the certificate is x509's, byte
	// for byte.
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	edParent := issuerCert(t, edKey)
	tmpl := templates["leaf"]
	got, err := CreateCertificate(rand.Reader, tmpl, edParent, &leafKey.PublicKey, edKey)
	if err != nil {
		t.Fatal(err)
	}
	want, err := x509.CreateCertificate(rand.Reader, tmpl, edParent, &leafKey.PublicKey, edKey)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("an Ed25519 issuer's certificate differs from x509's (%v)", err)
	}
}

// The errors of x509.CreateCertificate stay: a key that is not the
// parent's, a signature algorithm that is not the key's.
func TestCreateCertificateRefuses(t *testing.T) {
	key := ecKey(t, elliptic.P384())
	parent := issuerCert(t, ecKey(t, elliptic.P384()))
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "x"}, NotBefore: time.Unix(1e9, 0), NotAfter: time.Unix(2e9, 0)}
	if _, err := CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, key); err == nil {
		t.Fatal("a key that is not the parent's signed a certificate")
	}
	own := issuerCert(t, key)
	rsaAlg := *tmpl
	rsaAlg.SignatureAlgorithm = x509.SHA256WithRSA
	if _, err := CreateCertificate(rand.Reader, &rsaAlg, own, &key.PublicKey, key); err == nil {
		t.Fatal("an ECDSA key signed with an RSA signature algorithm")
	}
}

// BenchmarkCreateCertificate: a Marble's certificate signed by a P-384
// issuer, here and with x509.CreateCertificate.
func BenchmarkCreateCertificate(b *testing.B) {
	key := ecKey(b, elliptic.P384())
	parent := issuerCert(b, key)
	leaf := ecKey(b, elliptic.P384())
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "marble"}, NotBefore: time.Unix(1e9, 0), NotAfter: time.Unix(2e9, 0)}
	for name, create := range map[string]func(*x509.Certificate) ([]byte, error){
		"ca": func(t *x509.Certificate) ([]byte, error) {
			return CreateCertificate(rand.Reader, t, parent, &leaf.PublicKey, key)
		},
		"x509": func(t *x509.Certificate) ([]byte, error) {
			return x509.CreateCertificate(rand.Reader, t, parent, &leaf.PublicKey, key)
		},
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := create(tmpl); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
