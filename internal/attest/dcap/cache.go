package dcap

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"hash"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// What a verification established about a collateral alone is kept, so
// that the next quote of the same platform does not check it again: the
// CRLs' and the signed documents' signatures, the documents' issuer chains
// up to the trusted root, their signers not revoked, and the decoded
// documents. It is kept by the SHA-256 of every byte it was established
// from (the collateral's documents, signatures, issuer chains and CRLs, the
// trusted root and the PCK CA whose CRL was checked, and the kind of quote),
// never by where the collateral came from, so different bytes are always
// verified afresh. Everything that depends on the time is checked again at
// every use with the verification time: the CRLs' and the documents'
// validity windows (ErrCollateralExpired), and the validity periods of the
// issuer chains' certificates; when one of these certificates is not valid
// at that time, the verification runs in full and reports what it finds.
// Everything that depends on the quote (revocation of its PCK certificates,
// the FMSPC, the TCB levels) is checked at every use as well.

// maxCachedCollaterals bounds the cache: a Coordinator sees the collateral
// of a few platforms, each in a few versions at once while Intel's next
// update spreads.
const maxCachedCollaterals = 64

// checkedCollateral is what a verification established about one
// collateral.
type checkedCollateral struct {
	tcbInfo *collateral.TCBInfo    // SGX
	tdxInfo *collateral.TDXTCBInfo // TDX
	qeID    *collateral.QEIdentity
	// chains are the documents' issuer chains, whose validity periods are
	// checked at every use.
	chains [][]*x509.Certificate
}

// validAt reports whether every certificate of the issuer chains is
// within its validity period at now (as x509.Certificate.Verify checks).
func (c *checkedCollateral) validAt(now time.Time) bool {
	for _, chain := range c.chains {
		for _, cert := range chain {
			if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
				return false
			}
		}
	}
	return true
}

type collateralKey [sha256.Size]byte

// checkedCollaterals is the process-wide cache (a Verifier is a value that
// callers copy; what is cached depends only on the key's bytes).
var checkedCollaterals = struct {
	sync.Mutex
	m map[collateralKey]*checkedCollateral
}{m: map[collateralKey]*checkedCollateral{}}

func lookupCollateral(k collateralKey) *checkedCollateral {
	checkedCollaterals.Lock()
	defer checkedCollaterals.Unlock()
	return checkedCollaterals.m[k]
}

func storeCollateral(k collateralKey, c *checkedCollateral) {
	checkedCollaterals.Lock()
	defer checkedCollaterals.Unlock()
	if _, ok := checkedCollaterals.m[k]; !ok && len(checkedCollaterals.m) >= maxCachedCollaterals {
		for old := range checkedCollaterals.m { // one at random
			delete(checkedCollaterals.m, old)
			break
		}
	}
	checkedCollaterals.m[k] = c
}

// Kinds of quote in the key: the documents are decoded differently.
const (
	keySGX byte = 1
	keyTDX byte = 2
)

// keyOf returns the key of col as checked against root and the PCK CA
// inter for a quote of kind.
func keyOf(kind byte, col *collateral.Collateral, root, inter *x509.Certificate) collateralKey {
	h := sha256.New()
	h.Write([]byte{kind})
	part := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	chain := func(certs []*x509.Certificate) {
		part(binary.BigEndian.AppendUint64(nil, uint64(len(certs))))
		for _, c := range certs {
			part(c.Raw)
		}
	}
	part(root.Raw)
	part(inter.Raw)
	part(col.TCBInfo)
	part(col.TCBInfoSignature)
	chain(col.TCBInfoIssuerChain)
	part(col.QEIdentity)
	part(col.QEIdentitySignature)
	chain(col.QEIdentityIssuerChain)
	part(crlRaw(col.PCKCRL))
	part(crlRaw(col.RootCACRL))
	return collateralKey(sum(h))
}

func crlRaw(c *x509.RevocationList) []byte {
	if c == nil {
		return nil
	}
	return c.Raw
}

func sum(h hash.Hash) (out [sha256.Size]byte) {
	h.Sum(out[:0])
	return out
}
