package secrets

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/manifest"
)

// testNow is the generation time of the tests (whole seconds, as X.509
// stores them).
var testNow = time.Date(2026, 11, 22, 7, 59, 18, 0, time.UTC)

var sharedAuthority = sync.OnceValues(func() (*ca.Authority, error) {
	return ca.New(rand.Reader, ca.Names{DNS: []string{"coordinator.example"}}, testNow.Add(-time.Hour))
})

func testAuthority(t testing.TB) *ca.Authority {
	t.Helper()
	a, err := sharedAuthority()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func testIssuer(t testing.TB) Issuer {
	a := testAuthority(t)
	return Issuer{Cert: a.MarbleRoot, Key: a.IntermediateKey}
}

// generateOneDef runs Generate on a single definition named "s".
func generateOneDef(t *testing.T, def manifest.Secret) Secret {
	t.Helper()
	out, err := Generate(rand.Reader, map[string]manifest.Secret{"s": def}, testIssuer(t), testNow)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if len(out) != 1 {
		t.Fatalf("Generate returned %d secrets, want 1", len(out))
	}
	return out["s"]
}

func parseCert(t *testing.T, s Secret) *x509.Certificate {
	t.Helper()
	cert, err := x509.ParseCertificate(s.Cert)
	if err != nil {
		t.Fatalf("stored Cert does not parse: %v", err)
	}
	return cert
}

func TestGenerateCertificateTypesAndSizes(t *testing.T) {
	type check func(t *testing.T, pub any)
	ecdsaBits := func(bits int) check {
		return func(t *testing.T, pub any) {
			k, ok := pub.(*ecdsa.PublicKey)
			if !ok {
				t.Fatalf("public key is %T, want *ecdsa.PublicKey", pub)
			}
			if got := k.Curve.Params().BitSize; got != bits {
				t.Errorf("curve has %d bits, want %d", got, bits)
			}
		}
	}
	rsaBits := func(bits int) check {
		return func(t *testing.T, pub any) {
			k, ok := pub.(*rsa.PublicKey)
			if !ok {
				t.Fatalf("public key is %T, want *rsa.PublicKey", pub)
			}
			if got := k.N.BitLen(); got != bits {
				t.Errorf("modulus has %d bits, want %d", got, bits)
			}
		}
	}
	isEd25519 := func(t *testing.T, pub any) {
		if _, ok := pub.(ed25519.PublicKey); !ok {
			t.Fatalf("public key is %T, want ed25519.PublicKey", pub)
		}
	}
	tests := []struct {
		typ   string
		size  uint
		check check
		slow  bool
	}{
		{manifest.SecretTypeCertECDSA, 224, ecdsaBits(224), false},
		{manifest.SecretTypeCertECDSA, 256, ecdsaBits(256), false},
		{manifest.SecretTypeCertECDSA, 384, ecdsaBits(384), false},
		{manifest.SecretTypeCertECDSA, 521, ecdsaBits(521), false},
		{manifest.SecretTypeCertRSA, 1024, rsaBits(1024), false},
		{manifest.SecretTypeCertRSA, 2048, rsaBits(2048), false},
		{manifest.SecretTypeCertRSA, 3072, rsaBits(3072), true},
		{manifest.SecretTypeCertRSA, 4096, rsaBits(4096), true},
		{manifest.SecretTypeCertED25519, 0, isEd25519, false},
	}
	a := testAuthority(t)
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s-%d", tt.typ, tt.size), func(t *testing.T) {
			if tt.slow && testing.Short() {
				t.Skip("slow RSA key generation")
			}
			s := generateOneDef(t, manifest.Secret{Type: tt.typ, Size: tt.size, Shared: true})
			if s.Type != tt.typ || s.Size != tt.size || !s.Shared || s.UserDefined {
				t.Errorf("definition fields = %+v", s)
			}
			if !s.IsSet() {
				t.Error("IsSet() = false for a generated certificate")
			}
			if s.ValidFor != DefaultValidFor {
				t.Errorf("ValidFor = %d, want %d written back", s.ValidFor, DefaultValidFor)
			}
			cert := parseCert(t, s)
			tt.check(t, cert.PublicKey)

			// Private is PKCS#8 of the certificate's key; Public is PKIX of it.
			priv, err := x509.ParsePKCS8PrivateKey(s.Private)
			if err != nil {
				t.Fatalf("Private is not PKCS#8: %v", err)
			}
			if !cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(priv.(crypto.Signer).Public()) {
				t.Error("Private does not belong to the certificate")
			}
			pub, err := x509.ParsePKIXPublicKey(s.Public)
			if err != nil {
				t.Fatalf("Public is not PKIX: %v", err)
			}
			if !cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(pub) {
				t.Error("Public is not the certificate's key")
			}

			// Validity.
			if !cert.NotBefore.Equal(testNow) {
				t.Errorf("NotBefore = %v, want %v", cert.NotBefore, testNow)
			}
			if got := cert.NotAfter.Sub(cert.NotBefore); got != 365*24*time.Hour {
				t.Errorf("validity = %v, want 365 days", got)
			}

			// Issuer and signature.
			if !bytes.Equal(cert.RawIssuer, a.MarbleRoot.RawSubject) {
				t.Errorf("issuer = %q, want the Marble root subject %q", cert.Issuer, a.MarbleRoot.Subject)
			}
			if cert.Issuer.CommonName != ca.IntermediateCommonName {
				t.Errorf("issuer CN = %q", cert.Issuer.CommonName)
			}
			if err := cert.CheckSignatureFrom(a.MarbleRoot); err != nil {
				t.Errorf("signature does not verify with the Marble root: %v", err)
			}
			if err := cert.CheckSignatureFrom(a.Intermediate); err != nil {
				t.Errorf("signature does not verify with the intermediate key: %v", err)
			}
			if cert.SignatureAlgorithm != x509.ECDSAWithSHA384 {
				t.Errorf("signature algorithm = %v, want ECDSA-SHA384", cert.SignatureAlgorithm)
			}

			// Serial.
			if cert.SerialNumber.Sign() < 0 || cert.SerialNumber.Cmp(limit) >= 0 {
				t.Errorf("serial %v not in [0, 2^128)", cert.SerialNumber)
			}

			// Defaults of docs/design/behaviour.md#secret-certificate-templates, with CertSign not given to a leaf.
			if !cert.BasicConstraintsValid || cert.IsCA {
				t.Errorf("BasicConstraintsValid=%v IsCA=%v, want true/false", cert.BasicConstraintsValid, cert.IsCA)
			}
			wantKU := x509.KeyUsageDigitalSignature
			if tt.typ == manifest.SecretTypeCertRSA {
				wantKU |= x509.KeyUsageKeyEncipherment
			}
			if cert.KeyUsage != wantKU {
				t.Errorf("KeyUsage = %b, want %b", cert.KeyUsage, wantKU)
			}
			if cert.KeyUsage&x509.KeyUsageCertSign != 0 {
				t.Error("a leaf certificate has CertSign")
			}
			if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
				t.Errorf("ExtKeyUsage = %v", cert.ExtKeyUsage)
			}
			if !slices.Equal(cert.DNSNames, []string{"localhost"}) {
				t.Errorf("DNSNames = %v, want [localhost]", cert.DNSNames)
			}
			if got := ipStrings(cert.IPAddresses); !slices.Equal(got, []string{"127.0.0.1", "::1"}) {
				t.Errorf("IPAddresses = %v, want [127.0.0.1 ::1]", got)
			}
			if cert.Subject.CommonName != "localhost" {
				t.Errorf("CommonName = %q, want the only DNS name", cert.Subject.CommonName)
			}
		})
	}
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

