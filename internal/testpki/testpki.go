// Package testpki makes X.509 certificates for tests: self-signed
// certificates and CAs, and certificates a CA issues, with the options
// tests commonly need (key type, names, validity, key usages, extensions).
// Only tests and test-support packages import it (internal/archtest checks
// this): its certificates are for tests, not for deployments.
package testpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// TB is the part of testing.TB that testpki uses; a testscript's
// TestScript fits too. A nil TB panics on failure (for package-level
// fixtures made outside a test).
type TB interface {
	Fatalf(format string, args ...any)
}

// Cert is a certificate with its private key.
type Cert struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// Chain is the issuer's chain above Cert (empty for a self-signed
	// one), nearest first, as a TLS server or client presents it.
	Chain []*x509.Certificate
}

// Option changes the certificate's template or its key.
type Option func(*settings)

type settings struct {
	tmpl  x509.Certificate
	key   crypto.Signer
	kind  keyKind
	edits []func(*x509.Certificate)
}

type keyKind int

const (
	keyP256 keyKind = iota
	keyP384
	keyEd25519
	keyRSA2048
)

// P384 gives the certificate a new P-384 key (the default is P-256).
func P384() Option { return func(s *settings) { s.kind = keyP384 } }

// Ed25519 gives the certificate a new Ed25519 key.
func Ed25519() Option { return func(s *settings) { s.kind = keyEd25519 } }

// RSA2048 gives the certificate a new 2048-bit RSA key (slow to make).
func RSA2048() Option { return func(s *settings) { s.kind = keyRSA2048 } }

// Key makes the certificate for key instead of a new one.
func Key(key crypto.Signer) Option { return func(s *settings) { s.key = key } }

// DNS adds DNS names to the certificate.
func DNS(names ...string) Option {
	return func(s *settings) { s.tmpl.DNSNames = append(s.tmpl.DNSNames, names...) }
}

// IP adds IP addresses to the certificate.
func IP(ips ...net.IP) Option {
	return func(s *settings) { s.tmpl.IPAddresses = append(s.tmpl.IPAddresses, ips...) }
}

// Loopback names localhost, 127.0.0.1 and ::1.
func Loopback() Option {
	return func(s *settings) {
		s.tmpl.DNSNames = append(s.tmpl.DNSNames, "localhost")
		s.tmpl.IPAddresses = append(s.tmpl.IPAddresses, net.IPv4(127, 0, 0, 1), net.IPv6loopback)
	}
}

// Valid sets the validity period (the default is from an hour ago to a
// day from now).
func Valid(notBefore, notAfter time.Time) Option {
	return func(s *settings) { s.tmpl.NotBefore, s.tmpl.NotAfter = notBefore, notAfter }
}

// Serial sets the serial number (the default is a random 120-bit one).
func Serial(n int64) Option { return func(s *settings) { s.tmpl.SerialNumber = big.NewInt(n) } }

// ClientAuth adds the TLS client authentication extended key usage.
func ClientAuth() Option {
	return func(s *settings) { s.tmpl.ExtKeyUsage = append(s.tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth) }
}

// ServerAuth adds the TLS server authentication extended key usage.
func ServerAuth() Option {
	return func(s *settings) { s.tmpl.ExtKeyUsage = append(s.tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth) }
}

// Usage adds key usages.
func Usage(u x509.KeyUsage) Option { return func(s *settings) { s.tmpl.KeyUsage |= u } }

// CA makes a CA certificate (basic constraints CA:true, key usages
// certificate signing and digital signature).
func CA() Option {
	return func(s *settings) {
		s.tmpl.IsCA, s.tmpl.BasicConstraintsValid = true, true
		s.tmpl.KeyUsage |= x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	}
}

// Extension adds an extension.
func Extension(ext pkix.Extension) Option {
	return func(s *settings) { s.tmpl.ExtraExtensions = append(s.tmpl.ExtraExtensions, ext) }
}

