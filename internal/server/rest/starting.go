package rest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/quarry-cc/quarry/internal/core"
)

// Starting returns the Client API handler of a Coordinator whose state is
// not loaded yet (docs/ha.md, "Starting while etcd is unreachable"): GET
// /api/v2/healthz answers alive, GET /api/v2/readyz 503 with ready's
// reason, and every other request a 503 error with Retry-After that says
// the Coordinator is starting and why it is not ready. It reads nothing
// from the Coordinator (there is no state to read), so it serves no status
// code, quote, manifest or secret. It never waits: every answer is
// immediate.
func Starting(ready Readiness, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if ready == nil {
		ready = notLoaded{}
	}
	s := &server{opts: Options{Readiness: ready}, log: log}
	onPanic := func(w http.ResponseWriter, r *http.Request) {
		renderer{log: log, v1: isV1(r)}.write(w, r, nil, errPanic)
	}
	return withRequestLog(log, onPanic)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rend := renderer{log: log, v1: isV1(r)}
		get := r.Method == http.MethodGet || r.Method == http.MethodHead
		switch {
		case get && r.URL.Path == PathHealthz:
			data, err := s.getHealthz(r)
			rend.write(w, r, data, err)
		case get && r.URL.Path == PathReadyz:
			data, err := s.getReadyz(r)
			rend.write(w, r, data, err)
		default:
			rend.write(w, r, nil, &unavailableError{msg: startingMessage(r, ready), retryAfter: 1})
		}
	}))
}

// startingMessage says that the Coordinator is starting, with the
// readiness reason (safe to show) when there is one.
func startingMessage(r *http.Request, ready Readiness) string {
	const msg = "the Coordinator is starting and has not loaded its state yet"
	const todo = "; try again in a moment, or at another instance"
	_, err := ready.Ready(r.Context())
	var nr notReady
	if errors.As(err, &nr) {
		return msg + " (" + nr.NotReadyReason() + ")" + todo
	}
	return msg + todo
}

// notLoaded is the readiness of Starting without one: not ready.
type notLoaded struct{}

func (notLoaded) Ready(context.Context) (core.State, error) {
	return core.StateUninitialized, notLoadedError{}
}

type notLoadedError struct{}

func (notLoadedError) Error() string          { return "not ready: " + notLoadedError{}.NotReadyReason() }
func (notLoadedError) NotReadyReason() string { return "the state is not loaded yet" }

// Unavailable answers r as the Client API answers a request whose shared
// state cannot be read (core.ErrUnavailable): 503 with Retry-After, the
// JSend error of r's API generation, with what to do; cause goes to log.
// It is for a refusal before the request reaches the handlers (the sync
// that precedes every request on a shared store), so that the answer is
// the handlers' own.
func Unavailable(w http.ResponseWriter, r *http.Request, log *slog.Logger, cause error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !errors.Is(cause, core.ErrUnavailable) {
		cause = fmt.Errorf("%w: %w", core.ErrUnavailable, cause)
	}
	renderer{log: log, v1: isV1(r)}.write(w, r, nil, cause)
}