func TestGenerateCertificateTemplate(t *testing.T) {
	notAfter := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name  string
		tmpl  x509.Certificate
		valid uint
		check func(t *testing.T, s Secret, c *x509.Certificate)
	}{
		{
			name: "explicit empty DNSNames stay empty",
			tmpl: x509.Certificate{DNSNames: []string{}},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if len(c.DNSNames) != 0 {
					t.Errorf("DNSNames = %v, want none", c.DNSNames)
				}
				if c.Subject.CommonName != DefaultCommonName {
					t.Errorf("CommonName = %q, want %q", c.Subject.CommonName, DefaultCommonName)
				}
			},
		},
		{
			name: "one DNS name becomes the CommonName",
			tmpl: x509.Certificate{DNSNames: []string{"svc.example"}},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if !slices.Equal(c.DNSNames, []string{"svc.example"}) || c.Subject.CommonName != "svc.example" {
					t.Errorf("DNSNames = %v, CommonName = %q", c.DNSNames, c.Subject.CommonName)
				}
			},
		},
		{
			name: "two DNS names give the default CommonName",
			tmpl: x509.Certificate{DNSNames: []string{"a.example", "b.example"}},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if !slices.Equal(c.DNSNames, []string{"a.example", "b.example"}) || c.Subject.CommonName != DefaultCommonName {
					t.Errorf("DNSNames = %v, CommonName = %q", c.DNSNames, c.Subject.CommonName)
				}
			},
		},
		{
			name: "subject is kept",
			tmpl: x509.Certificate{Subject: pkix.Name{CommonName: "my service", Organization: []string{"Acme"}}},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if c.Subject.CommonName != "my service" || !slices.Equal(c.Subject.Organization, []string{"Acme"}) {
					t.Errorf("Subject = %v", c.Subject)
				}
			},
		},
		{
			name: "explicit IP addresses replace the loopback ones",
			tmpl: x509.Certificate{IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if got := ipStrings(c.IPAddresses); !slices.Equal(got, []string{"10.0.0.1"}) {
					t.Errorf("IPAddresses = %v", got)
				}
			},
		},
		{
			name: "explicit empty IP addresses stay empty",
			tmpl: x509.Certificate{IPAddresses: []net.IP{}},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if len(c.IPAddresses) != 0 {
					t.Errorf("IPAddresses = %v", c.IPAddresses)
				}
			},
		},
		{
			name: "explicit KeyUsage and ExtKeyUsage are kept",
			tmpl: x509.Certificate{KeyUsage: x509.KeyUsageKeyAgreement, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if c.KeyUsage != x509.KeyUsageKeyAgreement {
					t.Errorf("KeyUsage = %b", c.KeyUsage)
				}
				if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}) {
					t.Errorf("ExtKeyUsage = %v", c.ExtKeyUsage)
				}
			},
		},
		{
			name: "a CA template gets CertSign by default",
			tmpl: x509.Certificate{IsCA: true},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if !c.IsCA || c.KeyUsage != x509.KeyUsageDigitalSignature|x509.KeyUsageCertSign {
					t.Errorf("IsCA = %v, KeyUsage = %b", c.IsCA, c.KeyUsage)
				}
			},
		},
		{
			name:  "ValidFor sets the validity",
			valid: 7,
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if s.ValidFor != 7 {
					t.Errorf("ValidFor = %d", s.ValidFor)
				}
				if got := c.NotAfter.Sub(c.NotBefore); got != 7*24*time.Hour {
					t.Errorf("validity = %v, want 7 days", got)
				}
			},
		},
		{
			name: "template NotAfter is kept and ValidFor stays 0",
			tmpl: x509.Certificate{NotAfter: notAfter},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if !c.NotAfter.Equal(notAfter) {
					t.Errorf("NotAfter = %v, want %v", c.NotAfter, notAfter)
				}
				if s.ValidFor != 0 || !s.NotAfter.Equal(notAfter) {
					t.Errorf("stored ValidFor = %d, NotAfter = %v", s.ValidFor, s.NotAfter)
				}
			},
		},
		{
			name: "template serial and NotBefore are overridden",
			tmpl: x509.Certificate{SerialNumber: big.NewInt(-5), NotBefore: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)},
			check: func(t *testing.T, s Secret, c *x509.Certificate) {
				if c.SerialNumber.Sign() < 0 || !c.NotBefore.Equal(testNow) {
					t.Errorf("serial = %v, NotBefore = %v", c.SerialNumber, c.NotBefore)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			def := manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 256, Shared: true, Cert: tt.tmpl, ValidFor: tt.valid}
			s := generateOneDef(t, def)
			tt.check(t, s, parseCert(t, s))
		})
	}
}

