package app

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"time"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/collateral/pccs"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/gramine"
	"github.com/quarry-cc/quarry/internal/attest/tsm"
	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/core"
)

// pccsTimeout bounds one collateral request to a PCCS.
const pccsTimeout = 30 * time.Second

// issuer chooses how the Coordinator obtains its quotes.
func (a *App) issuer() (attest.Issuer, error) {
	dir := a.cfg.GramineDir
	switch a.cfg.Attestation {
	case config.AttestationGramine:
		typ, err := gramine.Detect(dir)
		if err != nil {
			return nil, fmt.Errorf("attestation gramine: %w (is the Coordinator running in Gramine with sgx.remote_attestation = \"dcap\"?)", err)
		}
		if typ != gramine.TypeDCAP {
			return nil, fmt.Errorf("attestation gramine: Gramine's attestation type is %q; DCAP is needed (sgx.remote_attestation = \"dcap\" in the Gramine manifest)", typ)
		}
		a.log.Info("attestation: Gramine DCAP quotes", "dir", dir)
		return &gramine.Issuer{Dir: dir}, nil
	case config.AttestationTDX:
		provider, err := tsm.Detect(a.cfg.TSMReportDir)
		if err != nil {
			return nil, fmt.Errorf("attestation tdx: %w (is the Coordinator running in a TDX guest with configfs-tsm, Linux 6.7 or later?)", err)
		}
		if provider != tsm.ProviderTDX {
			return nil, fmt.Errorf("attestation tdx: the configfs-tsm provider is %q, not %s", provider, tsm.ProviderTDX)
		}
		a.log.Info("attestation: TDX quotes through configfs-tsm", "dir", a.cfg.TSMReportDir)
		return &tsm.Issuer{Dir: a.cfg.TSMReportDir}, nil
	case config.AttestationAuto:
		typ, err := gramine.Detect(dir)
		if errors.Is(err, fs.ErrNotExist) {
			if provider, terr := tsm.Detect(a.cfg.TSMReportDir); terr == nil && provider == tsm.ProviderTDX {
				a.log.Info("attestation: TDX guest detected (configfs-tsm)", "dir", a.cfg.TSMReportDir)
				return &tsm.Issuer{Dir: a.cfg.TSMReportDir}, nil
			}
		}
		switch {
		case err == nil && typ == gramine.TypeDCAP:
			a.log.Info("attestation: Gramine DCAP detected", "dir", dir)
			return &gramine.Issuer{Dir: dir}, nil
		case err == nil:
			a.log.Warn("attestation: Gramine's attestation type is not dcap; running in simulation", "dir", dir, "type", typ)
		case errors.Is(err, fs.ErrNotExist):
			a.log.Info("attestation: no Gramine attestation files; running in simulation", "dir", dir)
		default:
			return nil, fmt.Errorf("attestation auto: %w", err)
		}
	default:
		if a.cfg.OESimulation {
			a.log.Info("attestation: OE_SIMULATION=1; running in simulation")
		}
	}
	return attest.SimulationIssuer{}, nil
}

// quoteVerifier builds the DCAP verifier for sign-quote and Marble
// activation from the configured collateral source; without one it returns
// nil (both then say so; in simulation Marble quotes are not checked).
func (a *App) quoteVerifier() (core.QuoteVerifier, error) {
	var src collateral.Provider
	switch {
	case a.cfg.CollateralFile != "":
		src = collateral.File{Path: a.cfg.CollateralFile}
		a.log.Info("quote verification: collateral from a file", "path", a.cfg.CollateralFile)
	case a.cfg.PCCSURL != "":
		src = &pccs.Client{BaseURL: a.cfg.PCCSURL, HTTPClient: &http.Client{Timeout: pccsTimeout}}
		a.log.Info("quote verification: collateral from a PCCS", "url", a.cfg.PCCSURL)
	default:
		a.log.Info("quote verification unavailable: no collateral source (--collateral-file or --pccs-url); sign-quote will refuse, and so will Marble activations unless the Coordinator runs in simulation")
		return nil, nil
	}
	a.collateral = collateral.NewCache(src, nil)
	v := &dcap.Verifier{Collateral: a.collateral}
	if a.cfg.SGXRootCA != "" {
		root, err := readRootCA(a.cfg.SGXRootCA)
		if err != nil {
			return nil, fmt.Errorf("sgx-root-ca: %w", err)
		}
		v.RootCA = root
		a.log.Warn("quote verification: the configured root CA replaces the pinned Intel SGX Root CA",
			"file", a.cfg.SGXRootCA, "subject", root.Subject.String())
	}
	return v, nil
}

// readRootCA reads a PEM file holding exactly one self-signed CA certificate.
func readRootCA(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, rest := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM CERTIFICATE block", path)
	}
	if next, _ := pem.Decode(rest); next != nil {
		return nil, fmt.Errorf("%s: more than one PEM block; give only the root certificate", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !c.IsCA || c.CheckSignatureFrom(c) != nil {
		return nil, fmt.Errorf("%s: not a self-signed CA certificate", path)
	}
	return c, nil
}
