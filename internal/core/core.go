// Package core is the Coordinator: the state machine and the use cases of
// the Client API. It owns the lock and the state transaction (load, change,
// seal, store, then answer) and reaches storage, sealing and attestation only
// through interfaces.
package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quarry-cc/quarry/internal/logstore"
	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/vault"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/updatelog"
	"github.com/quarry-cc/quarry/internal/user"
	"github.com/quarry-cc/quarry/manifest"
)

// Options are the Coordinator's dependencies.
type Options struct {
	// Names are the SANs of the CA certificates (loopback is always added).
	Names ca.Names
	// Data holds the sealed state (sealed_data); Key holds the sealed data
	// key (sealed_key).
	Data, Key store.Store
	// KeySealer seals the data key for Key. Whether it protects the key
	// (seal.ProtectsKey: an enclave) decides what the Coordinator takes
	// from the stores in clear (docs/threat-model.md).
	KeySealer seal.KeySealer
	// MigrateMarbleRun says whether a MarbleRun sealed_data is migrated
	// (migrate.go; the zero value: only without an enclave).
	MigrateMarbleRun MarbleRunMigration
	// Issuer produces quotes; attest.ErrUnsupported means simulation.
	Issuer attest.Issuer
	// AllowQuoteFailure keeps the Coordinator running without a quote when
	// the issuer fails at start (EDG_COORDINATOR_DEV_MODE=1); otherwise the
	// failure stops it.
	AllowQuoteFailure bool
	// QuoteVerifier verifies quotes for sign-quote; nil means no collateral
	// source is configured (see signquote.go).
	QuoteVerifier QuoteVerifier
	// Logger receives operational messages (never secrets).
	Logger *slog.Logger
	// RecoveryTimeout is how long an incomplete recovery round lives after
	// its first accepted share (0: forever).
	RecoveryTimeout time.Duration
	// EphemeralKeyBits is the size of the recovery ephemeral RSA key
	// (default 4096).
	EphemeralKeyBits int
	// SecretLimits bound the secrets a manifest set or full update may
	// generate (zero fields: no limit; see secrets.DefaultLimits).
	SecretLimits secrets.Limits
	// CounterLimits bound the monotonic counters Marbles create (zero
	// fields: no limit; see DefaultCounterLimits).
	CounterLimits CounterLimits
	// ActivationEvents is how many activation events are kept in memory
	// (0: DefaultActivationEvents; negative: none).
	ActivationEvents int
	// OnActivation, if set, is called after every activation attempt
	// (metrics). It must be quick and must not call the Core.
	OnActivation func(ActivationAttempt)
	// OnCommit, if set, is called after every attempt to store a changed
	// state (metrics). It must be quick and must not call the Core.
	OnCommit func(CommitResult)
	// InstanceID, with a shared store, names this instance's entry in the
	// key file (instancekeys.go); nil writes the single-instance key file.
	InstanceID *seal.InstanceID
	// KeySource, if set, is asked for the data key when no entry of the
	// key file opens here (an attested peer; internal/peer).
	KeySource KeySource
	// LogSegments returns the store of update log segment n (beside Data;
	// internal/logstore). Nil keeps the whole log in the sealed state.
	LogSegments func(n uint64) (store.Store, error)
	// RestoreMarker holds the marker `coordinator restore` leaves in the
	// seal directory (restored.go); nil where there is none (etcd).
	RestoreMarker store.Store
	// MaxStateBytes bounds the state's JSON (0: DefaultMaxStateBytes): a
	// change beyond it is refused with ErrTooLarge.
	MaxStateBytes int
	// StoreTimeout bounds each step with a shared store (a write, the
	// read-back of a write whose outcome is unknown, the wait for the
	// state lock in Sync): with the store away, answers come within it
	// (0: DefaultStoreTimeout).
	StoreTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Core is the Coordinator. Reads take an immutable snapshot without locking;
// every change runs under mu, is sealed and stored, and only then becomes
// visible.
//
// Locking: the fields below mu up to rec are guarded by mu (New and load
// run before the Core is shared and take no lock). The others are set in
// New and then only read, or are atomic, or carry their own lock (vault's
// known keys, rec's ephemeral key, events, logs' caches).
type Core struct {
	opts Options
	log  *slog.Logger

	mu stateLock // serialises state transactions (lock.go)
	// uploads queues SetSecrets calls for one commit (secrets.go).
	uploads uploadQueue
	// Guarded by mu:
	vault *vault.Vault // the stored pair of sealed state and key file
	// dek is the data key of the current state (kept in memory with
	// SealMode Disabled too, so that turning sealing on later uses the key
	// the recovery secrets were made for); nil until known.
	dek []byte
	// unreadable is the sealed blob that could not be opened (recovery
	// mode), kept for recovery: set on entering recovery mode (again by a
	// reload that finds it once more), nil once a recovered or new state
	// is stored in its place.
	unreadable []byte
	// recovering is the blob recovery mode was entered for: a reload that
	// finds the same blob keeps the round (enterRecovery).
	recovering []byte
	// header is the current sealed state's public header.
	header sealedstate.Header
	// rec is the recovery round (recovery mode only); its ephemeral key
	// has its own lock, its progress is atomic.
	rec recoveryRound

	// Set in New, then only read:
	// simulation is set when the Coordinator has no quote issuer: Marble
	// quotes are then not checked (as MarbleRun does).
	simulation bool

	// Safe for concurrent use on their own:
	simOnce sync.Once
	events  eventLog // its own lock
	// sealedSize is the size of the sealed blob the store is known to
	// hold (0: none).
	sealedSize atomic.Int64

	snap atomic.Pointer[snapshot]
	// clean holds the revisions of the sealed state and key file at which
	// Sync last found the published snapshot to be the stored state (nil:
	// unknown). Sync, while a change of this instance holds mu, answers
	// "fresh" without waiting when the store still has these revisions.
	clean atomic.Pointer[[2]store.Revision]
	// reloading is set while Sync, holding mu, reloads a newer stored
	// state: a Sync that finds mu taken then waits for it (it is what that
	// Sync needs) instead of giving up after the store timeout.
	reloading atomic.Bool
	// logs reads and writes the update log's segments.
	logs *logstore.Store
}

// snapshot is one consistent view of the Coordinator. It is never modified
// after it has been published.
type snapshot struct {
	state       State
	ca          *ca.Authority
	quote       []byte // cached quote over the root; nil in simulation
	persisted   *sealedstate.State
	manifest    *manifest.Manifest
	users       *user.Users
	fingerprint string
}

// DefaultMaxStateBytes is Options.MaxStateBytes's default: room for a
// manifest of the largest default size (8 MiB, base64 in the state), the
// default most secrets twice (current and previous) and many counters.
const DefaultMaxStateBytes = 64 << 20

// New creates the Coordinator and loads its state: no sealed state → state 2;
// a sealed state that opens → state 3; one that exists but cannot be opened →
// state 1 (recovery), leaving the stored blobs untouched. A shared store
// that cannot be read is an error wrapping ErrUnavailable.
func New(ctx context.Context, opts Options) (*Core, error) {
	if opts.MaxStateBytes <= 0 {
		opts.MaxStateBytes = DefaultMaxStateBytes
	}
	if opts.StoreTimeout <= 0 {
		opts.StoreTimeout = DefaultStoreTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Issuer == nil {
		opts.Issuer = attest.SimulationIssuer{}
	}
	if opts.EphemeralKeyBits == 0 {
		opts.EphemeralKeyBits = 4096
	}
	if opts.ActivationEvents == 0 {
		opts.ActivationEvents = DefaultActivationEvents
	}
	c := &Core{opts: opts, log: opts.Logger}
	c.events.limit = opts.ActivationEvents
	c.logs = logstore.New(opts.LogSegments, opts.Now)
	c.vault = vault.New(vault.Options{Data: opts.Data, Key: opts.Key, Sealer: opts.KeySealer, Log: opts.Logger,
		StoreTimeout: opts.StoreTimeout, Now: opts.Now, Instance: opts.InstanceID, Source: opts.KeySource})
	snap, err := c.load(ctx)
	if errors.Is(err, vault.ErrSharedRead) {
		// Nothing is decided about the state: the start may be tried
		// again when the store answers (docs/ha.md, "Starting while etcd is
		// unreachable").
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err != nil {
		return nil, err
	}
	if snap.quote, err = c.issueQuote(ctx, snap.ca, nil); err != nil {
		if !opts.AllowQuoteFailure {
			return nil, err
		}
		c.log.Error("no quote at start; continuing without one because quote failures are allowed (development mode)", "error", err.Error())
	} else if snap.quote == nil {
		c.simulation = true
		c.log.Warn("no quote can be produced: running in simulation mode; clients must opt in to trusting an unattested Coordinator, and Marbles are activated without attestation")
	}
	c.snap.Store(snap)
	return c, nil
}

// load reads the sealed state and decides the start state.
func (c *Core) load(ctx context.Context) (*snapshot, error) {
	blob, err := c.vault.LoadBlob(ctx)
	if err == nil {
		c.sealedSize.Store(int64(len(blob)))
	}
	if errors.Is(err, store.ErrNotFound) {
		if err := c.vault.SetStrayKeyAside(ctx, c.asideSuffix("orphaned")); err != nil {
			return nil, err
		}
		return c.fresh(eventStartFresh)
	}
	if errors.Is(err, vault.ErrSharedRead) {
		return nil, err // etcd unreachable: no reason for recovery mode
	}
	if err != nil {
		return c.enterRecovery(nil, "the sealed state cannot be read", err)
	}
	if !isQuarryBlob(blob) {
		sd, err := marbleRunData(blob)
		if err != nil {
			return c.enterRecovery(blob, "sealed_data is neither Quarry's sealed state nor MarbleRun's (truncated or damaged?)", err)
		}
		return c.loadMarbleRun(ctx, blob, sd)
	}
	hdr, err := sealedstate.ReadHeader(blob)
	if err != nil {
		return c.enterRecovery(blob, "the sealed state is corrupt", err)
	}
	dek, kp := c.vault.KeyFor(ctx, blob)
	if kp != nil {
		return c.enterRecovery(blob, kp.What, kp.Cause)
	}
	_, plaintext, layout, err := c.vault.Open(ctx, dek, blob)
	switch {
	case errors.Is(err, vault.ErrSharedRead):
		return nil, err // etcd unreachable: no reason for recovery mode
	case errors.Is(err, vault.ErrChunks):
		return c.enterRecovery(blob, "a chunk of the sealed state in etcd is missing or damaged", err)
	case err != nil:
		return c.enterRecovery(blob, "the sealed state does not decrypt with the data key", err)
	}
	st, err := sealedstate.Decode(plaintext)
	if err != nil {
		return c.enterRecovery(blob, "the decrypted state is invalid", err)
	}
	snap, err := restore(st, c.opts.Now())
	if err != nil {
		return c.enterRecovery(blob, "the decrypted state is invalid", err)
	}
	if err := c.vault.CheckFetched(snap.manifest.Config.SealMode); err != nil {
		return c.enterRecovery(blob, "the running instance that gave the data key may not hold the key of this state (its quote does not satisfy the state's seal mode)", err)
	}
	if snap.state, err = next(StateUninitialized, eventStartSealed); err != nil {
		return nil, err
	}
	c.vault.Opened(dek, snap.manifest.Config.SealMode, layout)
	c.vault.AddOwnEntry(ctx)
	c.dek = dek
	c.header = hdr
	if err := c.recordRestore(ctx, snap, blob); err != nil {
		return nil, err
	}
	c.log.Info("sealed state loaded", "state", int(snap.state), "manifestFingerprint", snap.fingerprint)
	return snap, nil
}

// asideSuffix names files moved or copied aside: what they are, and when.
func (c *Core) asideSuffix(what string) string {
	return what + "-" + c.opts.Now().UTC().Format("20060102T150405Z")
}

// fresh returns a new in-memory snapshot with new CAs, reached on e.
func (c *Core) fresh(e event) (*snapshot, error) {
	s, err := next(StateUninitialized, e)
	if err != nil {
		return nil, err
	}
	authority, err := ca.New(rand.Reader, c.opts.Names, c.opts.Now())
	if err != nil {
		return nil, err
	}
	return &snapshot{state: s, ca: authority}, nil
}

// enterRecovery starts in recovery mode: fresh in-memory CAs, the stored
// blobs left exactly as they are.
func (c *Core) enterRecovery(blob []byte, what string, cause error) (*snapshot, error) {
	return c.enterRecoveryWith(blob, what, cause, nil)
}

// enterRecoveryRefused is enterRecovery for a blob that this Coordinator
// does not recover (refused says why, and what to do): every upload is
// refused with it; a new manifest still replaces the state (docs/sealing.md).
func (c *Core) enterRecoveryRefused(blob []byte, what string, refused error) (*snapshot, error) {
	return c.enterRecoveryWith(blob, what, refused, refused)
}

func (c *Core) enterRecoveryWith(blob []byte, what string, cause, refused error) (*snapshot, error) {
	if cur := c.snap.Load(); cur != nil && cur.state == StateRecovery && c.recovering != nil && bytes.Equal(c.recovering, blob) {
		// A reload of the same unreadable blob (a shared store followed
		// again, e.g. after a failed read): the round in progress, its
		// shares and ephemeral key, and the temporary root stay.
		c.unreadable = blob
		return cur, nil
	}
	c.unreadable, c.recovering = blob, blob
	todo := "upload the recovery secrets (POST /api/v2/recover, e.g. with the CLI's recover command), or set a new manifest to start over (the old files are then moved aside, not deleted)"
	if refused != nil {
		c.rec.refuse(refused)
		todo = "see the cause; or set a new manifest to start over (the old files are then moved aside, not deleted)"
	} else {
		c.rec.start(blob, c.opts.RecoveryTimeout, c.opts.Now)
	}
	c.log.Error("entering recovery mode: "+what+"; the sealed files are left untouched",
		"cause", cause.Error(), "todo", todo)
	return c.fresh(eventStartUnreadable)
}

// restore builds a snapshot from a decrypted state; now dates the
// checkpoint of a log converted from the old form (logstore.Ensure).
func restore(st *sealedstate.State, now time.Time) (*snapshot, error) {
	authority, err := ca.Restore(st.CA)
	if err != nil {
		return nil, err
	}
	m, err := manifest.ParseStored(st.Manifest)
	if err != nil {
		return nil, fmt.Errorf("stored manifest: %w", err)
	}
	if st.State != sealedstate.Running {
		return nil, fmt.Errorf("stored state %d is not %d", st.State, sealedstate.Running)
	}
	if err := logstore.Ensure(st, now); err != nil {
		return nil, fmt.Errorf("update log: %w", err)
	}
	users, err := user.FromManifest(m)
	if err != nil {
		return nil, fmt.Errorf("stored manifest users: %w", err)
	}
	return &snapshot{
		state:       State(st.State),
		ca:          authority,
		persisted:   st,
		manifest:    m,
		users:       users,
		fingerprint: fingerprint(st.Manifest),
	}, nil
}

func fingerprint(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// issueQuote asks the issuer for a quote bound to the root certificate and
// nonce; nil without error means simulation.
func (c *Core) issueQuote(ctx context.Context, a *ca.Authority, nonce []byte) ([]byte, error) {
	q, err := c.opts.Issuer.Issue(ctx, attest.ReportData(a.Root.Raw, nonce))
	if errors.Is(err, attest.ErrUnsupported) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("issuing quote: %w", err)
	}
	return q, nil
}

// commit seals st under dek with header and stores it, the data key
// sealed in mode (the state's SealMode; see vault: the
// stored pair opens together at every instant). When it returns nil, or an
// error for which stored is true, the new state is the stored one and dek
// and header are the current ones: the caller must publish the new state
// then (and report the error, if any). Callers hold mu.
func (c *Core) commit(ctx context.Context, st *sealedstate.State, header sealedstate.Header, dek []byte, mode string) (err error) {
	start := c.opts.Now()
	size := 0
	defer func() {
		if vault.Stored(err) && size > 0 {
			c.sealedSize.Store(int64(size))
		}
		if c.opts.OnCommit != nil {
			c.opts.OnCommit(CommitResult{Duration: c.opts.Now().Sub(start), SealedBytes: size, Err: err})
		}
	}()
	if err := c.logs.Prepare(ctx, st, true); err != nil {
		return err
	}
	cp := st.Log.Checkpoint
	header.UpdateLog = &cp
	// The header names the data key, so that the key file's entry bound
	// to that key ID opens this blob and every later one of the same key:
	// a commit that keeps the key writes only the blob (vault.Commit).
	header.DataKeyID = seal.KeyIDText(dek)
	plaintext, err := sealedstate.Encode(st)
	if err != nil {
		return err
	}
	if limit := c.opts.MaxStateBytes; len(plaintext) > limit {
		return classify(ErrTooLarge, fmt.Errorf("the change would make the state %d bytes, more than its limit of %d bytes (--max-state-size, QUARRY_MAX_STATE_SIZE); nothing was changed", len(plaintext), limit))
	}
	plaintext, layout, err := c.vault.Split(dek, plaintext)
	if err != nil {
		return err
	}
	hdr, err := sealedstate.EncodeHeader(header)
	if err != nil {
		return err
	}
	blob, err := seal.Seal(rand.Reader, dek, hdr, plaintext)
	if err != nil {
		return fmt.Errorf("sealing state: %w", err)
	}
	size = len(blob)
	if layout != nil {
		size += layout.PlainBytes()
	}
	err = vaultError(c.vault.Commit(ctx, blob, dek, mode, layout))
	if vault.Stored(err) {
		c.dek, c.header = dek, header
	}
	if err != nil && vault.Stored(err) {
		c.log.Error("the state change is stored although the store reported an error", "error", err.Error())
	}
	return err
}

// Status returns the current state.
func (c *Core) Status() State { return c.snap.Load().state }

// QuoteResult is the Coordinator's certificate chain and quote.
type QuoteResult struct {
	// ChainPEM is the intermediate then the root certificate, PEM.
	ChainPEM []byte
	// Quote is nil in simulation mode.
	Quote []byte
}

// Quote returns the certificate chain and a quote over SHA-256(root DER ‖
// nonce); without a nonce the cached quote.
func (c *Core) Quote(ctx context.Context, nonce []byte) (QuoteResult, error) {
	s := c.snap.Load()
	if err := require(s.state, opQuote); err != nil {
		return QuoteResult{}, err
	}
	res := QuoteResult{ChainPEM: s.ca.ChainPEM(), Quote: s.quote}
	if len(nonce) > 0 {
		q, err := c.issueQuote(ctx, s.ca, nonce)
		if err != nil {
			return QuoteResult{}, err
		}
		res.Quote = q
	}
	return res, nil
}

// TLSCertificate returns the Client API's current server certificate.
func (c *Core) TLSCertificate() *tls.Certificate { return c.snap.Load().ca.TLSCertificate() }

// ManifestResult is the stored manifest with its fingerprint and signature.
type ManifestResult struct {
	Raw         []byte
	Fingerprint string
	Signature   []byte
}

// Manifest returns the manifest exactly as uploaded.
func (c *Core) Manifest() (ManifestResult, error) {
	s := c.snap.Load()
	if err := require(s.state, opGetManifest); err != nil {
		return ManifestResult{}, err
	}
	return ManifestResult{Raw: s.persisted.Manifest, Fingerprint: s.fingerprint, Signature: s.persisted.ManifestSignature}, nil
}

// trySetManifest validates and sets the first manifest (states 1 and 2), seals
// and stores the new state, and returns the encrypted recovery secrets. In
// recovery mode the old sealed files are moved aside first.
func (c *Core) trySetManifest(ctx context.Context, raw []byte) (map[string][]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	if err := require(s.state, opSetManifest); err != nil {
		return nil, err
	}
	m, err := manifest.Parse(raw)
	if err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if err := c.opts.SecretLimits.Check(m.Secrets); err != nil {
		return nil, classify(ErrInvalidRequest, err)
	}
	to, err := next(s.state, eventManifestSet)
	if err != nil {
		return nil, err
	}

	raw = append([]byte(nil), raw...)
	dek, recoverySecrets, pub, err := newRecoverySecrets(rand.Reader, m)
	if err != nil {
		return nil, err
	}
	if s.state != StateRecovery && m.Config.SealMode != manifest.SealModeDisabled {
		// The key file of the first state is written and synced while
		// the state is built; the commit puts it in place.
		if err := c.vault.StageFirstKey(ctx, dek, m.Config.SealMode); err != nil {
			return nil, err
		}
		defer c.vault.DiscardFirstKey()
	}
	sig, err := s.ca.SignRoot(rand.Reader, raw)
	if err != nil {
		return nil, fmt.Errorf("signing manifest: %w", err)
	}
	persistedCA, err := s.ca.Persist()
	if err != nil {
		return nil, err
	}
	c.logs.KnowRootKey(persistedCA.RootKey, s.ca.RootKey)
	rootSecret := make([]byte, 32)
	if _, err := io.ReadFull(rand.Reader, rootSecret); err != nil {
		return nil, err
	}
	header := sealedstate.Header{Format: sealedstate.Format, Recovery: pub}
	users, err := user.FromManifest(m)
	if err != nil {
		return nil, classify(ErrInvalidRequest, err)
	}
	now := c.opts.Now()
	generated, err := secrets.Generate(rand.Reader, m.Secrets, secretIssuer(s.ca), now)
	if err != nil {
		if errors.Is(err, secrets.ErrInvalid) {
			return nil, classify(ErrInvalidRequest, fmt.Errorf("generating secrets from manifest: %w", err))
		}
		return nil, fmt.Errorf("generating secrets from manifest: %w", err)
	}
	st := &sealedstate.State{
		Format:            sealedstate.Format,
		State:             int(to),
		CA:                persistedCA,
		RootSecret:        rootSecret,
		Manifest:          raw,
		ManifestSignature: sig,
		Packages:          m.Packages,
		Secrets:           generated,
		UpdateLog:         []string{updatelog.ManifestSet(now)},
		RecoverySecrets:   recoverySecrets,
	}
	if s.state == StateRecovery {
		// The unrecovered state is replaced: its key file is moved aside
		// and its blob copied aside (never deleted) first.
		moved, err := c.vault.ReplaceUnrecovered(ctx, c.asideSuffix("unrecovered"))
		if err != nil {
			return nil, err
		}
		c.log.Warn("a new manifest replaces the unrecovered state; the old files are kept", "keptAt", moved)
	}
	var storeErr error
	if m.Config.SealMode == manifest.SealModeDisabled {
		c.log.Warn("manifest sets SealMode Disabled: nothing is persisted; a restart starts over in state 2")
		if err := c.logs.Prepare(ctx, st, false); err != nil {
			return nil, err
		}
		c.dek, c.header = dek, header
	} else if storeErr = c.commit(ctx, st, header, dek, m.Config.SealMode); !vault.Stored(storeErr) {
		return nil, storeErr
	}
	// The old state is replaced: recovery of it ends here, and only now
	// that the new state is stored.
	c.unreadable = nil
	c.rec.stop()
	c.snap.Store(&snapshot{
		state:       to,
		ca:          s.ca,
		quote:       s.quote,
		persisted:   st,
		manifest:    m,
		users:       users,
		fingerprint: fingerprint(raw),
	})
	c.log.Info("manifest set", "manifestFingerprint", fingerprint(raw), "state", int(to), "recoveryMode", string(pub.Mode))
	return recoverySecrets, storeErr
}

// persist seals and stores st (under the current data key) unless the seal
// mode is Disabled, then publishes a snapshot with it. Callers hold mu.
func (c *Core) persist(ctx context.Context, s *snapshot, st *sealedstate.State) error {
	var err error
	if s.manifest.Config.SealMode != manifest.SealModeDisabled {
		if err = c.commit(ctx, st, c.header, c.dek, s.manifest.Config.SealMode); !vault.Stored(err) {
			return err
		}
	} else if err = c.logs.Prepare(ctx, st, false); err != nil {
		return err
	}
	next := *s
	next.persisted = st
	c.snap.Store(&next)
	return err
}

// SetManifest: see trySetManifest.
func (c *Core) SetManifest(ctx context.Context, raw []byte) (map[string][]byte, error) {
	return retry(c, ctx, func() (map[string][]byte, error) { return c.trySetManifest(ctx, raw) })
}