func TestGenerateDoesNotChangeDefinitions(t *testing.T) {
	defs := map[string]manifest.Secret{
		"c": {Type: manifest.SecretTypeCertECDSA, Size: 256, Shared: true},
	}
	if _, err := Generate(rand.Reader, defs, testIssuer(t), testNow); err != nil {
		t.Fatal(err)
	}
	if d := defs["c"]; d.Cert.DNSNames != nil || d.ValidFor != 0 || d.Cert.SerialNumber != nil {
		t.Errorf("definition changed: %+v", d)
	}
}

func TestGenerateSymmetric(t *testing.T) {
	for _, size := range []uint{8, 128, 256, 512, MaxSymmetricBits} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			s := generateOneDef(t, manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: size, Shared: true})
			if uint(len(s.Private)) != size/8 {
				t.Errorf("len(Private) = %d, want %d", len(s.Private), size/8)
			}
			if !bytes.Equal(s.Private, s.Public) {
				t.Error("Private != Public")
			}
			if s.Cert != nil || !s.IsSet() {
				t.Errorf("Cert = %x, IsSet = %v", s.Cert, s.IsSet())
			}
			if size >= 128 && bytes.Equal(s.Private, make([]byte, size/8)) {
				t.Error("key is all zeroes")
			}
		})
	}
}

