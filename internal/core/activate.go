package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/vault"

	"github.com/google/uuid"

	"github.com/quarry-cc/quarry/internal/attest/policy"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/manifest"
)

// ActivationRequest is a Marble's request to be activated (MarbleRun's
// Activate call of the Marble API).
type ActivationRequest struct {
	// Quote is the Marble's SGX quote over SHA-256 of its TLS client
	// certificate (empty in simulation).
	Quote []byte
	// CSR is a DER certificate request; its subject and SANs go into the
	// Marble's certificate.
	CSR []byte
	// MarbleType names the Marble in the manifest.
	MarbleType string
	// UUID identifies the Marble instance (any form google/uuid parses).
	UUID string
	// Peer is the TLS client certificate chain; only the leaf counts
	// (intermediates a client sends prove nothing: docs/trust.md).
	Peer []*x509.Certificate
}

// Activation is what an activated Marble receives.
type Activation struct {
	Files map[string][]byte
	Env   map[string][]byte
	Argv  []string
}

// The environment variables the Coordinator adds to every activation (as
// MarbleRun names them, which Marbles read).
const (
	EnvRootCA           = "MARBLE_PREDEFINED_ROOT_CA"
	EnvCertificateChain = "MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN"
	EnvPrivateKey       = "MARBLE_PREDEFINED_PRIVATE_KEY"
	EnvCoordinatorRoot  = "MARBLE_PREDEFINED_COORDINATOR_ROOT_CA"
	EnvTTLSConfig       = "MARBLE_TTLS_CONFIG"
)

// ActivationRefusal is the reason an activation was refused, in a small
// fixed set (for logs and metrics).
type ActivationRefusal string

// Refusal reasons.
const (
	RefusedState          ActivationRefusal = "state"
	RefusedNoCertificate  ActivationRefusal = "no_certificate"
	RefusedUnknownType    ActivationRefusal = "unknown_marble_type"
	RefusedUnknownPackage ActivationRefusal = "unknown_package"
	RefusedQuote          ActivationRefusal = "quote"
	RefusedMaxActivations ActivationRefusal = "max_activations"
	RefusedUUID           ActivationRefusal = "uuid"
	RefusedCSR            ActivationRefusal = "csr"
	RefusedSecrets        ActivationRefusal = "secrets"
	RefusedTTLS           ActivationRefusal = "ttls"
	RefusedTemplates      ActivationRefusal = "templates"
	RefusedStore          ActivationRefusal = "store"
	// RefusedInternal is an activation that failed for a reason outside
	// the Marble's request (an internal error, an abandoned deadline).
	RefusedInternal ActivationRefusal = "internal"
)

// ActivationAttempt describes one finished activation attempt, for the
// OnActivation hook (metrics).
type ActivationAttempt struct {
	// MarbleType and UUID are as the Marble sent them (unchecked: any
	// string).
	MarbleType, UUID string
	// KnownType tells whether the current manifest defines MarbleType.
	KnownType bool
	// Refused is "" on success, else the reason.
	Refused ActivationRefusal
}

// ActivationError is a refused activation: its message is the client's
// (in MarbleRun's wording, which clients match); it unwraps to the class (ErrWrongState,
// ErrUnauthenticated, ErrForbidden, ErrInvalidRequest, or none for an
// internal failure) and to the cause.
type ActivationError struct {
	Reason ActivationRefusal
	class  error
	msg    string
	cause  error
}

func (e *ActivationError) Error() string { return e.msg }

// Unwrap returns the class and the cause.
func (e *ActivationError) Unwrap() []error {
	var out []error
	if e.class != nil {
		out = append(out, e.class)
	}
	if e.cause != nil {
		out = append(out, e.cause)
	}
	return out
}

func refuse(reason ActivationRefusal, class error, cause error, format string, args ...any) *ActivationError {
	return &ActivationError{Reason: reason, class: class, msg: fmt.Sprintf(format, args...), cause: cause}
}

