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
// they are equal. The one slack is the zero padding the TDX parser tolerates
// after a quote's declared end (real TDX quotes carry it, and the
// Coordinator signs the quote as submitted): padding zeros encode as "A"s,
// so moving the split through them needs a TCB status beginning with "AA";
// the status must therefore be one of Intel's names, none of which does.

// checkSignedQuote checks that quote is one well-formed quote and tcbStatus
// one of Intel's TCB status names (see above); errors wrap ErrVerification.
func checkSignedQuote(quote []byte, tcbStatus string) error {
	if !knownStatus(tcbStatus) {
		return fmt.Errorf("%w: the TCB status %q is not one of Intel's status names", ErrVerification, tcbStatus)
	}
	var err error
	if tdxquote.IsTDX(quote) {
		_, err = tdxquote.Parse(quote)
	} else {
		_, err = sgxquote.ParseAny(quote)
	}
	if err != nil {
		return fmt.Errorf("%w: %w: the signed quote is not exactly one well-formed SGX or TDX quote "+
			"(bytes after its declared end, or sizes that do not match, as in a quote spliced with part of a TCB status): %w",
			ErrVerification, ErrQuoteInvalid, err)
	}
	return nil
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