func TestGenerateDefinitionsWithoutValues(t *testing.T) {
	notAfter := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		def  manifest.Secret
		want Secret
	}{
		{"user-defined symmetric", manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 128, UserDefined: true},
			Secret{Type: manifest.SecretTypeSymmetric, Size: 128, UserDefined: true}},
		{"user-defined shared symmetric", manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 128, Shared: true, UserDefined: true},
			Secret{Type: manifest.SecretTypeSymmetric, Size: 128, Shared: true, UserDefined: true}},
		{"user-defined plain", manifest.Secret{Type: manifest.SecretTypePlain, UserDefined: true},
			Secret{Type: manifest.SecretTypePlain, UserDefined: true}},
		{"user-defined cert without size", manifest.Secret{Type: manifest.SecretTypeCertECDSA, UserDefined: true},
			Secret{Type: manifest.SecretTypeCertECDSA, UserDefined: true}},
		{"user-defined cert keeps ValidFor as given", manifest.Secret{Type: manifest.SecretTypeCertRSA, Size: 2048, UserDefined: true, ValidFor: 3},
			Secret{Type: manifest.SecretTypeCertRSA, Size: 2048, UserDefined: true, ValidFor: 3}},
		{"per-marble symmetric", manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 256},
			Secret{Type: manifest.SecretTypeSymmetric, Size: 256}},
		{"per-marble cert gets the default validity", manifest.Secret{Type: manifest.SecretTypeCertED25519},
			Secret{Type: manifest.SecretTypeCertED25519, ValidFor: DefaultValidFor}},
		{"per-marble cert with ValidFor", manifest.Secret{Type: manifest.SecretTypeCertRSA, Size: 2048, ValidFor: 10},
			Secret{Type: manifest.SecretTypeCertRSA, Size: 2048, ValidFor: 10}},
		{"per-marble cert with NotAfter", manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 384, Cert: x509.Certificate{NotAfter: notAfter}},
			Secret{Type: manifest.SecretTypeCertECDSA, Size: 384, NotAfter: notAfter}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := generateOneDef(t, tt.def)
			if s.IsSet() {
				t.Errorf("IsSet() = true for %+v", s)
			}
			if !equalSecret(s, tt.want) {
				t.Errorf("got %+v, want %+v", s, tt.want)
			}
		})
	}
}

