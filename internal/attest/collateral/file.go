package collateral

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// FromQVLJSON decodes collateral in the JSON shape of dcap-qvl's
// QuoteCollateralV3: PEM issuer chains, the signed documents as JSON strings
// holding the exact signed text, signatures and CRLs as hex.
func FromQVLJSON(data []byte) (*Collateral, error) {
	var j struct {
		PCKCRLIssuerChain     string `json:"pck_crl_issuer_chain"`
		RootCACRL             string `json:"root_ca_crl"`
		PCKCRL                string `json:"pck_crl"`
		TCBInfoIssuerChain    string `json:"tcb_info_issuer_chain"`
		TCBInfo               string `json:"tcb_info"`
		TCBInfoSignature      string `json:"tcb_info_signature"`
		QEIdentityIssuerChain string `json:"qe_identity_issuer_chain"`
		QEIdentity            string `json:"qe_identity"`
		QEIdentitySignature   string `json:"qe_identity_signature"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	c := &Collateral{TCBInfo: []byte(j.TCBInfo), QEIdentity: []byte(j.QEIdentity)}
	var err error
	if c.TCBInfoSignature, err = hex.DecodeString(j.TCBInfoSignature); err != nil {
		return nil, fmt.Errorf("%w: tcb_info_signature: %w", ErrFormat, err)
	}
	if c.QEIdentitySignature, err = hex.DecodeString(j.QEIdentitySignature); err != nil {
		return nil, fmt.Errorf("%w: qe_identity_signature: %w", ErrFormat, err)
	}
	if c.TCBInfoIssuerChain, err = ParseChain([]byte(j.TCBInfoIssuerChain)); err != nil {
		return nil, fmt.Errorf("tcb_info_issuer_chain: %w", err)
	}
	if c.QEIdentityIssuerChain, err = ParseChain([]byte(j.QEIdentityIssuerChain)); err != nil {
		return nil, fmt.Errorf("qe_identity_issuer_chain: %w", err)
	}
	if c.PCKCRLIssuerChain, err = ParseChain([]byte(j.PCKCRLIssuerChain)); err != nil {
		return nil, fmt.Errorf("pck_crl_issuer_chain: %w", err)
	}
	if c.PCKCRL, err = ParseCRL([]byte(j.PCKCRL)); err != nil {
		return nil, fmt.Errorf("pck_crl: %w", err)
	}
	if c.RootCACRL, err = ParseCRL([]byte(j.RootCACRL)); err != nil {
		return nil, fmt.Errorf("root_ca_crl: %w", err)
	}
	return c, nil
}

// File names of collateral stored as raw PCS/PCCS responses in a directory.
// The JSON files hold the response bodies exactly as served; the chain files
// the URL-decoded issuer-chain headers; CRLs may be DER, hex or PEM.
const (
	FileTCBInfo               = "tcbinfo.json"                // GET tcb?fmspc=…
	FileTCBInfoIssuerChain    = "tcbinfo-issuer-chain.pem"    // TCB-Info-Issuer-Chain
	FileQEIdentity            = "qeidentity.json"             // GET qe/identity
	FileQEIdentityIssuerChain = "qeidentity-issuer-chain.pem" // SGX-Enclave-Identity-Issuer-Chain
	FileRootCACRL             = "rootcacrl.der"               // GET rootcacrl
)

// FilePCKCRL is the file name of the PCK CRL of ca (GET pckcrl?ca=…).
func FilePCKCRL(ca CA) string { return "pckcrl-" + string(ca) + ".der" }

// FilePCKCRLIssuerChain is the file name of the PCK CRL's issuer chain
// (SGX-PCK-CRL-Issuer-Chain).
func FilePCKCRLIssuerChain(ca CA) string { return "pckcrl-" + string(ca) + "-issuer-chain.pem" }

// FromFS reads collateral for ca stored as raw PCS/PCCS responses under the
// file names above. A missing file gives an error matching ErrNotFound.
func FromFS(fsys fs.FS, ca CA) (*Collateral, error) {
	read := func(name string) ([]byte, error) {
		b, err := fs.ReadFile(fsys, name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
		}
		return b, err
	}
	var c Collateral
	for _, f := range []struct {
		name  string
		parse func([]byte) error
	}{
		{FileTCBInfo, func(b []byte) (err error) { c.TCBInfo, c.TCBInfoSignature, err = SplitTCBInfoBody(b); return }},
		{FileTCBInfoIssuerChain, func(b []byte) (err error) { c.TCBInfoIssuerChain, err = ParseChain(b); return }},
		{FileQEIdentity, func(b []byte) (err error) { c.QEIdentity, c.QEIdentitySignature, err = SplitQEIdentityBody(b); return }},
		{FileQEIdentityIssuerChain, func(b []byte) (err error) { c.QEIdentityIssuerChain, err = ParseChain(b); return }},
		{FilePCKCRL(ca), func(b []byte) (err error) { c.PCKCRL, err = ParseCRL(b); return }},
		{FilePCKCRLIssuerChain(ca), func(b []byte) (err error) { c.PCKCRLIssuerChain, err = ParseChain(b); return }},
		{FileRootCACRL, func(b []byte) (err error) { c.RootCACRL, err = ParseCRL(b); return }},
	} {
		b, err := read(f.name)
		if err != nil {
			return nil, err
		}
		if err := f.parse(b); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return &c, nil
}

// File is a Provider that reads collateral from Path on every Get: a JSON
// file in dcap-qvl's shape (FromQVLJSON), or a directory of raw PCS/PCCS
// responses (FromFS). Such a source holds collateral for one platform; the
// verifier rejects it for a quote of another FMSPC. Wrap it in a Cache to
// avoid reading the files for every quote.
type File struct{ Path string }

var _ Provider = File{}

// Get reads the collateral. fmspc is not used; ca selects the PCK CRL files
// of a directory.
func (f File) Get(_ context.Context, _ [6]byte, ca CA) (*Collateral, error) {
	info, err := os.Stat(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		return FromFS(os.DirFS(f.Path), ca)
	}
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, err
	}
	return FromQVLJSON(data)
}