// Template edits the template directly, after the other options, for
// what they do not cover.
func Template(edit func(*x509.Certificate)) Option {
	return func(s *settings) { s.edits = append(s.edits, edit) }
}

// SelfSigned makes a self-signed certificate with subject common name cn
// (none if empty).
func SelfSigned(t TB, cn string, opts ...Option) *Cert {
	helper(t)
	return make1(t, cn, nil, opts)
}

// NewCA makes a self-signed CA certificate: SelfSigned with CA().
func NewCA(t TB, cn string, opts ...Option) *Cert {
	helper(t)
	return make1(t, cn, nil, append([]Option{CA()}, opts...))
}

// Issue makes a certificate with subject common name cn signed by c.
func (c *Cert) Issue(t TB, cn string, opts ...Option) *Cert {
	helper(t)
	return make1(t, cn, c, opts)
}

func make1(t TB, cn string, issuer *Cert, opts []Option) *Cert {
	helper(t)
	now := time.Now()
	s := &settings{tmpl: x509.Certificate{
		Subject:   pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour),
		NotAfter:  now.Add(24 * time.Hour),
	}}
	for _, o := range opts {
		o(s)
	}
	for _, edit := range s.edits {
		edit(&s.tmpl)
	}
	if s.tmpl.SerialNumber == nil {
		serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
		if err != nil {
			fatal(t, "testpki: serial: %v", err)
		}
		s.tmpl.SerialNumber = serial
	}
	key := s.key
	if key == nil {
		var err error
		if key, err = newKey(s.kind); err != nil {
			fatal(t, "testpki: key: %v", err)
		}
	}
	parent, signer := &s.tmpl, key
	var chain []*x509.Certificate
	if issuer != nil {
		parent, signer = issuer.Cert, issuer.Key
		chain = append([]*x509.Certificate{issuer.Cert}, issuer.Chain...)
	}
	der, err := x509.CreateCertificate(rand.Reader, &s.tmpl, parent, key.Public(), signer)
	if err != nil {
		fatal(t, "testpki: creating %q: %v", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		fatal(t, "testpki: parsing %q: %v", cn, err)
	}
	return &Cert{Cert: cert, Key: key, Chain: chain}
}

func newKey(kind keyKind) (crypto.Signer, error) {
	switch kind {
	case keyP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case keyEd25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	case keyRSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	}
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// TLS returns the certificate, its issuer's chain and its key for a
// tls.Config.
func (c *Cert) TLS() tls.Certificate {
	tc := tls.Certificate{Certificate: [][]byte{c.Cert.Raw}, PrivateKey: c.Key, Leaf: c.Cert}
	for _, x := range c.Chain {
		tc.Certificate = append(tc.Certificate, x.Raw)
	}
	return tc
}

// DER returns the certificate's DER encoding.
func (c *Cert) DER() []byte { return c.Cert.Raw }

// CertPEM returns the certificate as PEM.
func (c *Cert) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw})
}

// KeyPEM returns the key as PKCS #8 PEM.
func (c *Cert) KeyPEM(t TB) []byte {
	helper(t)
	der, err := x509.MarshalPKCS8PrivateKey(c.Key)
	if err != nil {
		fatal(t, "testpki: encoding the key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// ECDSA returns the key as an ECDSA key, failing t if it is another kind.
func (c *Cert) ECDSA(t TB) *ecdsa.PrivateKey {
	helper(t)
	k, ok := c.Key.(*ecdsa.PrivateKey)
	if !ok {
		fatal(t, "testpki: the key of %q is a %T, not ECDSA", c.Cert.Subject.CommonName, c.Key)
	}
	return k
}

// Pool returns a pool holding the certificate, for RootCAs or ClientCAs.
func (c *Cert) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.Cert)
	return p
}

func helper(t TB) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
}

func fatal(t TB, format string, args ...any) {
	if t == nil {
		panic(fmt.Sprintf(format, args...))
	}
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	t.Fatalf(format, args...)
}
