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
	// ErrUnavailable: the shared store cannot be reached (or too many
	// concurrent changes won); nothing was changed, and the request may
	// be repeated later, here or on another instance.
	ErrUnavailable = errors.New("the shared state store is unavailable")
	// ErrTooLarge: the change would take the state, or a part of it,
	// beyond a limit (the message names it); nothing was changed.
	ErrTooLarge = errors.New("the change exceeds a limit of the state")
)

// ErrorClasses returns every error class above: a request to the Core
// (Client API or Marble API) that fails for one of these reasons wraps
// exactly one of them. Each transport maps every class to its own status
// (its tests range over this list, and a test of this package checks that
// the list names every exported error class of the package), so a class
// no transport knows cannot reach a client as an internal error.
func ErrorClasses() []error {
	return []error{ErrWrongState, ErrInvalidRequest, ErrUnauthenticated, ErrForbidden, ErrNotFound, ErrConflict, ErrUnavailable, ErrTooLarge}
}

// classified is an error that belongs to a class (ErrInvalidRequest, …)
// while keeping its own message and chain.
type classified struct{ class, err error }

func classify(class, err error) error { return classified{class: class, err: err} }
