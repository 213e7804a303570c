// Package ca creates and keeps the Coordinator's certificate authorities: the
// root CA (Client API TLS, manifest and quote signatures), the intermediate
// CA, and the Marble root that shares the intermediate's key and subject.
package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"time"
)

// Subject common names (docs/design/behaviour.md#certificates).
const (
	RootCommonName         = "MarbleRun Coordinator"
	IntermediateCommonName = "MarbleRun Coordinator - Intermediate CA"
)

// validity is the lifetime of every CA certificate: the largest
// time.Duration, about 292 years, as MarbleRun's.
const validity = time.Duration(math.MaxInt64)

// ErrInvalid means persisted CA data could not be decoded or is inconsistent.
var ErrInvalid = errors.New("invalid CA data")

// Names are the subject alternative names of the CA certificates.
type Names struct {
	DNS []string
	IPs []net.IP
}

// withLoopback returns the names with 127.0.0.1 and ::1 added (once).
func (n Names) withLoopback() Names {
	out := Names{DNS: append([]string(nil), n.DNS...)}
	seen := map[string]bool{}
	for _, ip := range append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, n.IPs...) {
		if !seen[ip.String()] {
			seen[ip.String()] = true
			out.IPs = append(out.IPs, ip)
		}
	}
	return out
}

// Authority is the set of Coordinator CAs with their keys.
type Authority struct {
	Root            *x509.Certificate
	RootKey         *ecdsa.PrivateKey
	Intermediate    *x509.Certificate
	IntermediateKey *ecdsa.PrivateKey
	MarbleRoot      *x509.Certificate

	tlsCert   *tls.Certificate
	marbleTLS *marbleTLS
}

// New creates a fresh root, intermediate and Marble root (ECDSA P-384) whose
// SANs are names plus the loopback addresses.
func New(rand io.Reader, names Names, now time.Time) (*Authority, error) {
	names = names.withLoopback()
	rootKey, err := ecdsa.GenerateKey(elliptic.P384(), rand)
	if err != nil {
		return nil, fmt.Errorf("generating root key: %w", err)
	}
	rootTmpl, err := template(rand, RootCommonName, names, now)
	if err != nil {
		return nil, err
	}
	root, err := create(rand, rootTmpl, rootTmpl, &rootKey.PublicKey, rootKey)
	if err != nil {
		return nil, fmt.Errorf("creating root certificate: %w", err)
	}
	a := &Authority{Root: root, RootKey: rootKey}
	if err := a.newIntermediate(rand, names, now); err != nil {
		return nil, err
	}
	a.init()
	return a, nil
}

// Rotate returns a copy with a new intermediate key, intermediate certificate
// and Marble root; the root stays. Every DNS and IP SAN of the root is kept.
func (a *Authority) Rotate(rand io.Reader, now time.Time) (*Authority, error) {
	b := &Authority{Root: a.Root, RootKey: a.RootKey}
	if err := b.newIntermediate(rand, Names{DNS: a.Root.DNSNames, IPs: a.Root.IPAddresses}, now); err != nil {
		return nil, err
	}
	b.init()
	return b, nil
}

func (a *Authority) newIntermediate(rand io.Reader, names Names, now time.Time) error {
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand)
	if err != nil {
		return fmt.Errorf("generating intermediate key: %w", err)
	}
	tmpl, err := template(rand, IntermediateCommonName, names, now)
	if err != nil {
		return err
	}
	inter, err := create(rand, tmpl, a.Root, &key.PublicKey, a.RootKey)
	if err != nil {
		return fmt.Errorf("creating intermediate certificate: %w", err)
	}
	// The Marble root: same subject and key, self-signed, its own serial.
	mtmpl, err := template(rand, IntermediateCommonName, names, now)
	if err != nil {
		return err
	}
	marbleRoot, err := create(rand, mtmpl, mtmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("creating marble root certificate: %w", err)
	}
	a.Intermediate, a.IntermediateKey, a.MarbleRoot = inter, key, marbleRoot
	return nil
}

func template(rand io.Reader, cn string, names Names, now time.Time) (*x509.Certificate, error) {
	serial, err := SerialNumber(rand)
	if err != nil {
		return nil, err
	}
	notBefore := now.UTC().Truncate(time.Second)
	return &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              names.DNS,
		IPAddresses:           names.IPs,
	}, nil
}

