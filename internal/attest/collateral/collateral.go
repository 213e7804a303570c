// Package collateral holds the Intel DCAP collateral a quote is verified
// against (TCB info, QE identity, their issuer chains, the PCK CRL and the
// root CA CRL), decodes its signed JSON and CRL formats, and provides it from
// files or from memory, with a cache that honours nextUpdate. The signed JSON
// documents are kept as the exact bytes that were served, because Intel's
// signatures cover those bytes. Package pccs fetches collateral over HTTP.
package collateral

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

// CA names the PCK intermediate CA whose CRL is wanted.
type CA string

// The two PCK intermediate CAs.
const (
	CAProcessor CA = "processor" // Intel SGX PCK Processor CA
	CAPlatform  CA = "platform"  // Intel SGX PCK Platform CA
)

var (
	// ErrFormat means collateral could not be decoded.
	ErrFormat = errors.New("collateral: malformed collateral")
	// ErrNotFound means the source has no collateral for the request.
	ErrNotFound = errors.New("collateral: not found")
)

// Collateral is everything needed to verify a quote of one platform (FMSPC)
// whose PCK was issued by one CA. It is read-only once a Provider returned it.
type Collateral struct {
	// TCBInfo is the exact JSON text of the "tcbInfo" object as served.
	TCBInfo []byte
	// TCBInfoSignature is the raw ECDSA P-256 signature r‖s over TCBInfo.
	TCBInfoSignature []byte
	// TCBInfoIssuerChain is the TCB Signing certificate and the root.
	TCBInfoIssuerChain []*x509.Certificate

	// QEIdentity is the exact JSON text of the "enclaveIdentity" object.
	QEIdentity []byte
	// QEIdentitySignature is the raw signature r‖s over QEIdentity.
	QEIdentitySignature []byte
	// QEIdentityIssuerChain is the TCB Signing certificate and the root.
	QEIdentityIssuerChain []*x509.Certificate

	// PCKCRL is the CRL of the PCK intermediate CA.
	PCKCRL *x509.RevocationList
	// PCKCRLIssuerChain is the PCK intermediate CA and the root, as served.
	PCKCRLIssuerChain []*x509.Certificate

	// RootCACRL is the CRL of the Intel SGX Root CA.
	RootCACRL *x509.RevocationList
}

// Provider supplies collateral for the platform with the given FMSPC whose
// PCK certificate was issued by ca.
type Provider interface {
	Get(ctx context.Context, fmspc [6]byte, ca CA) (*Collateral, error)
}

// Static is a Provider that always returns the same collateral.
type Static struct{ Collateral *Collateral }

var _ Provider = Static{}

// Get returns s.Collateral, or ErrNotFound when it is nil.
func (s Static) Get(context.Context, [6]byte, CA) (*Collateral, error) {
	if s.Collateral == nil {
		return nil, ErrNotFound
	}
	return s.Collateral, nil
}

// Validity returns the time span in which all parts of c are current: from
// the latest issue date (TCB info, QE identity, CRL thisUpdate) to the
// earliest nextUpdate.
func (c *Collateral) Validity() (from, until time.Time, err error) {
	var spans [][2]time.Time
	for _, doc := range []struct {
		name string
		raw  []byte
	}{{"TCB info", c.TCBInfo}, {"QE identity", c.QEIdentity}} {
		var d struct {
			IssueDate  time.Time `json:"issueDate"`
			NextUpdate time.Time `json:"nextUpdate"`
		}
		if err := json.Unmarshal(doc.raw, &d); err != nil {
			return time.Time{}, time.Time{}, fmt.Errorf("%w: %s: %w", ErrFormat, doc.name, err)
		}
		spans = append(spans, [2]time.Time{d.IssueDate, d.NextUpdate})
	}
	for _, crl := range []*x509.RevocationList{c.PCKCRL, c.RootCACRL} {
		if crl == nil {
			return time.Time{}, time.Time{}, fmt.Errorf("%w: CRL missing", ErrFormat)
		}
		spans = append(spans, [2]time.Time{crl.ThisUpdate, crl.NextUpdate})
	}
	from, until = spans[0][0], spans[0][1]
	for _, s := range spans[1:] {
		if s[0].After(from) {
			from = s[0]
		}
		if s[1].Before(until) {
			until = s[1]
		}
	}
	return from, until, nil
}

// ParseCRL decodes a CRL given as DER, as hex of the DER (how a PCCS serves
// it) or as PEM ("X509 CRL", how Intel's PCS serves it by default).
func ParseCRL(b []byte) (*x509.RevocationList, error) {
	der := b
	if len(b) == 0 || b[0] != 0x30 { // DER starts with a SEQUENCE; hex text with '3'
		text := bytes.TrimSpace(b)
		if bytes.HasPrefix(text, []byte("-----BEGIN")) {
			block, rest := pem.Decode(text)
			if block == nil || block.Type != "X509 CRL" || len(bytes.TrimSpace(rest)) != 0 {
				return nil, fmt.Errorf("%w: CRL: want one PEM block of type X509 CRL", ErrFormat)
			}
			der = block.Bytes
		} else {
			var err error
			if der, err = hex.DecodeString(string(text)); err != nil {
				return nil, fmt.Errorf("%w: CRL is neither DER, hex nor PEM: %w", ErrFormat, err)
			}
		}
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("%w: CRL: %w", ErrFormat, err)
	}
	return crl, nil
}

// ParseChain decodes an issuer chain given as concatenated PEM certificates.
func ParseChain(pemData []byte) ([]*x509.Certificate, error) {
	certs, err := sgxquote.ParsePEMChain(pemData)
	if err != nil {
		return nil, fmt.Errorf("%w: issuer chain: %w", ErrFormat, err)
	}
	return certs, nil
}

// SplitTCBInfoBody splits a PCS/PCCS TCB info response body
// {"tcbInfo":{…},"signature":"<hex>"} into the exact tcbInfo bytes and the
// decoded signature.
func SplitTCBInfoBody(body []byte) (raw, sig []byte, err error) {
	return splitSigned(body, "tcbInfo")
}

// SplitQEIdentityBody splits a PCS/PCCS QE identity response body
// {"enclaveIdentity":{…},"signature":"<hex>"}.
func SplitQEIdentityBody(body []byte) (raw, sig []byte, err error) {
	return splitSigned(body, "enclaveIdentity")
}

func splitSigned(body []byte, field string) (raw, sig []byte, err error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, nil, fmt.Errorf("%w: %s body: %w", ErrFormat, field, err)
	}
	raw, ok := m[field]
	if !ok || len(raw) == 0 || raw[0] != '{' {
		return nil, nil, fmt.Errorf("%w: %s body: no %q object", ErrFormat, field, field)
	}
	var sigHex string
	if err := json.Unmarshal(m["signature"], &sigHex); err != nil {
		return nil, nil, fmt.Errorf("%w: %s body: signature: %w", ErrFormat, field, err)
	}
	if sig, err = hex.DecodeString(sigHex); err != nil {
		return nil, nil, fmt.Errorf("%w: %s body: signature: %w", ErrFormat, field, err)
	}
	return raw, sig, nil
}
