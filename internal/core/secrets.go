package core

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/updatelog"
	"github.com/quarry-cc/quarry/manifest"
)

// secretIssuer is the CA that signs secret certificates: the Marble root
// subject, signed with the intermediate key.
func secretIssuer(a *ca.Authority) secrets.Issuer {
	return secrets.Issuer{Cert: a.MarbleRoot, Key: a.IntermediateKey}
}

// Secrets returns the named secrets to a user holding ReadSecret on all of
// them.
func (c *Core) Secrets(_ context.Context, peer []*x509.Certificate, names []string) (map[string]secrets.Secret, error) {
	s := c.snap.Load()
	u, err := identify(s, opSecrets, peer)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, classify(ErrInvalidRequest, errors.New("no secret names given"))
	}
	for _, n := range names {
		if _, ok := s.persisted.Secrets[n]; !ok {
			return nil, classify(ErrNotFound, fmt.Errorf("secret %q is not defined in the manifest", n))
		}
	}
	if err := authorize(u, manifest.ActionReadSecret, names...); err != nil {
		return nil, err
	}
	out := make(map[string]secrets.Secret, len(names))
	for _, n := range names {
		out[n] = s.persisted.Secrets[n]
	}
	return out, nil
}

// trySetSecrets stores user-defined secrets uploaded by a user holding
// WriteSecret on all of them. The request is all-or-nothing: every upload is
// checked, the templates are dry-run with the new values, and the state is
// sealed and stored with one update-log entry per secret before it returns.
func (c *Core) trySetSecrets(ctx context.Context, peer []*x509.Certificate, uploads map[string]secrets.Upload) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	u, err := identify(s, opSecrets, peer)
	if err != nil {
		return err
	}
	if len(uploads) == 0 {
		return classify(ErrInvalidRequest, errors.New("no new secrets defined"))
	}
	names := slices.Sorted(maps.Keys(uploads))
	for _, n := range names {
		if _, ok := s.persisted.Secrets[n]; !ok {
			return classify(ErrNotFound, fmt.Errorf("secret %q is not defined in the manifest", n))
		}
	}
	if err := authorize(u, manifest.ActionWriteSecret, names...); err != nil {
		return err
	}
	next := maps.Clone(s.persisted.Secrets)
	for _, n := range names {
		v, err := secrets.ApplyUpload(n, s.persisted.Secrets[n], uploads[n])
		if err != nil {
			return classify(ErrInvalidRequest, err)
		}
		next[n] = v
	}
	if err := dryRun(s.manifest, next); err != nil {
		return classify(ErrInvalidRequest, fmt.Errorf("the new secrets make a template fail: %w", err))
	}
	st := *s.persisted
	st.Secrets = next
	now := c.opts.Now()
	st.UpdateLog = slices.Clip(st.UpdateLog)
	for _, n := range names {
		st.UpdateLog = append(st.UpdateLog, updatelog.SecretSet(now, u.Name, n, next[n].Type))
	}
	if err := c.persist(ctx, s, &st); err != nil {
		return err
	}
	c.log.Info("secrets set", "user", u.Name, "secrets", names)
	return nil
}

// UpdateLog returns the update log, one JSON entry per string.
// Quarry's own entries (updatelog.IsAudit) are left out, so that the
// answer stays MarbleRun's.
func (c *Core) UpdateLog(ctx context.Context) ([]string, error) {
	s := c.snap.Load()
	if err := require(s.state, opUpdate); err != nil {
		return nil, err
	}
	log, err := c.logs.Full(ctx, s.persisted)
	if err != nil {
		return nil, err
	}
	return updatelog.Legacy(log), nil
}

// dryRun renders every Marble's parameters with the secrets that have a
// value; the others keep the manifest dry run's dummies.
func dryRun(m *manifest.Manifest, values map[string]secrets.Secret) error {
	set := make(map[string]secrets.Secret, len(values))
	for name, v := range values {
		if v.IsSet() {
			set[name] = v
		}
	}
	return m.DryRun(templateSecrets(set))
}

// templateSecrets gives secret values the form templates see them in.
func templateSecrets(in map[string]secrets.Secret) map[string]manifest.TemplateSecret {
	out := make(map[string]manifest.TemplateSecret, len(in))
	for name, v := range in {
		out[name] = manifest.TemplateSecret{
			Type: v.Type, Size: v.Size, Shared: v.Shared, UserDefined: v.UserDefined, ValidFor: v.ValidFor,
			Cert: manifest.CertDER(v.Cert), Private: manifest.PrivateKey(v.Private), Public: manifest.PublicKey(v.Public),
		}
	}
	return out
}

// SetSecrets: see trySetSecrets.
func (c *Core) SetSecrets(ctx context.Context, peer []*x509.Certificate, uploads map[string]secrets.Upload) error {
	_, err := retry(c, ctx, func() (struct{}, error) { return struct{}{}, c.trySetSecrets(ctx, peer, uploads) })
	return err
}
