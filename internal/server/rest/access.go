package rest

import (
	"errors"
	"net/http"
	"slices"

	"github.com/quarry-cc/quarry/internal/core"
)

// opSecrets names the secrets endpoints' operation in a state error, as
// the core's secrets use cases do.
const opSecrets = "read or write secrets"

// authenticate is the cheap check of the endpoints that need a user, made
// before their body is read (decision D16): the Coordinator's state (409)
// and the leaf client certificate (401). op, if not empty, names the
// operation in a state error instead of the core's "update".
func (s *server) authenticate(r *http.Request, op string) error {
	err := s.c.AuthenticateUser(peerCertificates(r))
	var ws *core.WrongStateError
	if op != "" && errors.As(err, &ws) {
		return &core.WrongStateError{State: ws.State, Op: op}
	}
	return err
}

// Operations of the endpoints that need no user, named as the core names
// them in its state errors.
const (
	opSetManifest = "set the manifest"
	opRecover     = "recover"
)

// checkState is the cheap check of the endpoints that need no user (the
// manifest set and recover), made before their body is read: the
// Coordinator must be in one of the states the use case accepts (the
// core's table; the use case checks again under its lock). Without it,
// anybody could hold body memory with slow uploads to a running
// Coordinator (decision D16).
func (s *server) checkState(op string, allowed ...core.State) error {
	if st := s.c.Status(); !slices.Contains(allowed, st) {
		return &core.WrongStateError{State: st, Op: op}
	}
	return nil
}
