package core

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

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
//
// Uploads that arrive while a change is being stored queue and are stored
// together by one commit (setSecretsBatch): each is checked against the
// state with the uploads before it in the queue, as if it ran alone after
// them.
func (c *Core) trySetSecrets(ctx context.Context, peer []*x509.Certificate, uploads map[string]secrets.Upload) error {
	r := &uploadRequest{ctx: ctx, peer: peer, uploads: uploads}
	c.uploads.add(r)
	c.mu.Lock()
	defer c.mu.Unlock()
	if batch := c.uploads.take(); len(batch) > 0 {
		c.setSecretsBatch(ctx, batch)
	}
	// r was in the queue: either an earlier holder of mu answered it with
	// its batch, or this call just did.
	return r.err
}

// setSecretsBatch applies the uploads of batch in order to the current
// state, each all-or-nothing and checked as trySetSecrets says, and stores
// the result with one commit. An upload that is refused is answered with
// its own error and changes nothing; when the commit fails, every upload
// it carried is answered with the commit's error and the state stays as it
// was (unless the error says the change is stored, vault.Stored). Callers
// hold mu.
func (c *Core) setSecretsBatch(ctx context.Context, batch []*uploadRequest) {
	s := c.snap.Load()
	st := *s.persisted
	st.UpdateLog = slices.Clip(st.UpdateLog)
	var applied []*uploadRequest
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil && len(batch) > 1 {
			r.err = err
			continue
		}
		next, entries, err := c.applyUploads(s, st.Secrets, r)
		if err != nil {
			r.err = err
			continue
		}
		st.Secrets = next
		st.UpdateLog = append(st.UpdateLog, entries...)
		applied = append(applied, r)
	}
	if len(applied) == 0 {
		return
	}
	if len(batch) > 1 {
		// The commit answers other requests too: one caller going away
		// must not cancel it.
		ctx = context.WithoutCancel(ctx)
	}
	err := c.persist(ctx, s, &st)
	for _, r := range applied {
		r.err = err
		if err == nil {
			c.log.Info("secrets set", "user", r.user, "secrets", r.names)
		}
	}
}

// applyUploads checks the uploads of request r against the secrets cur of
// the state s and returns the new secrets and the update-log entries.
func (c *Core) applyUploads(s *snapshot, cur map[string]secrets.Secret, r *uploadRequest) (map[string]secrets.Secret, []string, error) {
	uploads := r.uploads
	u, err := identify(s, opSecrets, r.peer)
	if err != nil {
		return nil, nil, err
	}
	if len(uploads) == 0 {
		return nil, nil, classify(ErrInvalidRequest, errors.New("no new secrets defined"))
	}
	names := slices.Sorted(maps.Keys(uploads))
	for _, n := range names {
		if _, ok := cur[n]; !ok {
			return nil, nil, classify(ErrNotFound, fmt.Errorf("secret %q is not defined in the manifest", n))
		}
	}
	if err := authorize(u, manifest.ActionWriteSecret, names...); err != nil {
		return nil, nil, err
	}
	next := maps.Clone(cur)
	for _, n := range names {
		v, err := secrets.ApplyUpload(n, cur[n], uploads[n])
		if err != nil {
			return nil, nil, classify(ErrInvalidRequest, err)
		}
		next[n] = v
	}
	if err := dryRun(s.manifest, next); err != nil {
		return nil, nil, classify(ErrInvalidRequest, fmt.Errorf("the new secrets make a template fail: %w", err))
	}
	now := c.opts.Now()
	entries := make([]string, 0, len(names))
	for _, n := range names {
		entries = append(entries, updatelog.SecretSet(now, u.Name, n, next[n].Type))
	}
	r.user, r.names = u.Name, names
	return next, entries, nil
}

// uploadRequest is one SetSecrets call waiting in the upload queue.
type uploadRequest struct {
	ctx     context.Context
	peer    []*x509.Certificate
	uploads map[string]secrets.Upload
	// Set by the batch that takes the request (under Core.mu):
	err   error
	user  string
	names []string
}

// uploadQueue holds the SetSecrets calls waiting for the state lock; the
// holder of the lock takes them all and stores them with one commit.
type uploadQueue struct {
	mu      sync.Mutex
	pending []*uploadRequest
}

func (q *uploadQueue) add(r *uploadRequest) {
	q.mu.Lock()
	q.pending = append(q.pending, r)
	q.mu.Unlock()
}

func (q *uploadQueue) take() []*uploadRequest {
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.pending
	q.pending = nil
	return b
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