// Activate activates a Marble (every check in MarbleRun's order, so that a
// refused Marble gets the same reason): it verifies the Marble's quote against its package (unless the
// Coordinator runs in simulation), issues its certificate, makes its
// per-Marble secrets, renders its parameters and, when the Marble type has
// MaxActivations, counts the activation in the sealed state before it
// answers. A refusal is an *ActivationError and changes nothing.
func (c *Core) Activate(ctx context.Context, req ActivationRequest) (*Activation, error) {
	act, err := c.activate(ctx, req)
	var ae *ActivationError
	if errors.As(err, &ae) {
		c.log.Warn("marble activation refused", "marbleType", logValue(req.MarbleType), "uuid", logValue(req.UUID), "reason", string(ae.Reason), "error", logValue(err.Error()))
		c.activationAttempted(req, ae.Reason)
		return nil, err
	}
	if err != nil {
		c.activationAttempted(req, RefusedInternal)
		return nil, err
	}
	c.log.Info("marble activated", "marbleType", req.MarbleType, "uuid", logValue(req.UUID), "attested", !c.simulation)
	c.activationAttempted(req, "")
	return act, nil
}

// activationAttempted calls the OnActivation hook, if any.
func (c *Core) activationAttempted(req ActivationRequest, refused ActivationRefusal) {
	if c.opts.OnActivation == nil {
		return
	}
	known := false
	if m := c.snap.Load().manifest; m != nil {
		_, known = m.Marbles[req.MarbleType]
	}
	c.opts.OnActivation(ActivationAttempt{MarbleType: req.MarbleType, UUID: req.UUID, KnownType: known, Refused: refused})
}

