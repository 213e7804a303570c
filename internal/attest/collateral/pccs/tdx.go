package pccs

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

var _ collateral.TDXProvider = (*Client)(nil)

// TDXBaseURL returns the base URL of the TDX collateral (TDX TCB info and TD
// QE identity): TDXBase when set, else BaseURL (or DefaultBaseURL) with its
// "/sgx/certification/" replaced by "/tdx/certification/", as Intel's PCS
// and the PCCS lay them out.
func (c *Client) TDXBaseURL() string {
	if c.TDXBase != "" {
		return c.TDXBase
	}
	base := c.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	return strings.Replace(base, "/sgx/certification/", "/tdx/certification/", 1)
}

// GetTDX fetches the collateral of a TDX quote: tcb?fmspc= and qe/identity
// under the TDX base URL, the PCK CRL and the root CA CRL under the SGX one.
func (c *Client) GetTDX(ctx context.Context, fmspc [6]byte, ca collateral.CA) (*collateral.Collateral, error) {
	if ca != collateral.CAProcessor && ca != collateral.CAPlatform {
		return nil, fmt.Errorf("pccs: unknown PCK CA %q", ca)
	}
	var tdx collateral.Collateral
	base := c.TDXBaseURL()
	q := url.Values{"fmspc": {strings.ToUpper(hex.EncodeToString(fmspc[:]))}}
	if c.Update != "" {
		q.Set("update", c.Update)
	}
	body, hdr, err := c.fetchFrom(ctx, base, "tcb", q)
	if err != nil {
		return nil, err
	}
	if tdx.TCBInfo, tdx.TCBInfoSignature, err = collateral.SplitTCBInfoBody(body); err != nil {
		return nil, fmt.Errorf("pccs: tdx tcb: %w", err)
	}
	if tdx.TCBInfoIssuerChain, err = chainHeader(hdr, HeaderTCBInfoIssuerChain, HeaderTCBInfoIssuerChainV3); err != nil {
		return nil, fmt.Errorf("pccs: tdx tcb: %w", err)
	}
	if body, hdr, err = c.fetchFrom(ctx, base, "qe/identity", nil); err != nil {
		return nil, err
	}
	if tdx.QEIdentity, tdx.QEIdentitySignature, err = collateral.SplitQEIdentityBody(body); err != nil {
		return nil, fmt.Errorf("pccs: tdx qe/identity: %w", err)
	}
	if tdx.QEIdentityIssuerChain, err = chainHeader(hdr, HeaderQEIdentityChain); err != nil {
		return nil, fmt.Errorf("pccs: tdx qe/identity: %w", err)
	}
	if err := c.crls(ctx, ca, &tdx); err != nil {
		return nil, err
	}
	return &tdx, nil
}
