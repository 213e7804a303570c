// Package dcap verifies Intel SGX DCAP quotes in pure Go: the PCK chain to
// the Intel SGX Root CA, the CRLs, the quoting enclave's report and identity,
// the attestation key binding, the enclave report signature and the TCB
// level from signed collateral, at an injectable time. It follows Intel's
// Quote Verification Library, including its rule for converging platform and
// QE TCB status. It reports the TCB status; whether a status is acceptable
// is the caller's decision (see package policy).
package dcap

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/pck"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// IntelRootCASHA256 is the SHA-256 of the DER of the Intel SGX Root CA
// certificate ("CN=Intel SGX Root CA", self-signed, valid 2018–2049).
const IntelRootCASHA256 = "44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3"

// Certificate names Intel's DCAP PKI uses.
const (
	cnPCKLeaf      = "SGX PCK Certificate"
	cnProcessorCA  = "Intel SGX PCK Processor CA"
	cnPlatformCA   = "Intel SGX PCK Platform CA"
	cnTCBSigning   = "SGX TCB Signing"
	idTCBInfoSGX   = "SGX"
	idQEIdentityQE = "QE"
)

// Verifier verifies SGX DCAP quotes. The zero value is not usable: it needs
// a Collateral provider.
type Verifier struct {
	// Collateral supplies TCB info, QE identity and CRLs.
	Collateral collateral.Provider
	// Now returns the verification time; nil means time.Now.
	Now func() time.Time
	// RootCA, when set, replaces the pinned Intel SGX Root CA: every chain
	// must end in exactly this certificate. Meant for tests and private
	// PKIs. When nil, the root a chain presents is accepted only if it is
	// self-signed and its SHA-256 is IntelRootCASHA256.
	RootCA *x509.Certificate
}

// Result is a verified quote.
type Result struct {
	// Status is the platform TCB status converged with the QE's status.
	Status tcbstatus.Status
	// PlatformStatus is the status of the matched platform TCB level.
	PlatformStatus tcbstatus.Status
	// QEStatus is the status of the matched QE TCB level.
	QEStatus tcbstatus.Status
	// Advisories are the advisory IDs of the matched platform TCB level
	// (what EGo and MarbleRun report).
	Advisories []string
	// QEAdvisories are the advisory IDs of the matched QE TCB level.
	QEAdvisories []string
	// TCBDate is the date of the matched platform TCB level.
	TCBDate time.Time
	// TCBEvaluationDataNumber is that of the TCB info.
	TCBEvaluationDataNumber int

	// Version is the quote version.
	Version uint16
	// Report is the verified enclave report body.
	Report sgxquote.ReportBody
	// QEReport is the quoting enclave's report body.
	QEReport sgxquote.ReportBody
	// PCK is the SGX extension of the PCK certificate.
	PCK pck.Extension
	// CA is the PCK certificate's issuing CA.
	CA collateral.CA

	// CollateralExpiry is the earliest nextUpdate of the collateral used.
	CollateralExpiry time.Time
	// CollateralExpired is set when the verification time lies outside the
	// collateral's validity; Verify then also returns ErrCollateralExpired.
	CollateralExpired bool

	// TDX is set for a TDX quote (and Report is then zero): the TD report,
	// the module's identity and status. For TDX, Status merges the TDX
	// level, module and QE statuses, and Advisories are those of the TDX
	// level and the module level.
	TDX *TDXResult
}

// FMSPC returns the platform's FMSPC from the PCK certificate.
func (r *Result) FMSPC() [6]byte { return r.PCK.FMSPC }

