package rest

import (
	"errors"
	"net/http"

	"github.com/quarry-cc/quarry/internal/core"
)

// opSecrets names the secrets endpoints' operation in a state error, as
// the core's secrets use cases do.
const opSecrets = "read or write secrets"

// authenticate is the cheap check of the endpoints that need a user, made
// before their body is read (docs/design/decisions.md#d16): the Coordinator's state (409)
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
