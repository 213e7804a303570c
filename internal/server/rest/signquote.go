package rest

import (
	"errors"
	"net/http"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/internal/core"
)

// postSignQuote verifies a quote and returns the root key's signature over
// it (docs/http.md). Before the body is read: the
// SignQuoteEndpoint feature and a configured verifier (403).
func (s *server) postSignQuote(r *http.Request) (any, error) {
	// The feature and the verifier before the body (docs/http.md, order of checks): the
	// endpoint needs no user, so without this check anybody could make
	// the Coordinator read bodies in every state.
	if err := s.c.CheckSignQuote(); err != nil {
		return nil, err
	}
	var req v2.SignQuoteRequest
	if err := decodeBody(r, maxSmallBody, &req); err != nil {
		// As MarbleRun: a body that is not JSON names sgxQuote in data.
		if be, ok := err.(*bodyError); ok && !be.tooLarge {
			return nil, &signQuoteFail{err: err, msg: err.Error(), reason: "failed to parse JSON data"}
		}
		return nil, err
	}
	res, err := s.c.SignQuote(r.Context(), req.SGXQuote)
	var qe *core.QuoteVerificationError
	if errors.As(err, &qe) {
		return nil, &signQuoteFail{err: err, msg: "quote verification failed", reason: qe.Error()}
	}
	if err != nil {
		return nil, err
	}
	return v2.SignQuoteResponse{Signature: res.Signature, VerificationSignature: res.Signature, TCBStatus: res.TCBStatus}, nil
}

// signQuoteFail is a sign-quote client error: a short message, and the
// reason in data.sgxQuote. Its status is that of the wrapped error.
type signQuoteFail struct {
	err    error
	msg    string
	reason string
}

func (e *signQuoteFail) Error() string { return e.msg }
func (e *signQuoteFail) Unwrap() error { return e.err }

// FailData implements failData.
func (e *signQuoteFail) FailData() any { return v2.SignQuoteFailure{SGXQuote: e.reason} }