func (c *Core) tryActivate(ctx context.Context, req ActivationRequest) (*Activation, error) {
	s := c.snap.Load()
	if s.state != StateAcceptingMarbles {
		return nil, refuse(RefusedState, ErrWrongState, nil, "cannot accept marbles in current state")
	}
	if len(req.Peer) == 0 || req.Peer[0] == nil {
		return nil, refuse(RefusedNoCertificate, ErrUnauthenticated, nil, "couldn't get marble TLS certificate")
	}
	leafCert := req.Peer[0]
	marble, ok := s.manifest.Marbles[req.MarbleType]
	if !ok {
		return nil, refuse(RefusedUnknownType, ErrForbidden, nil, "marble verification failed: unknown marble type requested")
	}
	pkg, ok := s.persisted.Packages[marble.Package]
	if !ok {
		return nil, refuse(RefusedUnknownPackage, ErrForbidden, nil, "marble verification failed: undefined package %q", marble.Package)
	}
	if err := c.verifyMarbleQuote(ctx, req.Quote, leafCert, pkg); err != nil {
		return nil, err
	}
	if err := checkActivations(s.persisted, req.MarbleType, marble.MaxActivations); err != nil {
		return nil, err
	}
	id, err := uuid.Parse(req.UUID)
	if err != nil {
		return nil, refuse(RefusedUUID, ErrInvalidRequest, err, "invalid UUID: %v", err)
	}
	csr, err := x509.ParseCertificateRequest(req.CSR)
	if err != nil {
		return nil, refuse(RefusedCSR, nil, err, "generating marble authentication secrets: parsing CSR: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, refuse(RefusedCSR, nil, err, "generating marble authentication secrets: signature over CSR is invalid: %v", err)
	}
	now := c.opts.Now()
	leaf, err := s.ca.IssueMarbleCert(rand.Reader, csr, id.String(), req.MarbleType, now)
	if err != nil {
		return nil, refuse(RefusedCSR, nil, err, "generating marble authentication secrets: %v", err)
	}
	binding := secrets.Binding{UUID: secrets.UUID(id), Marble: req.MarbleType, DisableSecretBinding: marble.DisableSecretBinding}
	cur, err := c.marbleSecrets(s, s.persisted.Secrets, s.persisted.RootSecret, binding, now)
	if err != nil {
		return nil, refuse(RefusedSecrets, nil, err, "generating marble secrets: %v", err)
	}
	// .Previous.Secrets: the values from before the last full update or
	// root-secret rotation; before any, the current ones (the same
	// per-Marble values, not a second set).
	prev := cur
	if s.persisted.PreviousSecrets != nil || len(s.persisted.PreviousRootSecret) > 0 {
		prevRoot := s.persisted.PreviousRootSecret
		if len(prevRoot) == 0 {
			prevRoot = s.persisted.RootSecret
		}
		prevStored := s.persisted.PreviousSecrets
		if prevStored == nil {
			prevStored = s.persisted.Secrets
		}
		if prev, err = c.marbleSecrets(s, prevStored, prevRoot, binding, now); err != nil {
			return nil, refuse(RefusedSecrets, nil, err, "generating marble secrets: %v", err)
		}
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.Key)
	if err != nil {
		return nil, refuse(RefusedCSR, nil, err, "generating marble authentication secrets: %v", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&leaf.Key.PublicKey)
	if err != nil {
		return nil, refuse(RefusedCSR, nil, err, "generating marble authentication secrets: %v", err)
	}
	ttls, err := ttlsConfig(s.manifest, marble, cur, s.ca.MarbleRoot, leaf.Cert.Raw, keyDER)
	if err != nil {
		return nil, refuse(RefusedTTLS, nil, err, "creating TTLS config: %v", err)
	}
	data := &manifest.TemplateData{
		MarbleRun: manifest.TemplateMarbleRun{
			RootCA:                  manifest.TemplateSecret{Cert: s.ca.MarbleRoot.Raw},
			MarbleCert:              manifest.TemplateSecret{Cert: leaf.Cert.Raw, Public: pubDER, Private: keyDER},
			CoordinatorRoot:         manifest.TemplateSecret{Cert: s.ca.Root.Raw},
			CoordinatorIntermediate: manifest.TemplateSecret{Cert: s.ca.Intermediate.Raw},
		},
		Secrets:  templateSecrets(cur),
		Previous: manifest.TemplatePrevious{Secrets: templateSecrets(prev)},
	}
	rendered, err := marble.Parameters.Render(data)
	if err != nil {
		return nil, refuse(RefusedTemplates, nil, err, "customizing marble parameters: %v", err)
	}
	env := rendered.Env
	if env == nil {
		env = map[string][]byte{}
	}
	env[EnvRootCA] = pemCert(s.ca.MarbleRoot.Raw)
	env[EnvCertificateChain] = append(pemCert(leaf.Cert.Raw), pemCert(s.ca.Intermediate.Raw)...)
	env[EnvPrivateKey] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	env[EnvCoordinatorRoot] = pemCert(s.ca.Root.Raw)
	if ttls != nil {
		env[EnvTTLSConfig] = ttls
	}
	if marble.MaxActivations > 0 {
		if err := c.countActivation(ctx, s, req.MarbleType, marble.MaxActivations); err != nil {
			return nil, err
		}
	}
	ev := ActivationEvent{Time: now, MarbleType: req.MarbleType, UUID: id.String()}
	if !c.simulation {
		ev.Quote = compactQuote(req.Quote) // verified; in simulation it is whatever was sent
	}
	c.events.record(ev)
	return &Activation{Files: rendered.Files, Env: env, Argv: rendered.Argv}, nil
}

// verifyMarbleQuote checks the Marble's quote (not in simulation): DCAP
// verification of the declared quote (bytes after it are ignored, as by
// Intel's library), report data = SHA-256 of the TLS client certificate, and
// the package's properties and TCB rules. Infrastructures are not
// evaluated (MarbleRun's validator ignores them too).
func (c *Core) verifyMarbleQuote(ctx context.Context, quote []byte, leafCert *x509.Certificate, pkg manifest.Package) error {
	if c.simulation {
		c.simOnce.Do(func() {
			c.log.Warn("simulation mode: Marbles are activated WITHOUT attestation (their quotes are not checked); do not use this for production secrets")
		})
		return nil
	}
	invalid := func(err error) error {
		return refuse(RefusedQuote, ErrForbidden, err, "marble verification failed: invalid quote: %v", err)
	}
	if c.opts.QuoteVerifier == nil {
		return invalid(errors.New("the Coordinator has no collateral source to verify quotes; its operator must start it with --collateral-file or --pccs-url"))
	}
	if len(quote) == 0 {
		return invalid(errors.New("the quote is empty"))
	}
	res, err := c.opts.QuoteVerifier.Verify(ctx, declaredQuote(quote))
	if err != nil {
		return invalid(err)
	}
	sum := sha256.Sum256(leafCert.Raw)
	if err := policy.CheckReportData(res, sum[:]); err != nil {
		return invalid(fmt.Errorf("the quote is not bound to the TLS client certificate: %w", err))
	}
	if err := policy.Check(res, pkg); err != nil {
		return invalid(err)
	}
	return nil
}

func checkActivations(st *sealedstate.State, marbleType string, max uint) error {
	if max > 0 && st.Activations[marbleType] >= uint64(max) {
		return refuse(RefusedMaxActivations, ErrForbidden, nil, "marble verification failed: reached max activations count (%d) for marble type %q", max, marbleType)
	}
	return nil
}

// countActivation counts one activation of a Marble type with
// MaxActivations in the sealed state (under the lock, checking the limit
// again against concurrent activations) before the Marble gets its answer:
// a crash after the answer never allows one activation too many.
func (c *Core) countActivation(ctx context.Context, s *snapshot, marbleType string, max uint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.snap.Load()
	if !sameActivationBasis(cur, s) {
		return refuse(RefusedStore, ErrConflict, nil, "the manifest or the Coordinator's certificates changed during the activation; activate again")
	}
	if err := checkActivations(cur.persisted, marbleType, max); err != nil {
		return err
	}
	st := *cur.persisted
	st.Activations = maps.Clone(st.Activations)
	if st.Activations == nil {
		st.Activations = map[string]uint64{}
	}
	st.Activations[marbleType]++
	if err := c.persist(ctx, cur, &st); !vault.Stored(err) {
		return refuse(RefusedStore, nil, err, "storing the activation count: %v", err)
	} else if err != nil {
		c.log.Error("activation count stored with an error", "error", err.Error())
	}
	return nil
}

// sameActivationBasis reports whether an activation prepared from snapshot
// s may be counted in cur: what it handed out still holds — the same
// manifest, the same certificates (the Marble's certificate is issued by
// the intermediate, its environment names the roots) and the same root
// secret (per-Marble keys derive from it). Other changes (a counter, an
// uploaded secret, another type's activation, the same state reloaded after
// another instance's commit) do not make the answer wrong, so they do not
// abort it.
func sameActivationBasis(cur, s *snapshot) bool {
	if cur == s {
		return true
	}
	if cur.persisted == nil || s.persisted == nil || cur.persisted.Manifest == nil || cur.ca == nil || s.ca == nil {
		return false
	}
	return fingerprint(cur.persisted.Manifest) == s.fingerprint &&
		cur.ca.Root.Equal(s.ca.Root) &&
		cur.ca.Intermediate.Equal(s.ca.Intermediate) &&
		cur.ca.MarbleRoot.Equal(s.ca.MarbleRoot) &&
		bytes.Equal(cur.persisted.RootSecret, s.persisted.RootSecret)
}

// marbleSecrets returns the secrets one activation sees: the stored shared
// and user-defined values, and per-Marble values made now (symmetric keys
// derived from root, certificates issued fresh).
func (c *Core) marbleSecrets(s *snapshot, stored map[string]secrets.Secret, root []byte, b secrets.Binding, now time.Time) (map[string]secrets.Secret, error) {
	out := make(map[string]secrets.Secret, len(stored))
	for _, name := range slices.Sorted(maps.Keys(stored)) {
		v := stored[name]
		if v.Shared || v.UserDefined {
			out[name] = v
			continue
		}
		def, ok := s.manifest.Secrets[name]
		if !ok {
			// A previous secret the current manifest no longer defines.
			out[name] = v
			continue
		}
		var err error
		if def.Type == manifest.SecretTypeSymmetric {
			out[name], err = secrets.DerivePerMarble(root, name, def, b)
		} else {
			def.ValidFor = v.ValidFor
			out[name], err = secrets.GenerateCert(rand.Reader, name, def, secretIssuer(s.ca), now)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// MaxTTLSEntries bounds the TLS tag entries of one Marble.
const MaxTTLSEntries = 1024

// maxLogValue bounds request values written to the log.
const maxLogValue = 200

// logValue shortens a value sent by a client before it is logged.
func logValue(s string) string {
	if len(s) <= maxLogValue {
		return s
	}
	return s[:maxLogValue] + "…(truncated)"
}

// ttlsEntry is one connection of MARBLE_TTLS_CONFIG (PEM strings).
type ttlsEntry struct {
	CACrt      string `json:"cacrt"`
	CliCrt     string `json:"clicrt"`
	CliKey     string `json:"clikey"`
	ClientAuth *bool  `json:"clientAuth,omitempty"`
}

// ttlsConfig renders MARBLE_TTLS_CONFIG for a Marble with TLS tags
// (MarbleRun's format, which its TTLS library reads); nil without tags.
func ttlsConfig(m *manifest.Manifest, marble manifest.Marble, cur map[string]secrets.Secret, marbleRoot *x509.Certificate, leafDER, keyDER []byte) ([]byte, error) {
	if len(marble.TLS) == 0 {
		return nil, nil
	}
	caPEM := string(pemCert(marbleRoot.Raw))
	leafPEM := string(pemCert(leafDER))
	keyPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	incoming := map[string]ttlsEntry{}
	outgoing := map[string]ttlsEntry{}
	entries := 0
	for _, tag := range marble.TLS {
		t, ok := m.TLS[tag]
		if !ok {
			return nil, fmt.Errorf("TLS tag %q is not defined in the manifest", tag)
		}
		// Each entry becomes a few KiB of PEM: bound what a manifest can
		// make one answer carry.
		if entries += len(t.Outgoing) + len(t.Incoming); entries > MaxTTLSEntries {
			return nil, fmt.Errorf("the Marble's TLS tags have more than %d entries", MaxTTLSEntries)
		}
		for _, e := range t.Outgoing {
			outgoing[e.Addr+":"+e.Port] = ttlsEntry{CACrt: caPEM, CliCrt: leafPEM, CliKey: keyPEM}
		}
		for _, e := range t.Incoming {
			entry := ttlsEntry{CACrt: caPEM, CliCrt: leafPEM, CliKey: keyPEM}
			auth := true
			if e.Cert != "" {
				sec, ok := cur[e.Cert]
				if !ok {
					return nil, fmt.Errorf("secret %q of TLS tag %q is not defined", e.Cert, tag)
				}
				if len(sec.Cert) == 0 || len(sec.Private) == 0 {
					// MarbleRun hands out empty PEM blocks here; a Marble
					// then fails later with a less clear error.
					return nil, fmt.Errorf("secret %q of TLS tag %q has no certificate and private key yet (a user-defined secret must be uploaded first)", e.Cert, tag)
				}
				entry.CliCrt = pemBlock("CERTIFICATE", sec.Cert)
				entry.CliKey = pemBlock("PRIVATE KEY", sec.Private)
				auth = false
			}
			entry.ClientAuth = &auth
			incoming["*:"+e.Port] = entry
		}
	}
	return json.Marshal(map[string]any{"tls": map[string]any{"Incoming": incoming, "Outgoing": outgoing}})
}

func pemBlock(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func (c *Core) activate(ctx context.Context, req ActivationRequest) (*Activation, error) {
	return retry(c, ctx, func() (*Activation, error) { return c.tryActivate(ctx, req) })
}
