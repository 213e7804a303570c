package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// retryAfter reads a Retry-After header given in seconds (0 if absent or
// a date).
func retryAfter(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// Error is an answer of the Coordinator other than success: a JSend fail
// (the request was rejected, HTTP 4xx) or error (the service failed, HTTP
// 5xx), or a response that is not a Client API answer at all (Status empty).
type Error struct {
	Method     string          // request method, e.g. "POST"
	Path       string          // request path, e.g. "/api/v2/manifest"
	HTTPStatus int             // HTTP status code
	Status     string          // JSend status: "fail" or "error"; empty if the body was not JSend
	Message    string          // the Coordinator's message
	Data       json.RawMessage // the data object of a fail response, if any
	// RetryAfter is the Coordinator's Retry-After (with 503: it is busy
	// with other large requests, or a request ran out of time); 0 if none.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	status := e.Status
	if status == "" {
		status = "no JSend"
	}
	return fmt.Sprintf("%s %s: %s (HTTP %d, %s)", e.Method, e.Path, e.Message, e.HTTPStatus, status)
}

// Is matches the sentinel of e's HTTP status class, so that
// errors.Is(err, client.ErrNotFound) works through wrapping.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.HTTPStatus == http.StatusBadRequest
	case ErrUnauthorized:
		return e.HTTPStatus == http.StatusUnauthorized
	case ErrForbidden:
		return e.HTTPStatus == http.StatusForbidden
	case ErrNotFound:
		return e.HTTPStatus == http.StatusNotFound
	case ErrMethodNotAllowed:
		return e.HTTPStatus == http.StatusMethodNotAllowed
	case ErrConflict:
		return e.HTTPStatus == http.StatusConflict
	case ErrTooLarge:
		return e.HTTPStatus == http.StatusRequestEntityTooLarge
	case ErrUnavailable:
		return e.HTTPStatus == http.StatusServiceUnavailable
	case ErrRejected:
		return e.HTTPStatus >= 400 && e.HTTPStatus < 500
	case ErrServer:
		return e.HTTPStatus >= 500 || e.HTTPStatus < 400
	}
	return false
}

// Sentinels for the classes of Coordinator answers (the server's classes,
// docs/design/decisions.md#d1: the HTTP status tells the class). Match them with errors.Is; the
// *Error itself carries the message.
var (
	ErrBadRequest       = errors.New("invalid request")                 // 400
	ErrUnauthorized     = errors.New("not authenticated")               // 401: no or unknown client certificate
	ErrForbidden        = errors.New("not permitted")                   // 403: permission missing or feature disabled
	ErrNotFound         = errors.New("not found")                       // 404: unknown resource, nothing pending, or endpoint not supported
	ErrMethodNotAllowed = errors.New("method not allowed")              // 405
	ErrConflict         = errors.New("conflict with the current state") // 409: wrong Coordinator state or an update already pending
	ErrTooLarge         = errors.New("request too large")               // 413
	ErrRejected         = errors.New("request rejected")                // any 4xx
	ErrServer           = errors.New("coordinator failure")             // 5xx or an unexpected answer
	ErrUnavailable      = errors.New("coordinator busy")                // 503: try again after Error.RetryAfter
)

// IsUnavailable reports whether err is a 503 answer: the Coordinator is
// busy (or a request ran out of time) and the request may be repeated later
// (see Error.RetryAfter).
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// IsNotFound reports whether err is a 404 answer of the Coordinator.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is a 409 answer: the Coordinator is in the
// wrong state, or an update is pending.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsUnauthorized reports whether err is a 401 answer: no or unknown client
// certificate.
func IsUnauthorized(err error) bool { return errors.Is(err, ErrUnauthorized) }

// IsForbidden reports whether err is a 403 answer.
func IsForbidden(err error) bool { return errors.Is(err, ErrForbidden) }

// IsBadRequest reports whether err is a 400 answer.
func IsBadRequest(err error) bool { return errors.Is(err, ErrBadRequest) }

// AsError returns the *Error in err's chain, if any.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
