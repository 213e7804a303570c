package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/vault"

	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/updatelog"
	"github.com/quarry-cc/quarry/internal/user"
	"github.com/quarry-cc/quarry/manifest"
)

// errUpdatePending is the conflict of a second update while one is pending.
var errUpdatePending = classify(ErrConflict, errors.New("update already in progress. Acknowledge the update to apply it, or cancel it to start a new one"))

// errNoUpdate means nothing is pending.
var errNoUpdate = classify(ErrNotFound, errors.New("no update in progress"))

// UpdateResult is the outcome of an update request or acknowledgement.
type UpdateResult struct {
	// MissingAcknowledgments and MissingUsers describe a pending update.
	MissingAcknowledgments int
	MissingUsers           []string
	// RecoverySecrets are new encrypted recovery secrets when the applied
	// manifest made a new data key: it changed the recovery keys, or
	// tightened SealMode from ProductKey to UniqueKey (none when the
	// manifest has no recovery keys).
	RecoverySecrets map[string][]byte
	// AlreadyAcknowledged is set when the user had acknowledged before.
	AlreadyAcknowledged bool
}

// PendingUpdate is the pending full update as GET update-manifest shows it.
type PendingUpdate struct {
	Manifest               []byte
	MissingUsers           []string
	MissingAcknowledgments int
}

// tryUpdate applies a package update at once, or starts a full manifest update
// that needs the acknowledgements the current manifest's UpdateThreshold
// asks for (applied at once when the initiator alone suffices).
func (c *Core) tryUpdate(ctx context.Context, peer []*x509.Certificate, raw []byte) (UpdateResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	u, err := identify(s, opUpdate, peer)
	if err != nil {
		return UpdateResult{}, err
	}
	if s.persisted.Pending != nil {
		return UpdateResult{}, errUpdatePending
	}
	m, err := manifest.Parse(raw)
	if err != nil {
		return UpdateResult{}, err
	}
	if m.IsPackageUpdate() {
		return UpdateResult{}, c.updatePackages(ctx, s, u, m)
	}
	if err := authorize(u, manifest.ActionUpdateManifest); err != nil {
		return UpdateResult{}, err
	}
	if err := m.Validate(); err != nil {
		return UpdateResult{}, err
	}
	if err := c.opts.SecretLimits.Check(m.Secrets); err != nil {
		return UpdateResult{}, classify(ErrInvalidRequest, err)
	}
	if err := checkSealModeChange(s.manifest, m); err != nil {
		return UpdateResult{}, err
	}
	required := s.users.WithAction(manifest.ActionUpdateManifest)
	needed := int(s.manifest.Config.UpdateThreshold)
	if needed == 0 {
		needed = len(required)
	}
	p := &sealedstate.PendingUpdate{ManifestRaw: bytes.Clone(raw), RequiredUsers: required, Acknowledged: []string{u.Name}, Needed: needed}
	st := *s.persisted
	now := c.opts.Now()
	fp := fingerprint(raw)
	if p.MissingAcknowledgments() == 0 {
		st.UpdateLog = append(slices.Clip(st.UpdateLog), updatelog.UpdateInitiatedApplied(now, u.Name, fp))
		// The initiator alone applied it: no one acknowledged.
		return c.applyFullUpdate(ctx, s, &st, m, raw, nil)
	}
	st.Pending = p
	st.UpdateLog = append(slices.Clip(st.UpdateLog), updatelog.UpdateInitiatedWaiting(now, u.Name, p.MissingAcknowledgments(), p.MissingUsers(), fp))
	if err := c.persist(ctx, s, &st); err != nil {
		return UpdateResult{}, err
	}
	c.log.Info("manifest update initiated", "user", u.Name, "manifestFingerprint", fp, "missingAcknowledgments", p.MissingAcknowledgments())
	return UpdateResult{MissingAcknowledgments: p.MissingAcknowledgments(), MissingUsers: p.MissingUsers()}, nil
}

