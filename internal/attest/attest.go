// Package attest produces the Coordinator's attestation evidence: it computes
// the report data that binds a quote to the root certificate and asks an
// Issuer for a quote over it. Without an enclave the SimulationIssuer reports
// ErrUnsupported and the Coordinator serves no quote.
package attest

import (
	"context"
	"crypto/sha256"
	"errors"
)

// ReportDataSize is the size of an SGX report's REPORTDATA field.
const ReportDataSize = 64

// ErrUnsupported means no quote can be produced here (simulation or no
// enclave). Its text matches the error MarbleRun's tools know.
var ErrUnsupported = errors.New("OE_UNSUPPORTED")

// Issuer produces a quote whose report data is the given 64 bytes.
type Issuer interface {
	Issue(ctx context.Context, reportData [ReportDataSize]byte) ([]byte, error)
}

// ReportData returns the report data that binds a quote to the root
// certificate: SHA-256(rootDER ‖ nonce) in the first 32 bytes, zeros after.
// The nonce may be empty.
func ReportData(rootDER, nonce []byte) [ReportDataSize]byte {
	h := sha256.New()
	h.Write(rootDER)
	h.Write(nonce)
	var rd [ReportDataSize]byte
	copy(rd[:], h.Sum(nil))
	return rd
}

// SimulationIssuer is the Issuer without an enclave: it never produces a quote.
type SimulationIssuer struct{}

var _ Issuer = SimulationIssuer{}

// Issue always returns ErrUnsupported.
func (SimulationIssuer) Issue(context.Context, [ReportDataSize]byte) ([]byte, error) {
	return nil, ErrUnsupported
}