func equalSecret(a, b Secret) bool {
	return a.Type == b.Type && a.Size == b.Size && a.Shared == b.Shared && a.UserDefined == b.UserDefined &&
		a.ValidFor == b.ValidFor && a.NotAfter.Equal(b.NotAfter) &&
		bytes.Equal(a.Cert, b.Cert) && bytes.Equal(a.Private, b.Private) && bytes.Equal(a.Public, b.Public) &&
		(a.Cert == nil) == (b.Cert == nil) && (a.Private == nil) == (b.Private == nil) && (a.Public == nil) == (b.Public == nil)
}

func TestGenerateInvalidDefinitions(t *testing.T) {
	shared := func(typ string, size uint) manifest.Secret {
		return manifest.Secret{Type: typ, Size: size, Shared: true}
	}
	tests := []struct {
		name string
		def  manifest.Secret
		want string // a part of the message
	}{
		{"unknown type", shared("cert-dsa", 0), "unknown type: cert-dsa for secret: s"},
		{"unknown type, user-defined", manifest.Secret{Type: "password", UserDefined: true}, "unknown type: password for secret: s"},
		{"empty type", shared("", 0), "unknown type:  for secret: s"},
		{"plain not user-defined", shared(manifest.SecretTypePlain, 0), "secret s is invalid: unsupported secret of type plain"},
		{"per-marble plain", manifest.Secret{Type: manifest.SecretTypePlain}, "unsupported secret of type plain"},
		{"symmetric size 0", shared(manifest.SecretTypeSymmetric, 0), "invalid secret size: s"},
		{"symmetric size not a multiple of 8", shared(manifest.SecretTypeSymmetric, 100), "invalid secret size: s"},
		{"symmetric too large", shared(manifest.SecretTypeSymmetric, MaxSymmetricBits+8), "more than the maximum of 65536"},
		{"per-marble symmetric beyond HKDF", manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: MaxSymmetricBits}, "HKDF-SHA256"},
		{"ecdsa size 0", shared(manifest.SecretTypeCertECDSA, 0), "invalid secret size for cert-ecdsa secret s: unsupported size 0: does not map to a supported curve"},
		{"ecdsa size 512", shared(manifest.SecretTypeCertECDSA, 512), "unsupported size 512"},
		{"per-marble ecdsa size 255", manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 255}, "unsupported size 255"},
		{"rsa size 0", shared(manifest.SecretTypeCertRSA, 0), "invalid secret size for cert-rsa secret s: 0 bits"},
		{"rsa size 512", shared(manifest.SecretTypeCertRSA, 512), "512 bits, must be between 1024 and 8192"},
		{"rsa size 1023", shared(manifest.SecretTypeCertRSA, 1023), "1023 bits"},
		{"rsa size 8193", shared(manifest.SecretTypeCertRSA, 8193), "8193 bits"},
		{"ed25519 with size", shared(manifest.SecretTypeCertED25519, 256), "invalid secret size for cert-ed25519 secret s: none is expected, got: 256"},
		{"NotAfter and ValidFor", manifest.Secret{Type: manifest.SecretTypeCertED25519, Shared: true, ValidFor: 1, Cert: x509.Certificate{NotAfter: testNow.Add(time.Hour)}},
			"ambiguous certificate validity duration for secret: s, both NotAfter and ValidFor are specified"},
		{"ValidFor overflows", manifest.Secret{Type: manifest.SecretTypeCertED25519, Shared: true, ValidFor: maxValidFor + 1}, "ValidFor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := Generate(rand.Reader, map[string]manifest.Secret{"s": tt.def}, testIssuer(t), testNow)
			if err == nil {
				t.Fatalf("Generate succeeded: %+v", out)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			var se *Error
			if !errors.As(err, &se) || se.Secret != "s" {
				t.Errorf("error %v is not an *Error about secret s", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if out != nil {
				t.Errorf("Generate returned secrets with an error: %v", out)
			}
		})
	}
}