// updatePackages applies a package update (as MarbleRun does): new security
// versions, a new intermediate CA and Marble root (keeping every SAN), and
// shared certificates re-issued under it with their original expiry.
func (c *Core) updatePackages(ctx context.Context, s *snapshot, u *user.User, m *manifest.Manifest) error {
	names := slices.Sorted(maps.Keys(m.Packages))
	for _, n := range names {
		if _, ok := s.persisted.Packages[n]; !ok {
			return classify(ErrNotFound, fmt.Errorf("package %q is not defined in the current manifest", n))
		}
	}
	if err := authorize(u, manifest.ActionUpdateSecurityVersion, names...); err != nil {
		return err
	}
	if err := m.ValidatePackageUpdate(s.persisted.Packages); err != nil {
		return err
	}
	now := c.opts.Now()
	authority, err := s.ca.Rotate(rand.Reader, now)
	if err != nil {
		return err
	}
	st := *s.persisted
	st.Packages = maps.Clone(st.Packages)
	st.UpdateLog = slices.Clip(st.UpdateLog)
	for _, n := range names {
		p := st.Packages[n]
		svn := *m.Packages[n].SecurityVersion
		p.SecurityVersion = &svn
		st.Packages[n] = p
		st.UpdateLog = append(st.UpdateLog, updatelog.SecurityVersionIncreased(now, u.Name, n, svn))
	}
	if st.Secrets, err = c.reissueSharedCerts(s.manifest, st.Secrets, authority, now); err != nil {
		return err
	}
	if st.CA, err = authority.Persist(); err != nil {
		return err
	}
	next := *s
	next.ca = authority
	if err := c.persist(ctx, &next, &st); err != nil {
		return err
	}
	c.log.Info("packages updated", "user", u.Name, "packages", names)
	return nil
}

// reissueSharedCerts re-issues the shared generated certificates under a new
// CA, keeping each certificate's expiry.
func (c *Core) reissueSharedCerts(m *manifest.Manifest, cur map[string]secrets.Secret, a *ca.Authority, now time.Time) (map[string]secrets.Secret, error) {
	out := maps.Clone(cur)
	for _, name := range slices.Sorted(maps.Keys(cur)) {
		v := cur[name]
		if !v.Shared || v.UserDefined || !strings.HasPrefix(v.Type, "cert-") || len(v.Cert) == 0 {
			continue
		}
		old, err := x509.ParseCertificate(v.Cert)
		if err != nil {
			return nil, fmt.Errorf("stored certificate of secret %s: %w", name, err)
		}
		def := m.Secrets[name]
		def.ValidFor = 0
		def.Cert.NotAfter = old.NotAfter
		nv, err := secrets.GenerateCert(rand.Reader, name, def, secretIssuer(a), now)
		if err != nil {
			return nil, fmt.Errorf("re-issuing secret %s: %w", name, err)
		}
		nv.ValidFor = v.ValidFor
		out[name] = nv
	}
	return out, nil
}

// PendingUpdate returns the pending full update.
func (c *Core) PendingUpdate(context.Context) (PendingUpdate, error) {
	s := c.snap.Load()
	if s.state != StateAcceptingMarbles || s.persisted.Pending == nil {
		return PendingUpdate{}, errNoUpdate
	}
	p := s.persisted.Pending
	return PendingUpdate{Manifest: p.ManifestRaw, MissingUsers: p.MissingUsers(), MissingAcknowledgments: p.MissingAcknowledgments()}, nil
}

