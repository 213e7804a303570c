// Package dcaptest builds synthetic SGX DCAP material for tests: a PKI shaped
// like Intel's (root, PCK Processor CA, PCK leaves with the SGX extension,
// TCB Signing certificate, CRLs) with its own keys, a fake quoting enclave
// that produces quotes, signed TCB info and QE identity with chosen levels,
// a fake PCCS, and access to the real vectors in the shared test data.
package dcaptest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/pck"
)

// Certificate common names, as Intel's PKI uses them.
const (
	CNRoot        = "Intel SGX Root CA"
	CNProcessorCA = "Intel SGX PCK Processor CA"
	CNPlatformCA  = "Intel SGX PCK Platform CA"
	CNPCK         = "Intel SGX PCK Certificate"
	CNTCBSigning  = "Intel SGX TCB Signing"
)

// DefaultTime is the verification time synthetic material is built around.
func DefaultTime() time.Time { return time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC) }

// PKI is a synthetic Intel-like DCAP PKI. Its certificates are valid from a
// year before Time until ten years after.
type PKI struct {
	Time time.Time

	Root    *x509.Certificate
	RootKey *ecdsa.PrivateKey
	// PCKCA is the intermediate CA; its CN is CNProcessorCA unless the PKI
	// was made with NewPKIWithCA.
	PCKCA         *x509.Certificate
	PCKCAKey      *ecdsa.PrivateKey
	TCBSigning    *x509.Certificate
	TCBSigningKey *ecdsa.PrivateKey
}

// NewPKI creates a PKI with a PCK Processor CA.
func NewPKI(tb testing.TB) *PKI { return NewPKIWithCA(tb, CNProcessorCA) }

// NewPKIWithCA creates a PKI whose intermediate CA has the given CN.
func NewPKIWithCA(tb testing.TB, caCN string) *PKI {
	tb.Helper()
	p := &PKI{Time: DefaultTime()}
	p.RootKey = newKey(tb)
	p.Root = p.issue(tb, &x509.Certificate{
		Subject:               intelName(CNRoot),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            1,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, nil, p.RootKey, p.RootKey)
	p.PCKCAKey = newKey(tb)
	p.PCKCA = p.issue(tb, &x509.Certificate{
		Subject:               intelName(caCN),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, p.Root, p.RootKey, p.PCKCAKey)
	p.TCBSigningKey = newKey(tb)
	p.TCBSigning = p.issue(tb, &x509.Certificate{
		Subject:               intelName(CNTCBSigning),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageContentCommitment,
	}, p.Root, p.RootKey, p.TCBSigningKey)
	return p
}

// issue signs tmpl with signerKey as parent (self-signed when parent is nil)
// for the public key of subjectKey.
func (p *PKI) issue(tb testing.TB, tmpl, parent *x509.Certificate, signerKey, subjectKey *ecdsa.PrivateKey) *x509.Certificate {
	tb.Helper()
	tmpl.SerialNumber = randomSerial(tb)
	tmpl.NotBefore = p.Time.AddDate(-1, 0, 0)
	tmpl.NotAfter = p.Time.AddDate(10, 0, 0)
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &subjectKey.PublicKey, signerKey)
	if err != nil {
		tb.Fatalf("dcaptest: create certificate %q: %v", tmpl.Subject.CommonName, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("dcaptest: parse certificate: %v", err)
	}
	return c
}

// IssuePCK issues a PCK leaf certificate with the given SGX extension for key.
func (p *PKI) IssuePCK(tb testing.TB, ext pck.Extension, key *ecdsa.PrivateKey) *x509.Certificate {
	tb.Helper()
	return p.issue(tb, &x509.Certificate{
		Subject:               intelName(CNPCK),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageContentCommitment,
		ExtraExtensions:       []pkix.Extension{{Id: pck.OIDSGXExtension(), Value: MarshalExtension(tb, ext)}},
	}, p.PCKCA, p.PCKCAKey, key)
}

// Sign returns the raw ECDSA P-256 signature r‖s of the TCB Signing key over
// data, as Intel signs TCB info and QE identity.
func (p *PKI) Sign(tb testing.TB, data []byte) []byte { return SignRaw(tb, p.TCBSigningKey, data) }

// SignRaw returns the raw ECDSA signature r‖s of key over SHA-256(data).
func SignRaw(tb testing.TB, key *ecdsa.PrivateKey, data []byte) []byte {
	tb.Helper()
	digest := sha256.Sum256(data)
	r, s, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		tb.Fatalf("dcaptest: sign: %v", err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return sig
}

// CRLOptions selects what CRLs revoke and when they are valid.
type CRLOptions struct {
	ThisUpdate, NextUpdate time.Time
	Revoked                []*x509.Certificate
}

// RootCRL returns the root CA's CRL.
func (p *PKI) RootCRL(tb testing.TB, o CRLOptions) *x509.RevocationList {
	return p.crl(tb, p.Root, p.RootKey, o)
}

// PCKCRL returns the PCK intermediate CA's CRL.
func (p *PKI) PCKCRL(tb testing.TB, o CRLOptions) *x509.RevocationList {
	return p.crl(tb, p.PCKCA, p.PCKCAKey, o)
}

func (p *PKI) crl(tb testing.TB, issuer *x509.Certificate, key *ecdsa.PrivateKey, o CRLOptions) *x509.RevocationList {
	tb.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: o.ThisUpdate, NextUpdate: o.NextUpdate}
	for _, c := range o.Revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{
			SerialNumber: c.SerialNumber, RevocationTime: o.ThisUpdate,
		})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, issuer, key)
	if err != nil {
		tb.Fatalf("dcaptest: create CRL: %v", err)
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		tb.Fatalf("dcaptest: parse CRL: %v", err)
	}
	return crl
}