func TestGenerateErrorIsOfTheFirstFailingSecret(t *testing.T) {
	t.Run("invalid definitions", func(t *testing.T) {
		defs := map[string]manifest.Secret{
			"zeta":  {Type: manifest.SecretTypeSymmetric, Size: 1, Shared: true},
			"alpha": {Type: manifest.SecretTypeSymmetric, Size: 128, Shared: true},
			"gamma": {Type: "bogus", Shared: true},
			"beta":  {Type: manifest.SecretTypeCertECDSA, Size: 1, Shared: true},
		}
		for range 20 {
			_, err := Generate(rand.Reader, defs, testIssuer(t), testNow)
			var se *Error
			if !errors.As(err, &se) || se.Secret != "beta" {
				t.Fatalf("error = %v, want the one about beta", err)
			}
		}
	})
	t.Run("generation failures", func(t *testing.T) {
		// Certificates cannot be made without an issuer; symmetric keys can.
		defs := map[string]manifest.Secret{}
		for i := range 16 {
			defs[fmt.Sprintf("key-%02d", i)] = manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 256, Shared: true}
			defs[fmt.Sprintf("cert-%02d", i+5)] = manifest.Secret{Type: manifest.SecretTypeCertED25519, Shared: true}
		}
		defs["cert-00"] = manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 256, Shared: true}
		for range 20 {
			_, err := Generate(rand.Reader, defs, Issuer{}, testNow)
			var se *Error
			if !errors.As(err, &se) || se.Secret != "cert-05" {
				t.Fatalf("error = %v, want the one about cert-05", err)
			}
			if !errors.Is(err, ErrNoIssuer) || errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v: want ErrNoIssuer and not ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), "cert-05") {
				t.Fatalf("error %q does not name the secret", err)
			}
		}
	})
	t.Run("failing random source", func(t *testing.T) {
		errRand := errors.New("entropy exhausted")
		defs := map[string]manifest.Secret{}
		for i := range 10 {
			defs[fmt.Sprintf("k%d", i)] = manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 128, Shared: true}
		}
		_, err := Generate(failingReader{errRand}, defs, testIssuer(t), testNow)
		var se *Error
		if !errors.As(err, &se) || se.Secret != "k0" || !errors.Is(err, errRand) {
			t.Fatalf("error = %v, want the random source's error for k0", err)
		}
	})
}

type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

func TestGenerateManyInParallel(t *testing.T) {
	defs := map[string]manifest.Secret{}
	n := 120
	if testing.Short() {
		n = 40
	}
	for i := range n {
		var def manifest.Secret
		switch i % 4 {
		case 0:
			def = manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 256, Shared: true}
		case 1:
			def = manifest.Secret{Type: manifest.SecretTypeCertED25519, Shared: true}
		case 2:
			def = manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 256, Shared: true}
		case 3:
			def = manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 128, UserDefined: true}
		}
		defs[fmt.Sprintf("secret-%03d", i)] = def
	}
	// A reader that is not safe for concurrent use: Generate must serialise.
	out, err := Generate(&countingReader{r: rand.Reader}, defs, testIssuer(t), testNow)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != n {
		t.Fatalf("got %d secrets, want %d", len(out), n)
	}
	serials := map[string]bool{}
	keys := map[string]bool{}
	for name, def := range defs {
		s, ok := out[name]
		if !ok {
			t.Fatalf("secret %s missing", name)
		}
		if s.Type != def.Type {
			t.Errorf("%s: type %s, want %s", name, s.Type, def.Type)
		}
		if def.UserDefined {
			if s.IsSet() {
				t.Errorf("%s: user-defined secret has a value", name)
			}
			continue
		}
		if keys[string(s.Private)] {
			t.Errorf("%s: duplicate key", name)
		}
		keys[string(s.Private)] = true
		if s.Cert != nil {
			c := parseCert(t, s)
			if serials[c.SerialNumber.String()] {
				t.Errorf("%s: duplicate serial", name)
			}
			serials[c.SerialNumber.String()] = true
		}
	}
}