// Verify verifies a quote, raw or wrapped in an Open Enclave header.
//
// On success it returns the Result and nil, whatever the TCB status. When the
// only failure is that the collateral is not valid at the verification time,
// it returns the complete Result (CollateralExpired set) together with an
// error matching ErrCollateralExpired. Otherwise it returns nil and an *Error.
func (v *Verifier) Verify(ctx context.Context, quote []byte) (*Result, error) {
	now := time.Now()
	if v.Now != nil {
		now = v.Now()
	}

	// Step 1: parse and sanity-check the quote.
	if tdxquote.IsTDX(quote) {
		return v.verifyTDX(ctx, quote, now)
	}
	q, err := sgxquote.ParseAny(quote)
	if err != nil {
		if errors.Is(err, sgxquote.ErrUnsupported) {
			return nil, fail(StepParse, ErrUnsupported, err)
		}
		return nil, fail(StepParse, ErrFormat, err)
	}
	c, err := v.verifyCommon(ctx, keySGX, evidence{
		vendor: q.Header.QEVendorID, chain: q.PCKChain, qeReport: &q.QEReport, qeReportSig: q.QEReportSignature[:],
		attKey: q.AttestationKey[:], authData: q.QEAuthData, signed: q.SignedData(), sig: q.Signature[:],
	}, now, v.Collateral)
	if err != nil {
		return nil, err
	}
	ext, ca, validity := c.ext, c.ca, &c.validity

	// Step 3: TCB info.
	info, err := c.tcbInfo(now)
	if err != nil {
		return nil, err
	}
	switch {
	case info.FMSPC != ext.FMSPC:
		return nil, fail(StepTCBInfo, ErrCollateral, fmt.Errorf("FMSPC %X, but the PCK certificate's is %X", info.FMSPC, ext.FMSPC))
	case info.PCEID != ext.PCEID:
		return nil, fail(StepTCBInfo, ErrCollateral, fmt.Errorf("PCE-ID %X, but the PCK certificate's is %X", info.PCEID, ext.PCEID))
	}
	validity.add("TCB info", info.IssueDate, info.NextUpdate, now)

	// Step 4: QE identity.
	qeID, err := c.qeIdentity(now, idQEIdentityQE, false)
	if err != nil {
		return nil, err
	}
	c.remember() // every check of the collateral alone passed
	validity.add("QE identity", qeID.IssueDate, qeID.NextUpdate, now)

	// Step 8: the QE matches its identity; its TCB level.
	qeLevel, err := matchQE(&q.QEReport, qeID)
	if err != nil {
		return nil, err
	}
	qeStatus, err := tcbstatus.Parse(qeLevel.Status)
	if err != nil {
		return nil, fail(StepQEMatch, ErrCollateral, err)
	}
	switch qeStatus {
	case tcbstatus.UpToDate, tcbstatus.OutOfDate, tcbstatus.Revoked:
	default:
		return nil, fail(StepQEMatch, ErrCollateral, fmt.Errorf("QE TCB status %s (QE levels are UpToDate, OutOfDate or Revoked)", qeStatus))
	}

	// Step 10: the platform TCB level.
	level, ok := matchTCB(info.Levels, ext)
	if !ok {
		return nil, fail(StepTCBLevel, ErrTCBNotSupported, fmt.Errorf("no TCB level of FMSPC %X applies to PCESVN %d, component SVNs %v", ext.FMSPC, ext.PCESVN, ext.CompSVN))
	}
	platformStatus, err := tcbstatus.Parse(level.Status)
	if err != nil {
		return nil, fail(StepTCBLevel, ErrCollateral, err)
	}

	// Step 11: converge.
	res := &Result{
		Status:                  tcbstatus.Converge(platformStatus, qeStatus),
		PlatformStatus:          platformStatus,
		QEStatus:                qeStatus,
		Advisories:              slices.Clone(level.Advisories),
		QEAdvisories:            slices.Clone(qeLevel.Advisories),
		TCBDate:                 level.Date,
		TCBEvaluationDataNumber: info.TCBEvaluationDataNumber,
		Version:                 q.Header.Version,
		Report:                  q.Body,
		QEReport:                q.QEReport,
		PCK:                     *ext,
		CA:                      ca,
		CollateralExpiry:        validity.until,
		CollateralExpired:       len(validity.problems) > 0,
	}
	if res.CollateralExpired {
		return res, fail(StepCollateralTime, ErrCollateralExpired, fmt.Errorf("verification time %s: %s",
			now.UTC().Format(time.RFC3339), strings.Join(validity.problems, "; ")))
	}
	return res, nil
}

