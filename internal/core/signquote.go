package core

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/manifest"
)

// QuoteVerifier verifies an SGX DCAP quote, raw or wrapped in an Open
// Enclave header (dcap.Verifier). It returns the result whatever the TCB
// status; an error means the quote is not verified.
type QuoteVerifier interface {
	Verify(ctx context.Context, quote []byte) (*dcap.Result, error)
}

var _ QuoteVerifier = (*dcap.Verifier)(nil)

// Messages of sign-quote refusals, safe to show to the client.
const (
	msgSignQuoteDisabled = manifest.FeatureSignQuoteEndpoint + " feature is not enabled in the manifest"
	msgNoCollateral      = "quote verification is not available: the Coordinator has no collateral source; " +
		"its operator must start it with --collateral-file (QUARRY_COLLATERAL_FILE) or --pccs-url (QUARRY_PCCS_URL)"
)

// QuoteVerificationError means a quote submitted to sign-quote did not
// verify. It is a client error (ErrInvalidRequest); Err says why.
type QuoteVerificationError struct{ Err error }

func (e *QuoteVerificationError) Error() string { return "quote verification failed: " + e.Err.Error() }

// Unwrap returns the class and the cause.
func (e *QuoteVerificationError) Unwrap() []error { return []error{ErrInvalidRequest, e.Err} }

// SignQuoteResult is a verified quote's TCB status and the root key's
// signature over it.
type SignQuoteResult struct {
	// TCBStatus is Intel's status string (UpToDate, SWHardeningNeeded, ...).
	TCBStatus string
	// Signature is the ASN.1 ECDSA signature of the root key over
	// SHA-256(base64std(Quote) ‖ TCBStatus).
	Signature []byte
	// Quote is the quote verified and signed: the one submitted without
	// bytes after its declared end.
	Quote []byte
}

// SignQuote verifies an SGX quote (raw or OE-wrapped) and signs the result
// with the root key (MarbleRun's sign-quote endpoint). It needs a manifest that enables the
// SignQuoteEndpoint feature (else ErrForbidden) and a configured verifier
// (else ErrForbidden, saying how to configure one). A quote that does not
// verify, including one whose collateral has expired, gives a
// *QuoteVerificationError; a TCB status other than UpToDate is not an
// error, it is signed. The quote is not matched against the manifest's
// packages. Only the declared quote is verified and signed (declaredQuote):
// bytes after it are ignored, as Intel's verification library ignores them,
// and are not covered by the signature; SignQuoteResult.Quote is what was
// signed.
func (c *Core) SignQuote(ctx context.Context, quote []byte) (SignQuoteResult, error) {
	s := c.snap.Load()
	if err := c.checkSignQuote(s); err != nil {
		return SignQuoteResult{}, err
	}
	if len(quote) == 0 {
		return SignQuoteResult{}, &QuoteVerificationError{Err: errors.New("the quote is empty")}
	}
	quote = declaredQuote(quote)
	res, err := c.opts.QuoteVerifier.Verify(ctx, quote)
	switch {
	case err == nil:
	case errors.Is(err, dcap.ErrCollateralUnavailable) && !errors.Is(err, collateral.ErrNotFound):
		// The collateral source failed (PCCS unreachable, unreadable
		// file): nothing is known about the quote; a service failure.
		return SignQuoteResult{}, fmt.Errorf("sign-quote: %w", err)
	default:
		return SignQuoteResult{}, &QuoteVerificationError{Err: err}
	}
	status := res.Status.String()
	sig, err := s.ca.SignRoot(rand.Reader, []byte(base64.StdEncoding.EncodeToString(quote)+status))
	if err != nil {
		return SignQuoteResult{}, fmt.Errorf("sign-quote: signing: %w", err)
	}
	return SignQuoteResult{TCBStatus: status, Signature: sig, Quote: quote}, nil
}

// declaredQuote returns the quote (raw, or in an Open Enclave report) as its
// own size fields declare it, without bytes after it (sgxquote.Declared):
// Intel's verification library verifies the declared quote and ignores what
// follows, so that is what the Coordinator verifies, signs and keeps. Input
// whose size fields cannot be read is returned as it is, for the verifier to
// refuse with its reason.
func declaredQuote(quote []byte) []byte {
	if d, err := sgxquote.Declared(quote); err == nil {
		return d
	}
	return quote
}

// CheckSignQuote is sign-quote's cheap check before its body is read
// (docs/http.md, order of checks): the manifest must enable the SignQuoteEndpoint feature
// and a quote verifier must be configured, else ErrForbidden. SignQuote
// checks again.
func (c *Core) CheckSignQuote() error { return c.checkSignQuote(c.snap.Load()) }

func (c *Core) checkSignQuote(s *snapshot) error {
	if !s.manifest.FeatureEnabled(manifest.FeatureSignQuoteEndpoint) {
		return classify(ErrForbidden, errors.New(msgSignQuoteDisabled))
	}
	if c.opts.QuoteVerifier == nil {
		return classify(ErrForbidden, errors.New(msgNoCollateral))
	}
	return nil
}
