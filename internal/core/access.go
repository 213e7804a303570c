package core

import (
	"context"
	"crypto/x509"
	"errors"
	"github.com/quarry-cc/quarry/internal/user"
	"maps"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/manifest"
)

// AuthenticateUser is the cheap check that runs before a request body is
// read on the endpoints that need a user (docs/http.md, order of checks): the Coordinator
// must be running (else a *WrongStateError, 409) and the leaf of peer must
// be a manifest user's certificate (else ErrUnauthenticated, 401). The use
// case checks both again under its lock.
func (c *Core) AuthenticateUser(peer []*x509.Certificate) error {
	_, err := identify(c.snap.Load(), opUpdate, peer)
	return err
}

// CheckSetManifest, CheckRecover and CheckMonotonicCounter are the cheap
// state checks of the endpoints that need no user, made before their body
// is read (docs/http.md, order of checks): nil when the use case may run in the current
// state, else a *WrongStateError (409). The use case checks again under
// its lock.
func (c *Core) CheckSetManifest() error { return require(c.Status(), opSetManifest) }

// CheckRecover: see CheckSetManifest.
func (c *Core) CheckRecover() error { return require(c.Status(), opRecover) }

// CheckMonotonicCounter: see CheckSetManifest.
func (c *Core) CheckMonotonicCounter() error { return require(c.Status(), opCounter) }

// CheckMonotonicCounterFeature is the monotonic counter's feature gate,
// checked after the Marble is authenticated and before the body is read
// (docs/http.md, order of checks): the manifest must enable the MonotonicCounter feature,
// else ErrForbidden. The use case checks again under its lock.
func (c *Core) CheckMonotonicCounterFeature() error {
	if !c.snap.Load().manifest.FeatureEnabled(manifest.FeatureMonotonicCounter) {
		return classify(ErrForbidden, errors.New(msgCounterDisabled))
	}
	return nil
}

// CheckRecoverUnsigned is the cheap check of the unsigned (v1) recovery
// upload before its body is read (docs/http.md, order of checks): the state of
// CheckRecover, and no enclave (in an enclave every unsigned recovery
// secret is refused with ErrForbidden, see RecoverUnsigned).
func (c *Core) CheckRecoverUnsigned() error {
	if err := c.CheckRecover(); err != nil {
		return err
	}
	if seal.ProtectsKey(c.opts.KeySealer) {
		return classify(ErrForbidden, errUnsignedInEnclave)
	}
	return nil
}

// RecoverySecrets returns the encrypted recovery secrets last handed out
// (by the manifest set, or by the update that last changed the recovery
// keys) to a user holding UpdateManifest, so that a response lost on the
// way can be fetched again. They are encrypted to the recovery keys'
// holders and useless to anybody else.
func (c *Core) RecoverySecrets(_ context.Context, peer []*x509.Certificate) (map[string][]byte, error) {
	s := c.snap.Load()
	u, err := identify(s, opUpdate, peer)
	if err != nil {
		return nil, err
	}
	if err := authorize(u, manifest.ActionUpdateManifest); err != nil {
		return nil, err
	}
	if len(s.manifest.RecoveryKeys) == 0 {
		return nil, classify(ErrNotFound, errors.New("the manifest defines no RecoveryKeys, so there are no recovery secrets"))
	}
	if len(s.persisted.RecoverySecrets) == 0 {
		return nil, classify(ErrNotFound, errors.New("no recovery secrets are kept for this state (it was written by an earlier version of the Coordinator); a manifest update that changes the recovery keys makes new ones"))
	}
	return maps.Clone(s.persisted.RecoverySecrets), nil
}

// identify returns the manifest user presenting peer, after checking that
// op is possible now.
func identify(s *snapshot, op operation, peer []*x509.Certificate) (*user.User, error) {
	if err := require(s.state, op); err != nil {
		return nil, err
	}
	u, err := s.users.Identify(peer)
	if err != nil {
		return nil, classify(ErrUnauthenticated, err)
	}
	return u, nil
}

// authorize is the one permission check of every use case.
func authorize(u *user.User, action string, resources ...string) error {
	if err := user.Authorize(u, action, resources...); err != nil {
		return classify(ErrForbidden, err)
	}
	return nil
}
