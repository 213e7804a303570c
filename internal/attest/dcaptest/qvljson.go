package dcaptest

import (
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// QVLJSON serialises c in the JSON shape of dcap-qvl's QuoteCollateralV3
// (the shape of the Phala vector's sgx_quote_collateral.json), which
// collateral.FromQVLJSON and the Coordinator's --collateral-file read: PEM
// issuer chains, the signed documents as strings, signatures and CRLs as hex.
func QVLJSON(tb testing.TB, c *collateral.Collateral) []byte {
	tb.Helper()
	doc := map[string]string{
		"pck_crl_issuer_chain":     string(PEM(c.PCKCRLIssuerChain...)),
		"root_ca_crl":              hex.EncodeToString(c.RootCACRL.Raw),
		"pck_crl":                  hex.EncodeToString(c.PCKCRL.Raw),
		"tcb_info_issuer_chain":    string(PEM(c.TCBInfoIssuerChain...)),
		"tcb_info":                 string(c.TCBInfo),
		"tcb_info_signature":       hex.EncodeToString(c.TCBInfoSignature),
		"qe_identity_issuer_chain": string(PEM(c.QEIdentityIssuerChain...)),
		"qe_identity":              string(c.QEIdentity),
		"qe_identity_signature":    hex.EncodeToString(c.QEIdentitySignature),
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		tb.Fatalf("dcaptest: collateral JSON: %v", err)
	}
	return b
}

// PEM encodes certificates as concatenated PEM CERTIFICATE blocks.
func PEM(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}
