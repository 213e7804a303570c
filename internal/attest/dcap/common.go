package dcap

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/pck"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// evidence is what SGX and TDX quotes share: the QE's report and the PCK
// certification data that vouch for the attestation key, and the
// attestation key's signature over the quote's signed region.
type evidence struct {
	vendor      [16]byte
	chain       func() ([]*x509.Certificate, error)
	qeReport    *sgxquote.ReportBody
	qeReportSig []byte
	attKey      []byte
	authData    []byte
	signed      []byte
	sig         []byte
}

// verified is what verifyCommon established.
type verified struct {
	root, leaf, inter *x509.Certificate
	ext               *pck.Extension
	ca                collateral.CA
	col               *collateral.Collateral
	validity          validity
	// key is the collateral's cache key; checked is what an earlier
	// verification established about it (nil: check it in full), fresh
	// what this one establishes, stored under key once it succeeded.
	key     collateralKey
	checked *checkedCollateral
	fresh   checkedCollateral
}

// collateralSource fetches the collateral of one kind of quote.
type collateralSource interface {
	Get(ctx context.Context, fmspc [6]byte, ca collateral.CA) (*collateral.Collateral, error)
}

// verifyCommon runs the checks SGX and TDX quotes share: QE vendor, PCK
// chain to the trusted root, QE report signature and binding, the quote
// signature, collateral retrieval, both CRLs (steps 1, 2, 5, 6, 7, 9).
func (v *Verifier) verifyCommon(ctx context.Context, kind byte, e evidence, now time.Time, src collateralSource) (*verified, error) {
	if e.vendor != sgxquote.IntelQEVendorID() {
		return nil, fail(StepParse, ErrUnsupported, fmt.Errorf("QE vendor ID %x is not Intel's", e.vendor))
	}
	chain, err := e.chain()
	if err != nil {
		if errors.Is(err, sgxquote.ErrUnsupported) || errors.Is(err, tdxquote.ErrUnsupported) {
			return nil, fail(StepParse, ErrUnsupported, err)
		}
		return nil, fail(StepPCKChain, ErrFormat, err)
	}
	if len(chain) != 3 {
		return nil, fail(StepPCKChain, ErrBadChain, fmt.Errorf("%d certificates, want leaf, intermediate and root", len(chain)))
	}
	c := &verified{leaf: chain[0], inter: chain[1]}

	// Step 2: trust anchor.
	if c.root, err = v.anchor(chain[2]); err != nil {
		return nil, fail(StepRootCA, ErrUntrustedRoot, err)
	}

	// Step 5 (chain part): PCK leaf → intermediate → root, valid now.
	if !strings.Contains(c.leaf.Subject.CommonName, cnPCKLeaf) {
		return nil, fail(StepPCKChain, ErrBadChain, fmt.Errorf("leaf CN %q does not name a PCK certificate", c.leaf.Subject.CommonName))
	}
	switch c.inter.Subject.CommonName {
	case cnProcessorCA:
		c.ca = collateral.CAProcessor
	case cnPlatformCA:
		c.ca = collateral.CAPlatform
	default:
		return nil, fail(StepPCKChain, ErrBadChain, fmt.Errorf("intermediate CN %q is not a PCK CA", c.inter.Subject.CommonName))
	}
	if err := verifyChain(chain, c.root, now); err != nil {
		return nil, fail(StepPCKChain, kindOf(err), err)
	}
	if c.ext, err = pck.FromCertificate(c.leaf); err != nil {
		return nil, fail(StepPCKChain, ErrFormat, err)
	}

	// Step 6: the PCK key signs the QE report.
	pckKey, err := p256Key(c.leaf)
	if err != nil {
		return nil, fail(StepQEReportSig, ErrUnsupported, err)
	}
	if !verifyRaw(pckKey, e.qeReport[:], e.qeReportSig) {
		return nil, fail(StepQEReportSig, ErrBadSignature, errors.New("QE report not signed by the PCK key"))
	}

	// Step 7: the QE report binds the attestation key.
	h := sha256.New()
	h.Write(e.attKey)
	h.Write(e.authData)
	rd := e.qeReport.ReportData()
	if !bytes.Equal(rd[:32], h.Sum(nil)) {
		return nil, fail(StepQEBinding, ErrBinding, errors.New("SHA-256(attestation key ‖ QE auth data) differs from QE report data"))
	}
	if [32]byte(rd[32:]) != [32]byte{} {
		return nil, fail(StepQEBinding, ErrBinding, errors.New("upper half of QE report data is not zero"))
	}

	// Step 9: the attestation key signs the quote's signed region.
	ak, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append([]byte{4}, e.attKey...))
	if err != nil {
		return nil, fail(StepISVSignature, ErrFormat, fmt.Errorf("attestation key: %w", err))
	}
	if !verifyRaw(ak, e.signed, e.sig) {
		return nil, fail(StepISVSignature, ErrBadSignature, errors.New("report not signed by the attestation key"))
	}

	// Collateral for this platform.
	if src == nil {
		return nil, fail(StepFetchCollateral, ErrCollateralUnavailable, errors.New("no collateral provider configured"))
	}
	if c.col, err = src.Get(ctx, c.ext.FMSPC, c.ca); err != nil {
		return nil, fail(StepFetchCollateral, ErrCollateralUnavailable, err)
	}
	if c.col == nil {
		return nil, fail(StepFetchCollateral, ErrCollateralUnavailable, errors.New("provider returned no collateral"))
	}

	c.key = keyOf(kind, c.col, c.root, c.inter)
	if checked := lookupCollateral(c.key); checked != nil && checked.validAt(now) {
		c.checked = checked // cache.go: only the time is checked again
	}

	// Step 2/5: root CA CRL; the intermediate must not be revoked.
	if c.checked != nil {
		c.validity.add("root CA CRL", c.col.RootCACRL.ThisUpdate, c.col.RootCACRL.NextUpdate, now)
	} else if err := checkCRL(c.col.RootCACRL, c.root, &c.validity, "root CA CRL", now); err != nil {
		return nil, fail(StepRootCACRL, kindOf(err), err)
	}
	if isRevoked(c.col.RootCACRL, c.inter) {
		return nil, fail(StepRootCACRL, ErrRevoked, fmt.Errorf("%s (serial %x)", c.inter.Subject.CommonName, c.inter.SerialNumber))
	}
	// Step 5: PCK CRL; the leaf must not be revoked.
	if c.checked != nil {
		c.validity.add("PCK CRL", c.col.PCKCRL.ThisUpdate, c.col.PCKCRL.NextUpdate, now)
	} else if err := checkCRL(c.col.PCKCRL, c.inter, &c.validity, "PCK CRL", now); err != nil {
		return nil, fail(StepPCKCRL, kindOf(err), err)
	}
	if isRevoked(c.col.PCKCRL, c.leaf) {
		return nil, fail(StepPCKCRL, ErrRevoked, fmt.Errorf("PCK certificate (serial %x)", c.leaf.SerialNumber))
	}
	return c, nil
}