// countingReader is deliberately not safe for concurrent use.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestGenerateEmpty(t *testing.T) {
	out, err := Generate(rand.Reader, nil, Issuer{}, testNow)
	if err != nil || len(out) != 0 {
		t.Fatalf("Generate(nil) = %v, %v", out, err)
	}
}

func TestGenerateCert(t *testing.T) {
	a := testAuthority(t)
	s, err := GenerateCert(rand.Reader, "tls", manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 256}, testIssuer(t), testNow)
	if err != nil {
		t.Fatal(err)
	}
	c := parseCert(t, s)
	if err := c.CheckSignatureFrom(a.MarbleRoot); err != nil {
		t.Error(err)
	}
	if s.ValidFor != DefaultValidFor || s.Shared {
		t.Errorf("secret = %+v", s)
	}
	for _, def := range []manifest.Secret{
		{Type: manifest.SecretTypeSymmetric, Size: 128},
		{Type: manifest.SecretTypeCertECDSA, Size: 256, UserDefined: true},
		{Type: manifest.SecretTypeCertECDSA, Size: 1},
	} {
		if _, err := GenerateCert(rand.Reader, "x", def, testIssuer(t), testNow); !errors.Is(err, ErrInvalid) {
			t.Errorf("GenerateCert(%+v) error = %v, want ErrInvalid", def, err)
		}
	}
}

func TestSecretJSONRoundTrip(t *testing.T) {
	notAfter := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		s     Secret
		isSet bool
	}{
		{"definition", Secret{Type: manifest.SecretTypePlain, UserDefined: true}, false},
		{"empty plain value", Secret{Type: manifest.SecretTypePlain, UserDefined: true, Private: []byte{}, Public: []byte{}}, true},
		{"symmetric", Secret{Type: manifest.SecretTypeSymmetric, Size: 16, Shared: true, Private: []byte{1, 2}, Public: []byte{1, 2}}, true},
		{"cert", Secret{Type: manifest.SecretTypeCertRSA, Size: 2048, ValidFor: 3, Cert: []byte{0x30}, Private: nil, Public: []byte{0x30, 0}}, true},
		{"definition with NotAfter", Secret{Type: manifest.SecretTypeCertECDSA, Size: 256, NotAfter: notAfter}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.s.IsSet() != tt.isSet {
				t.Errorf("IsSet() = %v, want %v", tt.s.IsSet(), tt.isSet)
			}
			b, err := json.Marshal(tt.s)
			if err != nil {
				t.Fatal(err)
			}
			var got Secret
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if !equalSecret(got, tt.s) || got.IsSet() != tt.isSet {
				t.Errorf("round trip of %s gave %+v", b, got)
			}
		})
	}
	// The persisted field names are part of the sealed-state format.
	b, _ := json.Marshal(Secret{Type: "plain", Private: []byte{}})
	const want = `{"Type":"plain","Size":0,"Shared":false,"UserDefined":false,"ValidFor":0,"Cert":null,"Private":"","Public":null}`
	if string(b) != want {
		t.Errorf("JSON = %s\nwant   %s", b, want)
	}
}
