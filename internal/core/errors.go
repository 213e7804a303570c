package core

import "errors"

// Error classes callers branch on (with errors.Is). The REST layer maps each
// to one HTTP status; messages are safe to show to the client.
var (
	// ErrWrongState: the operation is not possible in the current state.
	ErrWrongState = errors.New("server is not in expected state")
	// ErrInvalidRequest: the request is malformed or invalid.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrUnauthenticated: no or unknown client certificate.
	ErrUnauthenticated = errors.New("unauthorized user")
	// ErrForbidden: the user lacks the permission, or the feature is off.
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound: the named resource does not exist, or nothing is pending.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the request conflicts with the state (e.g. update pending).
	ErrConflict = errors.New("conflict")
)