// tcbInfo returns the TCB info of an SGX quote's collateral: as an earlier
// verification checked it, or checked now (signature, issuer chain, signer
// not revoked; decoded; id "SGX" for version 3).
func (c *verified) tcbInfo(now time.Time) (*collateral.TCBInfo, error) {
	if c.checked != nil {
		return c.checked.tcbInfo, nil
	}
	col := c.col
	if err := checkSigned(col.TCBInfo, col.TCBInfoSignature, col.TCBInfoIssuerChain, c.root, col.RootCACRL, now); err != nil {
		return nil, fail(StepTCBInfo, kindOf(err), err)
	}
	info, err := collateral.ParseTCBInfo(col.TCBInfo)
	if err != nil {
		return nil, fail(StepTCBInfo, ErrCollateral, err)
	}
	if info.Version == 3 && info.ID != idTCBInfoSGX {
		return nil, fail(StepTCBInfo, ErrCollateral, fmt.Errorf("id %q, want %q", info.ID, idTCBInfoSGX))
	}
	c.fresh.tcbInfo = info
	return info, nil
}

// tdxTCBInfo is tcbInfo for a TDX quote (id "TDX").
func (c *verified) tdxTCBInfo(now time.Time) (*collateral.TDXTCBInfo, error) {
	if c.checked != nil {
		return c.checked.tdxInfo, nil
	}
	col := c.col
	if err := checkSigned(col.TCBInfo, col.TCBInfoSignature, col.TCBInfoIssuerChain, c.root, col.RootCACRL, now); err != nil {
		return nil, fail(StepTCBInfo, kindOf(err), err)
	}
	info, err := collateral.ParseTDXTCBInfo(col.TCBInfo)
	if err != nil {
		return nil, fail(StepTCBInfo, ErrCollateral, err)
	}
	if info.ID != idTCBInfoTDX {
		return nil, fail(StepTCBInfo, ErrCollateral, fmt.Errorf("id %q, want %q for a TDX quote", info.ID, idTCBInfoTDX))
	}
	c.fresh.tdxInfo = info
	return info, nil
}

// qeIdentity returns the QE identity of the collateral, as an earlier
// verification checked it or checked now; want is its id ("QE" for SGX,
// "TD_QE" for TDX), forTDX adds that to the message.
func (c *verified) qeIdentity(now time.Time, want string, forTDX bool) (*collateral.QEIdentity, error) {
	if c.checked != nil {
		return c.checked.qeID, nil
	}
	col := c.col
	if err := checkSigned(col.QEIdentity, col.QEIdentitySignature, col.QEIdentityIssuerChain, c.root, col.RootCACRL, now); err != nil {
		return nil, fail(StepQEIdentity, kindOf(err), err)
	}
	qeID, err := collateral.ParseQEIdentity(col.QEIdentity)
	if err != nil {
		return nil, fail(StepQEIdentity, ErrCollateral, err)
	}
	if qeID.ID != want {
		msg := fmt.Errorf("id %q, want %q", qeID.ID, want)
		if forTDX {
			msg = fmt.Errorf("id %q, want %q for a TDX quote", qeID.ID, want)
		}
		return nil, fail(StepQEIdentity, ErrCollateral, msg)
	}
	c.fresh.qeID = qeID
	return qeID, nil
}

// remember keeps what this verification established about its collateral
// (cache.go), once every check of the collateral passed.
func (c *verified) remember() {
	if c.checked != nil {
		return
	}
	c.fresh.chains = [][]*x509.Certificate{c.col.TCBInfoIssuerChain, c.col.QEIdentityIssuerChain}
	storeCollateral(c.key, &c.fresh)
}
