// Package pccs fetches DCAP collateral from an Intel PCS or PCCS (API v4)
// over HTTP: TCB info, QE identity, the PCK CRL and the root CA CRL, with
// their URL-encoded issuer-chain headers. Wrap a Client in a
// collateral.Cache to reuse collateral until its nextUpdate.
package pccs

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// DefaultBaseURL is the Azure PCCS that MarbleRun uses by default.
const DefaultBaseURL = "https://global.acccache.azure.net/sgx/certification/v4/"

// maxBody bounds every response body read.
const maxBody = 1 << 20

// Issuer-chain response headers. PCS v3 named the TCB info one differently.
const (
	HeaderTCBInfoIssuerChain   = "TCB-Info-Issuer-Chain"
	HeaderTCBInfoIssuerChainV3 = "SGX-TCB-Info-Issuer-Chain"
	HeaderQEIdentityChain      = "SGX-Enclave-Identity-Issuer-Chain"
	HeaderPCKCRLIssuerChain    = "SGX-PCK-CRL-Issuer-Chain"
)

// ErrHTTP means the PCCS answered with an unexpected HTTP status.
var ErrHTTP = errors.New("pccs: unexpected HTTP status")

// Client fetches collateral from a PCS/PCCS. The collateral is signed and
// verified against the pinned root, so a PCCS with a self-signed TLS
// certificate (sgx_default_qcnl.conf's use_secure_cert=false) may be reached
// with an HTTPClient that skips TLS verification.
type Client struct {
	// BaseURL ends in ".../sgx/certification/v4/"; empty means DefaultBaseURL.
	BaseURL string
	// HTTPClient is used for requests; nil means http.DefaultClient.
	HTTPClient *http.Client
	// TDXBase is the base URL of TDX collateral; empty means BaseURL with
	// /sgx/certification/ replaced by /tdx/certification/ (TDXBaseURL).
	TDXBase string
	// Update is the TCB info update channel ("early" or "standard"); empty
	// leaves the server's default.
	Update string
}

var _ collateral.Provider = (*Client)(nil)

// Get fetches the collateral for fmspc and ca. A 404 gives an error matching
// collateral.ErrNotFound, other statuses ErrHTTP, bad bodies
// collateral.ErrFormat.
func (c *Client) Get(ctx context.Context, fmspc [6]byte, ca collateral.CA) (*collateral.Collateral, error) {
	if ca != collateral.CAProcessor && ca != collateral.CAPlatform {
		return nil, fmt.Errorf("pccs: unknown PCK CA %q", ca)
	}
	var col collateral.Collateral

	q := url.Values{"fmspc": {strings.ToUpper(hex.EncodeToString(fmspc[:]))}}
	if c.Update != "" {
		q.Set("update", c.Update)
	}
	body, hdr, err := c.fetch(ctx, "tcb", q)
	if err != nil {
		return nil, err
	}
	if col.TCBInfo, col.TCBInfoSignature, err = collateral.SplitTCBInfoBody(body); err != nil {
		return nil, fmt.Errorf("pccs: tcb: %w", err)
	}
	if col.TCBInfoIssuerChain, err = chainHeader(hdr, HeaderTCBInfoIssuerChain, HeaderTCBInfoIssuerChainV3); err != nil {
		return nil, fmt.Errorf("pccs: tcb: %w", err)
	}

	if body, hdr, err = c.fetch(ctx, "qe/identity", nil); err != nil {
		return nil, err
	}
	if col.QEIdentity, col.QEIdentitySignature, err = collateral.SplitQEIdentityBody(body); err != nil {
		return nil, fmt.Errorf("pccs: qe/identity: %w", err)
	}
	if col.QEIdentityIssuerChain, err = chainHeader(hdr, HeaderQEIdentityChain); err != nil {
		return nil, fmt.Errorf("pccs: qe/identity: %w", err)
	}

	if err := c.crls(ctx, ca, &col); err != nil {
		return nil, err
	}
	return &col, nil
}

// crls fetches the PCK CRL of ca with its issuer chain and the root CA CRL.
func (c *Client) crls(ctx context.Context, ca collateral.CA, col *collateral.Collateral) error {
	body, hdr, err := c.fetch(ctx, "pckcrl", url.Values{"ca": {string(ca)}})
	if err != nil {
		return err
	}
	if col.PCKCRL, err = collateral.ParseCRL(body); err != nil {
		return fmt.Errorf("pccs: pckcrl: %w", err)
	}
	if col.PCKCRLIssuerChain, err = chainHeader(hdr, HeaderPCKCRLIssuerChain); err != nil {
		return fmt.Errorf("pccs: pckcrl: %w", err)
	}
	if body, _, err = c.fetch(ctx, "rootcacrl", nil); err != nil {
		return err
	}
	if col.RootCACRL, err = collateral.ParseCRL(body); err != nil {
		return fmt.Errorf("pccs: rootcacrl: %w", err)
	}
	return nil
}

func (c *Client) fetch(ctx context.Context, path string, query url.Values) ([]byte, http.Header, error) {
	base := c.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	return c.fetchFrom(ctx, base, path, query)
}

func (c *Client) fetchFrom(ctx context.Context, base, path string, query url.Values) ([]byte, http.Header, error) {
	u, err := url.Parse(strings.TrimSuffix(base, "/") + "/" + path)
	if err != nil {
		return nil, nil, fmt.Errorf("pccs: base URL: %w", err)
	}
	u.RawQuery = query.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("pccs: %s: %w", path, err)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("pccs: %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, nil, fmt.Errorf("pccs: %s: reading body: %w", path, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, nil, fmt.Errorf("pccs: GET %s: %w", u, collateral.ErrNotFound)
	case resp.StatusCode != http.StatusOK:
		return nil, nil, fmt.Errorf("%w: GET %s: %s", ErrHTTP, u, resp.Status)
	case len(body) > maxBody:
		return nil, nil, fmt.Errorf("%w: GET %s: body larger than %d bytes", collateral.ErrFormat, u, maxBody)
	}
	return body, resp.Header, nil
}

func (c *Client) httpClient() *http.Client {
	if c.HTTPClient != nil {
		return c.HTTPClient
	}
	return http.DefaultClient
}

// chainHeader decodes the issuer chain in the first present header among
// names. Intel percent-encodes it like encodeURIComponent (space as %20,
// '+' as %2B). Some servers use form encoding, where '+' means space; the
// only spaces in PEM are in the armour lines, so those are repaired instead
// of guessing the encoding (a literal '+' elsewhere is base64).
func chainHeader(h http.Header, names ...string) ([]*x509.Certificate, error) {
	for _, name := range names {
		v := h.Get(name)
		if v == "" {
			continue
		}
		pemText, err := url.PathUnescape(v)
		if err != nil {
			return nil, fmt.Errorf("%w: header %s: %w", collateral.ErrFormat, name, err)
		}
		pemText = armour.Replace(pemText)
		certs, err := collateral.ParseChain([]byte(pemText))
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", name, err)
		}
		return certs, nil
	}
	return nil, fmt.Errorf("%w: no %s header", collateral.ErrFormat, names[0])
}

var armour = strings.NewReplacer("-----BEGIN+CERTIFICATE-----", "-----BEGIN CERTIFICATE-----", "-----END+CERTIFICATE-----", "-----END CERTIFICATE-----")
