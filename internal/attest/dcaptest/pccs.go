package dcaptest

import (
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net/http"
	"net/url"
	"strings"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// PCCSPath is the path prefix a fake PCCS serves under.
const PCCSPath = "/sgx/certification/v4/"

// PCCSOptions choose how the fake PCCS encodes its answers.
type PCCSOptions struct {
	// DERCRLs serves CRLs as DER instead of hex (the PCCS default).
	DERCRLs bool
	// LegacyTCBHeader names the TCB info chain header SGX-TCB-Info-Issuer-Chain
	// (PCS v3) instead of TCB-Info-Issuer-Chain.
	LegacyTCBHeader bool
	// FormEncodedChains encodes the chain headers with '+' for space (Go's
	// url.QueryEscape) instead of Intel's %20.
	FormEncodedChains bool
}

// PCCSHandler serves c the way a PCCS does: tcb?fmspc=, qe/identity,
// pckcrl?ca=processor|platform and rootcacrl under PCCSPath, with
// URL-encoded issuer chains in the response headers. Any FMSPC and CA get the
// same collateral; unknown paths get 404.
func PCCSHandler(c *collateral.Collateral, o PCCSOptions) http.Handler {
	crl := func(l *x509.RevocationList) []byte {
		if o.DERCRLs {
			return l.Raw
		}
		return []byte(hex.EncodeToString(l.Raw))
	}
	signed := func(field string, raw, sig []byte) []byte {
		return []byte(`{"` + field + `":` + string(raw) + `,"signature":"` + hex.EncodeToString(sig) + `"}`)
	}
	tcbHeader := "TCB-Info-Issuer-Chain"
	if o.LegacyTCBHeader {
		tcbHeader = "SGX-TCB-Info-Issuer-Chain"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PCCSPath+"tcb", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("fmspc") == "" {
			http.Error(w, "fmspc missing", http.StatusBadRequest)
			return
		}
		w.Header().Set(tcbHeader, ChainHeader(c.TCBInfoIssuerChain, o.FormEncodedChains))
		w.Header().Set("Content-Type", "application/json")
		w.Write(signed("tcbInfo", c.TCBInfo, c.TCBInfoSignature))
	})
	mux.HandleFunc("GET "+PCCSPath+"qe/identity", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("SGX-Enclave-Identity-Issuer-Chain", ChainHeader(c.QEIdentityIssuerChain, o.FormEncodedChains))
		w.Header().Set("Content-Type", "application/json")
		w.Write(signed("enclaveIdentity", c.QEIdentity, c.QEIdentitySignature))
	})
	mux.HandleFunc("GET "+PCCSPath+"pckcrl", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("ca") {
		case "processor", "platform":
		default:
			http.Error(w, "bad ca", http.StatusBadRequest)
			return
		}
		w.Header().Set("SGX-PCK-CRL-Issuer-Chain", ChainHeader(c.PCKCRLIssuerChain, o.FormEncodedChains))
		w.Write(crl(c.PCKCRL))
	})
	mux.HandleFunc("GET "+PCCSPath+"rootcacrl", func(w http.ResponseWriter, r *http.Request) {
		w.Write(crl(c.RootCACRL))
	})
	return mux
}

// ChainHeader URL-encodes the PEM of certs as Intel's PCS does
// (encodeURIComponent: space as %20, '+' as %2B), or with '+' for space
// when form is set.
func ChainHeader(certs []*x509.Certificate, form bool) string {
	var p []byte
	for _, c := range certs {
		p = append(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	enc := url.QueryEscape(string(p))
	if form {
		return enc
	}
	return strings.ReplaceAll(enc, "+", "%20")
}