// anchor decides whether the root a chain presents is trusted.
func (v *Verifier) anchor(presented *x509.Certificate) (*x509.Certificate, error) {
	if v.RootCA != nil {
		if !bytes.Equal(presented.Raw, v.RootCA.Raw) {
			return nil, fmt.Errorf("chain root %q is not the configured root", presented.Subject.CommonName)
		}
		return v.RootCA, nil
	}
	if sum := sha256.Sum256(presented.Raw); hex.EncodeToString(sum[:]) != IntelRootCASHA256 {
		return nil, fmt.Errorf("chain root %q (SHA-256 %x) is not the Intel SGX Root CA", presented.Subject.CommonName, sum)
	}
	if err := presented.CheckSignatureFrom(presented); err != nil {
		return nil, fmt.Errorf("pinned root is not self-signed: %w", err)
	}
	return presented, nil
}

// verifyChain verifies chain[0] through chain[1:len-1] to root at now.
// The chain's last certificate must be root itself.
func verifyChain(chain []*x509.Certificate, root *x509.Certificate, now time.Time) error {
	if len(chain) < 2 {
		return kinded(ErrBadChain, "%d certificates, want at least signer and root", len(chain))
	}
	if last := chain[len(chain)-1]; !bytes.Equal(last.Raw, root.Raw) {
		return kinded(ErrUntrustedRoot, "chain ends in %q, not the trusted root", last.Subject.CommonName)
	}
	roots := x509.NewCertPool()
	roots.AddCert(root)
	inters := x509.NewCertPool()
	for _, c := range chain[1 : len(chain)-1] {
		inters.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inters,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		// The chain ends in the trusted root, so any failure (a bad
		// signature, a validity period, a constraint) is the chain's.
		return kinded(ErrBadChain, "%w", err)
	}
	return nil
}

// checkCRL checks that crl names issuer as its issuer and is signed by it,
// and records its validity window. For the PCK CRL the issuer is the
// verified intermediate, whose subject is the PCK leaf's issuer.
func checkCRL(crl *x509.RevocationList, issuer *x509.Certificate, v *validity, name string, now time.Time) error {
	if crl == nil {
		return kinded(ErrCollateral, "%s missing", name)
	}
	if !bytes.Equal(crl.RawIssuer, issuer.RawSubject) {
		return kinded(ErrBadCRL, "issued by %q, want %q", crl.Issuer.CommonName, issuer.Subject.CommonName)
	}
	if err := crl.CheckSignatureFrom(issuer); err != nil {
		return kinded(ErrBadCRL, "%w: %w", ErrBadSignature, err)
	}
	v.add(name, crl.ThisUpdate, crl.NextUpdate, now)
	return nil
}

func isRevoked(crl *x509.RevocationList, c *x509.Certificate) bool {
	for _, e := range crl.RevokedCertificateEntries {
		if e.SerialNumber != nil && e.SerialNumber.Cmp(c.SerialNumber) == 0 {
			return true
		}
	}
	return false
}

// checkSigned verifies a signed collateral document: its issuer chain (TCB
// Signing certificate, root) at now, the signer not revoked by the root CA
// CRL, and the signature over the exact bytes.
func checkSigned(raw, sig []byte, chain []*x509.Certificate, root *x509.Certificate, rootCRL *x509.RevocationList, now time.Time) error {
	if len(raw) == 0 || len(chain) == 0 {
		return kinded(ErrCollateral, "document or issuer chain missing")
	}
	signer := chain[0]
	if !strings.Contains(signer.Subject.CommonName, cnTCBSigning) {
		return kinded(ErrBadChain, "signer CN %q is not a TCB Signing certificate", signer.Subject.CommonName)
	}
	if err := verifyChain(chain, root, now); err != nil {
		return err
	}
	if isRevoked(rootCRL, signer) {
		return kinded(ErrRevoked, "%s (serial %x)", signer.Subject.CommonName, signer.SerialNumber)
	}
	key, err := p256Key(signer)
	if err != nil {
		return kinded(ErrUnsupported, "%w", err)
	}
	if !verifyRaw(key, raw, sig) {
		return kinded(ErrBadSignature, "signature over the document does not verify")
	}
	return nil
}

// kindError is an internal failure tagged with its ErrX kind; its text is
// the detail only, so that *Error does not repeat the kind.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

