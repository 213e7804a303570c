package ca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"time"
)

// OIDMarbleType is the extension of a Marble certificate whose value is the
// raw bytes of the Marble's type (its name in the manifest), as MarbleRun
// writes it (not DER-wrapped).
var OIDMarbleType = asn1.ObjectIdentifier{1, 3, 9903, 2, 1}

// MarbleLeaf is a Marble certificate issued at activation and its key.
type MarbleLeaf struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// IssueMarbleCert issues a Marble's leaf certificate for the CSR of one
// activation (docs/design/behaviour.md#certificates): a fresh ECDSA P-384 key made here (the CSR's
// key is not used), the CSR's subject with CN replaced by uuid and O by the
// Marble Root's organisation, the CSR's DNS and IP SANs, a random serial,
// the CA lifetime, DigitalSignature and KeyAgreement, ServerAuth and
// ClientAuth, not a CA, and the marble-type extension; issued by the Marble
// Root and signed with the intermediate key. The CSR's signature must have
// been checked by the caller.
func (a *Authority) IssueMarbleCert(rand io.Reader, csr *x509.CertificateRequest, uuid, marbleType string, now time.Time) (MarbleLeaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand)
	if err != nil {
		return MarbleLeaf{}, fmt.Errorf("generating marble key: %w", err)
	}
	serial, err := SerialNumber(rand)
	if err != nil {
		return MarbleLeaf{}, err
	}
	subject := csr.Subject
	subject.CommonName = uuid
	subject.Organization = a.MarbleRoot.Subject.Organization
	// ExtraNames would override the fields above when encoded.
	subject.ExtraNames = nil
	notBefore := now.UTC().Truncate(time.Second)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyAgreement,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
		DNSNames:              csr.DNSNames,
		IPAddresses:           csr.IPAddresses,
		ExtraExtensions:       []pkix.Extension{{Id: OIDMarbleType, Value: []byte(marbleType)}},
	}
	cert, err := create(rand, tmpl, a.MarbleRoot, &key.PublicKey, a.IntermediateKey)
	if err != nil {
		return MarbleLeaf{}, fmt.Errorf("issuing marble certificate: %w", err)
	}
	return MarbleLeaf{Cert: cert, Key: key}, nil
}

// Errors of VerifyMarbleCert.
var (
	ErrNoMarbleType = errors.New("MarbleType extension not found in certificate")
)

// VerifyMarbleCert checks that cert is a Marble certificate issued by the
// current Marble Root (certificates issued before an update that renewed
// it are refused) and returns its marble type (the extension's raw value)
// and its common name (the Marble's UUID, not parsed here).
func (a *Authority) VerifyMarbleCert(cert *x509.Certificate, now time.Time) (marbleType, cn string, err error) {
	roots := x509.NewCertPool()
	roots.AddCert(a.MarbleRoot)
	if _, err := cert.Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return "", "", err
	}
	for _, ext := range cert.Extensions {
		if ext.Id.Equal(OIDMarbleType) {
			return string(ext.Value), cert.Subject.CommonName, nil
		}
	}
	return "", "", ErrNoMarbleType
}