// SerialNumber returns a random certificate serial number in [0, 2^128).
func SerialNumber(rand io.Reader) (*big.Int, error) {
	n, err := randInt(rand, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	return n, nil
}

func randInt(rand io.Reader, max *big.Int) (*big.Int, error) {
	b := make([]byte, (max.BitLen()+7)/8)
	if _, err := io.ReadFull(rand, b); err != nil {
		return nil, err
	}
	return new(big.Int).Mod(new(big.Int).SetBytes(b), max), nil
}

func create(rand io.Reader, tmpl, parent *x509.Certificate, pub crypto.PublicKey, priv crypto.Signer) (*x509.Certificate, error) {
	der, err := CreateCertificate(rand, tmpl, parent, pub, priv)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func (a *Authority) init() {
	a.marbleTLS = &marbleTLS{}
	a.tlsCert = &tls.Certificate{
		Certificate: [][]byte{a.Root.Raw},
		PrivateKey:  a.RootKey,
		Leaf:        a.Root,
	}
}

// TLSCertificate is the Client API's server certificate: the root
// certificate with the root key (as MarbleRun serves it).
func (a *Authority) TLSCertificate() *tls.Certificate { return a.tlsCert }

// ChainPEM is the certificate chain served by the quote endpoint: the
// intermediate first, then the root (the order MarbleRun's SDK expects).
func (a *Authority) ChainPEM() []byte {
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Intermediate.Raw})
	return append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Root.Raw})...)
}

// SignRoot signs SHA-256(data) with the root key (ASN.1 ECDSA signature).
func (a *Authority) SignRoot(rand io.Reader, data []byte) ([]byte, error) {
	digest := sha256.Sum256(data)
	return ecdsa.SignASN1(rand, a.RootKey, digest[:])
}

// Persisted is the serialisable form of an Authority (DER certificates,
// SEC1 EC private keys).
type Persisted struct {
	RootCert         []byte
	RootKey          []byte
	IntermediateCert []byte
	IntermediateKey  []byte
	MarbleRootCert   []byte
}

// Persist returns the serialisable form.
func (a *Authority) Persist() (Persisted, error) {
	rk, err := x509.MarshalECPrivateKey(a.RootKey)
	if err != nil {
		return Persisted{}, err
	}
	ik, err := x509.MarshalECPrivateKey(a.IntermediateKey)
	if err != nil {
		return Persisted{}, err
	}
	return Persisted{
		RootCert: a.Root.Raw, RootKey: rk,
		IntermediateCert: a.Intermediate.Raw, IntermediateKey: ik,
		MarbleRootCert: a.MarbleRoot.Raw,
	}, nil
}

// Restore rebuilds an Authority from its persisted form and checks that each
// key belongs to its certificate.
func Restore(p Persisted) (*Authority, error) {
	var a Authority
	var err error
	if a.Root, err = x509.ParseCertificate(p.RootCert); err != nil {
		return nil, fmt.Errorf("%w: root certificate: %v", ErrInvalid, err)
	}
	if a.Intermediate, err = x509.ParseCertificate(p.IntermediateCert); err != nil {
		return nil, fmt.Errorf("%w: intermediate certificate: %v", ErrInvalid, err)
	}
	if a.MarbleRoot, err = x509.ParseCertificate(p.MarbleRootCert); err != nil {
		return nil, fmt.Errorf("%w: marble root certificate: %v", ErrInvalid, err)
	}
	if a.RootKey, err = x509.ParseECPrivateKey(p.RootKey); err != nil {
		return nil, fmt.Errorf("%w: root key: %v", ErrInvalid, err)
	}
	if a.IntermediateKey, err = x509.ParseECPrivateKey(p.IntermediateKey); err != nil {
		return nil, fmt.Errorf("%w: intermediate key: %v", ErrInvalid, err)
	}
	if !a.RootKey.PublicKey.Equal(a.Root.PublicKey) {
		return nil, fmt.Errorf("%w: root key does not match the root certificate", ErrInvalid)
	}
	if !a.IntermediateKey.PublicKey.Equal(a.Intermediate.PublicKey) || !a.IntermediateKey.PublicKey.Equal(a.MarbleRoot.PublicKey) {
		return nil, fmt.Errorf("%w: intermediate key does not match its certificates", ErrInvalid)
	}
	a.init()
	return &a, nil
}