// tryAcknowledgeUpdate records a required user's acknowledgement of the pending
// update; raw must be byte-identical to the pending manifest. The last
// required acknowledgement applies the update.
func (c *Core) tryAcknowledgeUpdate(ctx context.Context, peer []*x509.Certificate, raw []byte) (UpdateResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	u, err := identify(s, opUpdate, peer)
	if err != nil {
		return UpdateResult{}, err
	}
	p := s.persisted.Pending
	if p == nil {
		return UpdateResult{}, errNoUpdate
	}
	if !slices.Contains(p.RequiredUsers, u.Name) {
		return UpdateResult{}, classify(ErrForbidden, fmt.Errorf("user %s is not allowed to acknowledge manifest updates", u.Name))
	}
	if !bytes.Equal(raw, p.ManifestRaw) {
		return UpdateResult{}, classify(ErrInvalidRequest, errors.New("provided manifest does not match the pending manifest"))
	}
	if slices.Contains(p.Acknowledged, u.Name) {
		return UpdateResult{MissingAcknowledgments: p.MissingAcknowledgments(), MissingUsers: p.MissingUsers(), AlreadyAcknowledged: true}, nil
	}
	np := *p
	np.Acknowledged = append(slices.Clip(p.Acknowledged), u.Name)
	st := *s.persisted
	fp := fingerprint(raw)
	st.UpdateLog = append(slices.Clip(st.UpdateLog), updatelog.UpdateAcknowledged(c.opts.Now(), u.Name, np.MissingAcknowledgments(), np.MissingUsers(), fp))
	if np.MissingAcknowledgments() == 0 {
		m, err := manifest.ParseStored(raw)
		if err != nil {
			return UpdateResult{}, err
		}
		st.Pending = nil
		res, err := c.applyFullUpdate(ctx, s, &st, m, raw, np.Acknowledged)
		if errors.Is(err, ErrInvalidRequest) || errors.Is(err, manifest.ErrInvalid) {
			// The update can never apply: cancel it. A failure of the
			// service (the store, say) keeps it pending, unchanged, and
			// the acknowledgement can be sent again.
			c.cancelAfterFailedApply(ctx, s, fp, err)
		}
		return res, err
	}
	st.Pending = &np
	if err := c.persist(ctx, s, &st); err != nil {
		return UpdateResult{}, err
	}
	c.log.Info("manifest update acknowledged", "user", u.Name, "missingAcknowledgments", np.MissingAcknowledgments())
	return UpdateResult{MissingAcknowledgments: np.MissingAcknowledgments(), MissingUsers: np.MissingUsers()}, nil
}

// cancelAfterFailedApply removes a pending update whose apply failed, with a
// log entry, so that a new update can be started.
func (c *Core) cancelAfterFailedApply(ctx context.Context, s *snapshot, fp string, cause error) {
	st := *s.persisted
	st.Pending = nil
	st.UpdateLog = append(slices.Clip(st.UpdateLog), updatelog.UpdateCancelledOnFailure(c.opts.Now(), fp))
	if err := c.persist(ctx, s, &st); err != nil {
		c.log.Error("cancelling the failed manifest update", "error", err.Error())
		return
	}
	c.log.Warn("manifest update cancelled because it could not be applied", "cause", cause.Error())
}

// tryCancelUpdate cancels the pending update; any user holding UpdateManifest
// may do so.
func (c *Core) tryCancelUpdate(ctx context.Context, peer []*x509.Certificate) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	u, err := identify(s, opUpdate, peer)
	if err != nil {
		return err
	}
	p := s.persisted.Pending
	if p == nil {
		return errNoUpdate
	}
	if err := authorize(u, manifest.ActionUpdateManifest); err != nil {
		return err
	}
	st := *s.persisted
	st.Pending = nil
	st.UpdateLog = append(slices.Clip(st.UpdateLog), updatelog.UpdateCancelled(c.opts.Now(), u.Name, fingerprint(p.ManifestRaw)))
	if err := c.persist(ctx, s, &st); err != nil {
		return err
	}
	c.log.Info("manifest update cancelled", "user", u.Name)
	return nil
}