func kinded(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

// kindOf returns the kind of an error from kinded.
func kindOf(err error) error {
	if ke, ok := errors.AsType[*kindError](err); ok {
		return ke.kind
	}
	return ErrCollateral
}

func p256Key(c *x509.Certificate) (*ecdsa.PublicKey, error) {
	k, ok := c.PublicKey.(*ecdsa.PublicKey)
	if !ok || k.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%q does not have an ECDSA P-256 key", c.Subject.CommonName)
	}
	return k, nil
}

// verifyRaw verifies an ECDSA-SHA256 signature given as raw r‖s.
func verifyRaw(pub *ecdsa.PublicKey, data, sig []byte) bool {
	if len(sig) != 64 {
		return false
	}
	digest := sha256.Sum256(data)
	r := new(big.Int).SetBytes(sig[:32])
	s := new(big.Int).SetBytes(sig[32:])
	return ecdsa.Verify(pub, digest[:], r, s)
}

// validity collects the collateral's validity windows.
type validity struct {
	until    time.Time
	problems []string
}

func (v *validity) add(name string, from, until time.Time, now time.Time) {
	if v.until.IsZero() || until.Before(v.until) {
		v.until = until
	}
	if now.Before(from) || !now.Before(until) {
		v.problems = append(v.problems, fmt.Sprintf("%s valid from %s until %s",
			name, from.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339)))
	}
}

// matchQE checks the QE report against the QE identity (QVL 4.1.2.9.5–10)
// and returns the QE's TCB level.
func matchQE(r *sgxquote.ReportBody, id *collateral.QEIdentity) (collateral.QELevel, error) {
	if r.MiscSelect()&id.MiscSelectMask != id.MiscSelect {
		return collateral.QELevel{}, fail(StepQEMatch, ErrQEIdentity, fmt.Errorf("MISCSELECT %08x masked with %08x is not %08x", r.MiscSelect(), id.MiscSelectMask, id.MiscSelect))
	}
	attr := r.AttributesRaw()
	for i := range attr {
		if attr[i]&id.AttributesMask[i] != id.Attributes[i] {
			return collateral.QELevel{}, fail(StepQEMatch, ErrQEIdentity, fmt.Errorf("attributes %x masked with %x are not %x", attr, id.AttributesMask, id.Attributes))
		}
	}
	if r.MRSIGNER() != id.MRSIGNER {
		return collateral.QELevel{}, fail(StepQEMatch, ErrQEIdentity, fmt.Errorf("MRSIGNER %x, want %x", r.MRSIGNER(), id.MRSIGNER))
	}
	if r.ISVProdID() != id.ISVProdID {
		return collateral.QELevel{}, fail(StepQEMatch, ErrQEIdentity, fmt.Errorf("ISVPRODID %d, want %d", r.ISVProdID(), id.ISVProdID))
	}
	levels := slices.Clone(id.Levels)
	slices.SortStableFunc(levels, func(a, b collateral.QELevel) int { return cmp.Compare(b.ISVSVN, a.ISVSVN) })
	for _, l := range levels {
		if l.ISVSVN <= r.ISVSVN() {
			return l, nil
		}
	}
	return collateral.QELevel{}, fail(StepQEMatch, ErrTCBNotSupported, fmt.Errorf("QE ISVSVN %d is below every QE TCB level", r.ISVSVN()))
}

// matchTCB returns the highest TCB level that the platform's component SVNs
// and PCESVN all reach (QVL matchTcbLevels). Levels are ordered descending
// (component SVNs lexicographically, then PCESVN) first, as QVL keeps them.
func matchTCB(levels []collateral.TCBLevel, ext *pck.Extension) (collateral.TCBLevel, bool) {
	sorted := slices.Clone(levels)
	slices.SortStableFunc(sorted, func(a, b collateral.TCBLevel) int {
		if c := bytes.Compare(b.CompSVN[:], a.CompSVN[:]); c != 0 {
			return c
		}
		return cmp.Compare(b.PCESVN, a.PCESVN)
	})
	for _, l := range sorted {
		if ext.PCESVN < l.PCESVN {
			continue
		}
		ok := true
		for i := range l.CompSVN {
			if ext.CompSVN[i] < l.CompSVN[i] {
				ok = false
				break
			}
		}
		if ok {
			return l, true
		}
	}
	return collateral.TCBLevel{}, false
}
