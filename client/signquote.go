package client

import (
	"fmt"

	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// The sign-quote signature covers SHA-256(base64(quote) ‖ tcbStatus) with no
// separator (MarbleRun's wire format, kept for compatibility). Without more,
// the split between quote and status is not fixed: "ConfigurationAnd" is
// valid base64 for 12 bytes, so the signature of a quote whose length is a
// multiple of 3 with status ConfigurationAndSWHardeningNeeded also verifies
// for that quote with those 12 bytes appended and the better status
// SWHardeningNeeded. A verifier that then reads the quote leniently (Intel's
// parser ignores trailing bytes) accepts the platform as only needing
// software hardening.
//
// checkSignedQuote closes that by fixing the split from the quote itself: the
// quote must be exactly one quote of a shape the Coordinator verifies (raw or
// Open Enclave-wrapped SGX, or TDX), parsed by the same parsers, whose length
// is then fixed by the declared sizes in its first bytes (header, body and
// signature data length). Two strictly parsed quotes of which one is a
// prefix of the other would declare the same sizes in the same bytes, so
// they are equal. Bytes after the declared end are refused (the Coordinator
// verifies and signs only the declared quote, so a signature never covers
// them), except the zero padding real TDX quotes carry: the signature is
// then checked over the declared quote (what the Coordinator signs) or over
// the padded one (what Coordinators that signed quotes as submitted
// signed). Both are strictly parsed quotes; padding zeros encode as "A"s, so
// moving the split through them would need a TCB status beginning with
// "AA": the status must therefore be one of Intel's names, none of which
// does.

// checkSignedQuote checks that quote is one well-formed quote and tcbStatus
// one of Intel's TCB status names (see above), and returns the declared
// quote (quote itself unless it is a zero-padded TDX quote); errors wrap
// ErrVerification.
func checkSignedQuote(quote []byte, tcbStatus string) (declared []byte, err error) {
	if !knownStatus(tcbStatus) {
		return nil, fmt.Errorf("%w: the TCB status %q is not one of Intel's status names", ErrVerification, tcbStatus)
	}
	declared = quote
	if tdxquote.IsTDX(quote) {
		var q *tdxquote.Quote
		if q, err = tdxquote.Parse(quote); err == nil {
			declared = q.Raw()
		}
	} else {
		_, err = sgxquote.ParseAny(quote)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w: the signed quote is not exactly one well-formed SGX or TDX quote "+
			"(bytes after its declared end, or sizes that do not match, as in a quote spliced with part of a TCB status; "+
			"the Coordinator signs only the declared quote: verify that, see DeclaredQuote): %w",
			ErrVerification, ErrQuoteInvalid, err)
	}
	return declared, nil
}

// DeclaredQuote returns the quote that b holds as its own size fields
// declare it, without the bytes after it: what the Coordinator verifies and
// signs for sign-quote (and what Intel's verification library verifies). b
// is a raw SGX or TDX quote or an Open Enclave report; the result may alias
// b. Errors wrap ErrQuoteInvalid.
func DeclaredQuote(b []byte) ([]byte, error) {
	d, err := sgxquote.Declared(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrQuoteInvalid, err)
	}
	return d, nil
}

// knownStatus reports whether s is exactly one of Intel's TCB status names
// (as the Coordinator sends them), Unknown excluded.
func knownStatus(s string) bool {
	for _, v := range acceptableStatuses() {
		if v.String() == s {
			return true
		}
	}
	return false
}