// applyFullUpdate makes m (uploaded as raw) the manifest, as MarbleRun
// applies a full update: users, packages and secrets follow the new manifest, the
// intermediate CA and Marble root are rotated, and a new data key with new
// recovery secrets is made when the recovery keys changed or SealMode
// became stricter (sealModeTightened). st already carries the log entries
// and pending state of the caller; acked are the users who acknowledged
// the update, the initiator first (nil when the initiator alone applied
// it), recorded in the "quarry: manifest changed" entry
// (docs/update-log.md).
func (c *Core) applyFullUpdate(ctx context.Context, s *snapshot, st *sealedstate.State, m *manifest.Manifest, raw []byte, acked []string) (UpdateResult, error) {
	users, err := user.FromManifest(m)
	if err != nil {
		return UpdateResult{}, classify(ErrInvalidRequest, err)
	}
	now := c.opts.Now()
	authority, err := s.ca.Rotate(rand.Reader, now)
	if err != nil {
		return UpdateResult{}, err
	}
	raw = bytes.Clone(raw)
	sig, err := s.ca.SignRoot(rand.Reader, raw)
	if err != nil {
		return UpdateResult{}, fmt.Errorf("signing manifest: %w", err)
	}
	if m.Config.RotateRootSecret {
		st.PreviousRootSecret = st.RootSecret
		st.RootSecret = make([]byte, 32)
		if _, err := io.ReadFull(rand.Reader, st.RootSecret); err != nil {
			return UpdateResult{}, err
		}
	}
	if st.Secrets, st.PreviousSecrets, err = c.updatedSecrets(s.manifest, m, st.Secrets, st.PreviousSecrets, authority, m.Config.RotateRootSecret); err != nil {
		return UpdateResult{}, err
	}
	if st.CA, err = authority.Persist(); err != nil {
		return UpdateResult{}, err
	}
	st.Manifest, st.ManifestSignature, st.Packages, st.Pending = raw, sig, m.Packages, nil
	st.UpdateLog = append(slices.Clip(st.UpdateLog), updatelog.UpdateApplied(now, fingerprint(raw)),
		updatelog.ManifestChanged(now, acked, s.fingerprint, fingerprint(raw)))

	var res UpdateResult
	header, dek := c.header, c.dek
	recoveryChanged, tightened := manifest.RecoveryKeysChanged(s.manifest, m), sealModeTightened(s.manifest, m)
	newKey := recoveryChanged || tightened
	if newKey {
		// A new data key, with new recovery secrets for it: the recovery
		// keys changed, or the seal mode became stricter, so that no
		// entry sealed under the looser mode opens the new state
		// (docs/sealing.md "SealMode changes"). The key file of the
		// commit holds the new key in the new mode only.
		var pub recovery.Public
		if dek, res.RecoverySecrets, pub, err = newRecoverySecrets(rand.Reader, m); err != nil {
			return UpdateResult{}, err
		}
		header = sealedstate.Header{Format: sealedstate.Format, Recovery: pub}
		st.RecoverySecrets = res.RecoverySecrets
	}
	if m.Config.SealMode == manifest.SealModeDisabled {
		// Only reachable from Disabled (Update refuses turning sealing
		// off): nothing is stored, the key stays in memory.
		c.dek, c.header = dek, header
	} else if err = c.commit(ctx, st, header, dek, m.Config.SealMode); !vault.Stored(err) {
		return UpdateResult{}, err
	}
	c.snap.Store(&snapshot{
		state:       s.state,
		ca:          authority,
		quote:       s.quote,
		persisted:   st,
		manifest:    m,
		users:       users,
		fingerprint: fingerprint(raw),
	})
	c.log.Info("manifest updated", "manifestFingerprint", fingerprint(raw), "recoveryKeysChanged", recoveryChanged,
		"sealMode", sealModeName(m.Config.SealMode), "newDataKey", newKey)
	return res, err
}

// checkSealModeChange refuses an update that turns sealing off. The sealed
// state on disk would then stay as it is, and the next restart would
// silently bring back the state from before the update (docs/sealing.md).
// Turning sealing on (from Disabled) and changing between ProductKey and
// UniqueKey are allowed and take effect with the update; a change to
// UniqueKey also replaces the data key (sealModeTightened).
func checkSealModeChange(cur, next *manifest.Manifest) error {
	if cur.Config.SealMode != manifest.SealModeDisabled && next.Config.SealMode == manifest.SealModeDisabled {
		return classify(ErrInvalidRequest, fmt.Errorf("an update cannot change SealMode from %q to %q: the sealed state on disk would keep the state from before the update, and a restart would silently roll back to it; keep sealing on, or start a new deployment with SealMode Disabled", sealModeName(cur.Config.SealMode), manifest.SealModeDisabled))
	}
	return nil
}

// sealModeTightened reports whether a full update from cur to next makes
// sealing stricter: from ProductKey (or the default) to UniqueKey. The
// data key is then replaced, as for new recovery keys: the key file and the
// other instances' entries (on a shared store) hold the current key sealed
// under ProductKey, which any enclave of the same signer opens, so keeping
// the key would leave the new state readable by every such enclave
// (docs/sealing.md "SealMode changes"). From Disabled nothing was ever
// sealed, and UniqueKey → ProductKey loosens: both keep the key.
func sealModeTightened(cur, next *manifest.Manifest) bool {
	return sealModeName(cur.Config.SealMode) == manifest.SealModeProductKey &&
		next.Config.SealMode == manifest.SealModeUniqueKey
}