// MarshalExtension encodes the SGX extension of a PCK certificate in the
// layout Intel uses: a SEQUENCE of (OID, value) pairs.
func MarshalExtension(tb testing.TB, ext pck.Extension) []byte {
	tb.Helper()
	base := pck.OIDSGXExtension()
	oid := func(parent asn1.ObjectIdentifier, arc int) asn1.ObjectIdentifier {
		return append(slices.Clone(parent), arc)
	}
	type pair struct {
		ID    asn1.ObjectIdentifier
		Value any
	}
	tcbOID := oid(base, 2)
	var tcb []pair
	for i, svn := range ext.CompSVN {
		tcb = append(tcb, pair{oid(tcbOID, i+1), int(svn)})
	}
	tcb = append(tcb, pair{oid(tcbOID, 17), int(ext.PCESVN)}, pair{oid(tcbOID, 18), ext.CPUSVN[:]})
	top := []pair{
		{oid(base, 1), ext.PPID[:]},
		{oid(base, 2), tcb},
		{oid(base, 3), ext.PCEID[:]},
		{oid(base, 4), ext.FMSPC[:]},
		{oid(base, 5), asn1.Enumerated(ext.SGXType)},
	}
	if ext.PlatformInstanceID != nil {
		top = append(top, pair{oid(base, 6), ext.PlatformInstanceID})
	}
	if c := ext.Configuration; c != nil {
		confOID := oid(base, 7)
		var conf []pair
		for i, b := range []*bool{c.DynamicPlatform, c.CachedKeys, c.SMTEnabled} {
			if b != nil {
				conf = append(conf, pair{oid(confOID, i+1), *b})
			}
		}
		top = append(top, pair{confOID, conf})
	}
	der, err := asn1.Marshal(top)
	if err != nil {
		tb.Fatalf("dcaptest: marshal SGX extension: %v", err)
	}
	return der
}

// DefaultExtension returns a plausible SGX extension: FMSPC 00906EA10000,
// PCE-ID 0000, component SVNs 5, PCESVN 13.
func DefaultExtension() pck.Extension {
	ext := pck.Extension{
		FMSPC:   [6]byte{0x00, 0x90, 0x6e, 0xa1, 0x00, 0x00},
		PCESVN:  13,
		SGXType: pck.SGXTypeStandard,
	}
	for i := range ext.CompSVN {
		ext.CompSVN[i] = 5
		ext.CPUSVN[i] = 5
	}
	copy(ext.PPID[:], "synthetic-ppid-1")
	return ext
}

func intelName(cn string) pkix.Name {
	return pkix.Name{
		CommonName:   cn,
		Organization: []string{"Intel Corporation"},
		Locality:     []string{"Santa Clara"},
		Province:     []string{"CA"},
		Country:      []string{"US"},
	}
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("dcaptest: generate key: %v", err)
	}
	return k
}

func randomSerial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		tb.Fatalf("dcaptest: serial: %v", err)
	}
	return n.Add(n, big.NewInt(1))
}
