package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
)

// Several endpoints and fail-over: the rule is in the package comment
// (client.go); attempt.failOver implements it.

// ErrUnreachable is wrapped when no endpoint could be reached: the request
// got no answer from any of the Client's endpoints. A POST was not
// delivered to any of them.
var ErrUnreachable = errors.New("no Coordinator endpoint reachable")

// ErrOutcomeUnknown is wrapped when the connection broke after a request
// that changes state (POST) may have been sent and before an answer: the
// Coordinator may or may not have applied it. The Client does not repeat
// such a request; check the Coordinator's state (status, manifest, update
// log) before sending it again.
var ErrOutcomeUnknown = errors.New("the connection broke after the request may have been sent; it may or may not have been applied")

// ParseEndpoints checks a comma-separated list of Coordinator endpoints (as
// New takes it) and returns their base URLs, e.g. "https://a:4433". An empty
// element or an endpoint given twice is an error.
func ParseEndpoints(list string) ([]string, error) {
	us, err := parseEndpoints(list)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.String()
	}
	return out, nil
}

func parseEndpoints(list string) ([]*url.URL, error) {
	if strings.TrimSpace(list) == "" {
		return nil, errors.New("client: empty Coordinator endpoint")
	}
	parts := strings.Split(list, ",")
	out := make([]*url.URL, 0, len(parts))
	seen := map[string]bool{}
	for _, p := range parts {
		if strings.TrimSpace(p) == "" {
			return nil, fmt.Errorf("client: invalid Coordinator endpoint list %q: an empty element", list)
		}
		u, err := parseEndpoint(p)
		if err != nil {
			return nil, err
		}
		if seen[u.Host] {
			return nil, fmt.Errorf("client: invalid Coordinator endpoint list %q: %s is given twice", list, u.Host)
		}
		seen[u.Host] = true
		out = append(out, u)
	}
	return out, nil
}

// attempt records how far one request on one endpoint got. The trace hooks
// may run on the transport's goroutines.
type attempt struct {
	gotConn   atomic.Bool // a connection was established: the request may have been sent
	firstByte atomic.Bool // the answer started
}

func (a *attempt) trace(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:              func(httptrace.GotConnInfo) { a.gotConn.Store(true) },
		GotFirstResponseByte: func() { a.firstByte.Store(true) },
	})
}

// failOver reports whether a request that failed with err in attempt a may
// be sent to the next endpoint (see the rule above).
func (a *attempt) failOver(ctx context.Context, method string, err error) bool {
	switch {
	case ctx.Err() != nil, refusedByPeer(err), a.firstByte.Load():
		return false
	case !a.gotConn.Load():
		return true // nothing was sent
	}
	return idempotent(method)
}

// outcomeUnknown reports whether a state-changing request that failed with
// err in attempt a may nevertheless have been applied: a connection was
// established, so the request may have been sent.
func (a *attempt) outcomeUnknown(method string, err error) bool {
	return a.gotConn.Load() && !idempotent(method) && !refusedByPeer(err)
}

// idempotent reports whether a request with method changes nothing on the
// Coordinator (all of its GET endpoints are reads).
func idempotent(method string) bool {
	return method == http.MethodGet || method == http.MethodHead
}

// refusedByPeer reports whether err is a decision of a live peer or of the
// certificate check rather than a connection failure: such a request is not
// repeated on another endpoint.
func refusedByPeer(err error) bool {
	var alert tls.AlertError
	var record tls.RecordHeaderError
	var verify *tls.CertificateVerificationError
	var unknownAuthority x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var hostname x509.HostnameError
	return errors.Is(err, ErrVerification) ||
		errors.As(err, &alert) || errors.As(err, &record) || errors.As(err, &verify) ||
		errors.As(err, &unknownAuthority) || errors.As(err, &invalid) || errors.As(err, &hostname)
}

// multiError is an error with several causes, rendered on one line.
type multiError struct {
	msg  string
	errs []error
}

func (e *multiError) Error() string   { return e.msg }
func (e *multiError) Unwrap() []error { return e.errs }

// unreachable is the error of a request for path that failed over on every
// endpoint: the attempt on urls[i] (the whole request URL) failed with
// errs[i].
func unreachable(method, path string, urls []string, errs []error) error {
	if len(errs) == 1 {
		// One endpoint: rendered as before there were several.
		return &multiError{msg: fmt.Sprintf("%s %s: %v", method, urls[0], errs[0]), errs: []error{ErrUnreachable, errs[0]}}
	}
	texts := make([]string, len(errs))
	for i, e := range errs {
		host := urls[i]
		if u, err := url.Parse(urls[i]); err == nil {
			host = u.Host
		}
		texts[i] = fmt.Sprintf("%s: %v", host, e)
	}
	return &multiError{
		msg:  fmt.Sprintf("%s %s: %s (%s)", method, path, ErrUnreachable, strings.Join(texts, "; ")),
		errs: append([]error{ErrUnreachable}, errs...),
	}
}