func sealModeName(m string) string {
	if m == "" {
		return manifest.SealModeProductKey
	}
	return m
}

// updatedSecrets computes the secrets after a full update and their
// previous values, as MarbleRun does (docs/client-api.md, "Secrets across full
// updates"; templates' .Previous.Secrets):
//
//   - removed secrets go, with their previous values;
//   - new or redefined ones are generated (user-defined ones start empty),
//     and the new value is their previous value too;
//   - unchanged user-defined values, and unchanged symmetric keys unless the
//     root secret rotates, keep their value and their previous value;
//   - other generated secrets (certificates: the intermediate CA changes)
//     are re-issued under the new CA with the new template, and the value
//     they had becomes their previous value.
//
// So a secret's previous value changes only when the secret itself is
// regenerated: a full update that rotates nothing leaves a symmetric key
// and its .Previous as they were. prev is nil before the first full update
// (a template's .Previous is then the current value); a kept secret's
// previous value is then its current one.
func (c *Core) updatedSecrets(old, m *manifest.Manifest, cur, prev map[string]secrets.Secret, a *ca.Authority, rotate bool) (next, nextPrev map[string]secrets.Secret, err error) {
	regen := map[string]manifest.Secret{}
	next = map[string]secrets.Secret{}
	nextPrev = map[string]secrets.Secret{}
	for name, def := range m.Secrets {
		value, had := cur[name]
		oldDef, defined := old.Secrets[name]
		unchanged := had && defined && sameDefinition(oldDef, def)
		keep := unchanged && (def.UserDefined || (def.Type == manifest.SecretTypeSymmetric && !rotate))
		switch {
		case keep:
			next[name] = value
			if p, ok := prev[name]; ok {
				nextPrev[name] = p
			} else {
				nextPrev[name] = value
			}
		case unchanged:
			regen[name] = def
			nextPrev[name] = value
		default:
			regen[name] = def
		}
	}
	gen, err := secrets.Generate(rand.Reader, regen, secretIssuer(a), c.opts.Now())
	if err != nil {
		if errors.Is(err, secrets.ErrInvalid) {
			return nil, nil, classify(ErrInvalidRequest, fmt.Errorf("generating secrets from manifest: %w", err))
		}
		return nil, nil, fmt.Errorf("generating secrets from manifest: %w", err)
	}
	for name, v := range gen {
		next[name] = v
		if _, ok := nextPrev[name]; !ok {
			nextPrev[name] = v // new or redefined
		}
	}
	return next, nextPrev, nil
}

// sameDefinition compares what defines a secret's value (not the
// certificate template).
func sameDefinition(a, b manifest.Secret) bool {
	norm := func(s manifest.Secret) uint {
		if s.ValidFor == 0 && strings.HasPrefix(s.Type, "cert-") {
			return secrets.DefaultValidFor
		}
		return s.ValidFor
	}
	return a.Type == b.Type && a.Size == b.Size && a.Shared == b.Shared && a.UserDefined == b.UserDefined && norm(a) == norm(b)
}

// Update: see tryUpdate.
func (c *Core) Update(ctx context.Context, peer []*x509.Certificate, raw []byte) (UpdateResult, error) {
	return retry(c, ctx, func() (UpdateResult, error) { return c.tryUpdate(ctx, peer, raw) })
}

// AcknowledgeUpdate: see tryAcknowledgeUpdate.
func (c *Core) AcknowledgeUpdate(ctx context.Context, peer []*x509.Certificate, raw []byte) (UpdateResult, error) {
	return retry(c, ctx, func() (UpdateResult, error) { return c.tryAcknowledgeUpdate(ctx, peer, raw) })
}

// CancelUpdate: see tryCancelUpdate.
func (c *Core) CancelUpdate(ctx context.Context, peer []*x509.Certificate) error {
	_, err := retry(c, ctx, func() (struct{}, error) { return struct{}{}, c.tryCancelUpdate(ctx, peer) })
	return err
}
