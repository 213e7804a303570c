package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/vault"

	"github.com/quarry-cc/quarry/internal/marblerun"
	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/updatelog"
	"github.com/quarry-cc/quarry/manifest"
)

// recoveryRound is the recovery state of a Coordinator in recovery mode: the
// share collector for the unreadable blob (or why it cannot be recovered),
// and the ephemeral key, created on first request and kept in memory only.
type recoveryRound struct {
	// collector, cannot, shares and marbleRun are guarded by Core.mu.
	collector *recovery.Collector
	cannot    error // why the blob cannot be recovered at all
	// shares collects MarbleRun's recovery secrets instead of collector:
	// for a MarbleRun sealed_data (marbleRun set), or a migrated state
	// with MarbleRun's share hashes (migrate_recover.go).
	shares    *marblerun.Collector
	marbleRun *marblerun.SealedData
	// progress is the collector and its threshold, readable without the
	// Core's lock (metrics).
	progress atomic.Pointer[roundProgress]

	ephMu sync.Mutex
	eph   *rsa.PrivateKey // guarded by ephMu
}

// start prepares recovery of blob: its public header names the recovery
// keys and shares.
func (r *recoveryRound) start(blob []byte, ttl time.Duration, now func() time.Time) {
	r.collector, r.cannot, r.shares, r.marbleRun = nil, nil, nil, nil
	if blob == nil {
		r.cannot = errors.New("the sealed state cannot be read")
		return
	}
	hdr, err := sealedstate.ReadHeader(blob)
	if err != nil {
		r.cannot = fmt.Errorf("the sealed state is corrupt (%v)", err)
		return
	}
	if hdr.Recovery.Mode == recovery.ModeNone || hdr.Recovery.Mode == "" {
		r.cannot = recovery.ErrNotRecoverable
		return
	}
	if len(hdr.MarbleRunShares) > 0 {
		r.startMigrated(blob, hdr, ttl, now)
		return
	}
	r.collector = recovery.NewCollector(hdr.Recovery, ttl, now)
	r.progress.Store(&roundProgress{collector: r.collector, need: hdr.Recovery.Threshold})
}

// refuse prepares a round that refuses every upload with why.
func (r *recoveryRound) refuse(why error) {
	r.collector, r.shares, r.marbleRun = nil, nil, nil
	r.progress.Store(nil)
	r.cannot = why
}

// roundProgress is what RecoverySharesAccepted reads.
type roundProgress struct {
	collector *recovery.Collector
	need      int
}

// stop ends recovery: shares and the ephemeral key are dropped.
func (r *recoveryRound) stop() {
	if r.collector != nil {
		r.collector.Reset()
	}
	if r.shares != nil {
		r.shares.Reset()
	}
	r.collector, r.cannot, r.shares, r.marbleRun = nil, nil, nil, nil
	r.progress.Store(nil)
	r.ephMu.Lock()
	r.eph = nil
	r.ephMu.Unlock()
}

// newRecoverySecrets makes a new data key and the recovery secrets for m's
// recovery keys (one secret per key, encrypted to it: docs/sealing.md).
func newRecoverySecrets(rand io.Reader, m *manifest.Manifest) (dek []byte, secrets map[string][]byte, pub recovery.Public, err error) {
	keys := make(map[string]*rsa.PublicKey, len(m.RecoveryKeys))
	for name, text := range m.RecoveryKeys {
		if keys[name], err = recovery.ParsePublicKeyPEM(text); err != nil {
			return nil, nil, recovery.Public{}, classify(ErrInvalidRequest, fmt.Errorf("recovery key %s: %w", name, err))
		}
	}
	dek, secrets, pub, err = recovery.Generate(rand, keys, m.Config.RecoveryThreshold)
	if err != nil {
		return nil, nil, recovery.Public{}, classify(ErrInvalidRequest, fmt.Errorf("generating recovery secrets: %w", err))
	}
	return dek, secrets, pub, nil
}

func (e classified) Error() string   { return e.err.Error() }
func (e classified) Unwrap() []error { return []error{e.class, e.err} }

// RecoveryPublicKey returns the ephemeral RSA public key (PKIX DER) that
// recovery secrets may be encrypted to. It is created on first use and kept
// in memory only. Recovery mode only.
func (c *Core) RecoveryPublicKey(context.Context) ([]byte, error) {
	if err := require(c.Status(), opRecover); err != nil {
		return nil, err
	}
	r := &c.rec
	r.ephMu.Lock()
	defer r.ephMu.Unlock()
	if r.eph == nil {
		k, err := rsa.GenerateKey(rand.Reader, c.opts.EphemeralKeyBits)
		if err != nil {
			return nil, fmt.Errorf("generating ephemeral key: %w", err)
		}
		r.eph = k
	}
	return x509.MarshalPKIXPublicKey(&r.eph.PublicKey)
}

// RecoverResult is the progress of a recovery.
type RecoverResult struct {
	// Remaining is the number of shares still needed; 0 means recovered.
	Remaining int
}

// Recover takes one recovery secret (plain, or encrypted to the ephemeral
// key) with its signature. Each upload is checked at once (a bad share is
// refused when it arrives, not after the round is complete);
// a rejected upload leaves the round as it was. When enough shares are in,
// the sealed state is decrypted, checked against the sealed manifest,
// restored with its root certificate, and sealed again under a fresh sealed
// key, so the next start needs no recovery.
func (c *Core) Recover(ctx context.Context, secret, signature []byte) (RecoverResult, error) {
	if len(signature) == 0 {
		return RecoverResult{}, classify(ErrInvalidRequest, errors.New("the recovery secret signature is missing"))
	}
	return c.recover(ctx, secret, signature, true)
}

// errUnsignedInEnclave refuses an unsigned recovery secret in an enclave.
var errUnsignedInEnclave = errors.New("a Coordinator in an enclave takes recovery secrets only with the recovery key's signature: " +
	"upload them with POST /api/v2/recover (marblerun recover, quarry recover)")

// RecoverUnsigned is Recover for the unprefixed API, whose request carries
// the plain secret without a signature (MarbleRun's v1 API, off unless
// enabled). The secret must still
// be one of the sealed state's shares. A Coordinator whose key sealer
// protects the data key (an enclave) refuses it with ErrForbidden.
func (c *Core) RecoverUnsigned(ctx context.Context, secret []byte) (RecoverResult, error) {
	return c.recover(ctx, secret, nil, false)
}

func (c *Core) tryRecover(ctx context.Context, secret, signature []byte, signed bool) (RecoverResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	if err := require(s.state, opRecover); err != nil {
		return RecoverResult{}, err
	}
	r := &c.rec
	if r.cannot != nil {
		return RecoverResult{}, classify(ErrConflict, fmt.Errorf("the sealed state cannot be recovered: %w; set a new manifest to start over (the old files are kept)", r.cannot))
	}
	if !signed && seal.ProtectsKey(c.opts.KeySealer) {
		// Without a signature a share is checked only against the
		// blob's clear header (or MarbleRun's clear recovery data), which
		// whoever can write the stores may have planted together with a
		// state of their choosing (docs/threat-model.md).
		return RecoverResult{}, classify(ErrForbidden, errUnsignedInEnclave)
	}
	if !recovery.IsPlainSecretLength(len(secret)) {
		r.ephMu.Lock()
		eph := r.eph
		r.ephMu.Unlock()
		if eph == nil {
			return RecoverResult{}, classify(ErrInvalidRequest, fmt.Errorf("the recovery secret has %d bytes, so it must be encrypted to the ephemeral key, but no ephemeral key has been requested (GET /api/v2/recover/public-key)", len(secret)))
		}
		plain, err := recovery.DecryptWithEphemeral(eph, secret)
		if err != nil {
			return RecoverResult{}, classify(ErrInvalidRequest, fmt.Errorf("failed to decrypt recovery secret: %w", err))
		}
		secret = plain
	}
	if r.shares != nil {
		return c.recoverShares(ctx, secret, signature, signed)
	}
	add := r.collector.AddUnsigned
	if signed {
		add = func(secret []byte) (int, []byte, error) { return r.collector.Add(secret, signature) }
	}
	remaining, key, err := add(secret)
	if err != nil {
		return RecoverResult{Remaining: remaining}, classify(ErrInvalidRequest, err)
	}
	if remaining > 0 {
		c.log.Info("recovery secret accepted", "remaining", remaining)
		return RecoverResult{Remaining: remaining}, nil
	}
	if err := c.restoreWith(ctx, key); err != nil {
		if !vault.Stored(err) {
			r.collector.Reset()
		}
		return RecoverResult{}, err
	}
	return RecoverResult{}, nil
}

// restoreWith opens the unreadable blob with key, checks it, and makes it
// the current state.
func (c *Core) restoreWith(ctx context.Context, key []byte) error {
	hdrRaw, plaintext, layout, err := c.vault.Open(ctx, key, c.unreadable)
	switch {
	case errors.Is(err, vault.ErrSharedRead):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case errors.Is(err, vault.ErrChunks):
		return classify(ErrConflict, fmt.Errorf("the recovery secrets decrypt the sealed state, but it is damaged in etcd (%w); set a new manifest to start over", err))
	case err != nil:
		return classify(ErrInvalidRequest, fmt.Errorf("the combined recovery secrets do not decrypt the sealed state: %w", err))
	}
	hdr, err := sealedstate.ParseHeader(hdrRaw)
	if err != nil {
		return fmt.Errorf("decrypted header: %w", err)
	}
	st, err := sealedstate.Decode(plaintext)
	if err != nil {
		return fmt.Errorf("the decrypted state is invalid: %w", err)
	}
	snap, err := restore(st, c.opts.Now())
	if err != nil {
		return fmt.Errorf("the decrypted state is invalid: %w", err)
	}
	// The final check: the recovery keys in the header must be exactly the
	// sealed manifest's.
	if err := sameRecoveryKeys(snap.manifest, hdr.Recovery); err != nil {
		return classify(ErrInvalidRequest, fmt.Errorf("recovery keys in the sealed manifest do not match the recovery data: %w", err))
	}
	to, err := next(StateRecovery, eventRecovered)
	if err != nil {
		return err
	}
	snap.state = to
	if snap.quote, err = c.issueQuote(ctx, snap.ca, nil); err != nil {
		return err
	}
	if err := c.vault.Recovered(ctx, c.asideSuffix("unusable")); err != nil {
		return err
	}
	c.vault.KeepChunks(c.unreadable, layout) // its chunks are stored: the commit keeps them
	// A state restored from a backup onto another machine is recovered
	// here: the restore is recorded before the recovery (restored.go).
	restored, done, err := c.restoreRecord(ctx, snap, c.unreadable)
	if err != nil {
		return err
	}
	st.UpdateLog = slices.Clip(st.UpdateLog)
	if restored != "" {
		st.UpdateLog = append(st.UpdateLog, restored)
	}
	st.UpdateLog = append(st.UpdateLog, updatelog.Recovered(c.opts.Now(), snap.fingerprint))
	err = c.commit(ctx, st, hdr, key, snap.manifest.Config.SealMode)
	if !vault.Stored(err) {
		return err
	}
	if done != nil {
		done()
	}
	c.unreadable = nil
	c.rec.stop()
	c.snap.Store(snap)
	c.log.Info("recovery successful: the sealed state is restored and sealed again", "manifestFingerprint", snap.fingerprint)
	return err
}

// sameRecoveryKeys checks that pub lists exactly the manifest's recovery
// keys.
func sameRecoveryKeys(m *manifest.Manifest, pub recovery.Public) error {
	if len(m.RecoveryKeys) != len(pub.Keys) {
		return fmt.Errorf("expected %d keys, got %d", len(m.RecoveryKeys), len(pub.Keys))
	}
	for name, text := range m.RecoveryKeys {
		k, err := recovery.ParsePublicKeyPEM(text)
		if err != nil {
			return fmt.Errorf("key %s: %w", name, err)
		}
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			return err
		}
		if !bytes.Equal(der, pub.Keys[name].PublicKey) {
			return fmt.Errorf("no matching recovery public key for %q", name)
		}
	}
	return nil
}

func (c *Core) recover(ctx context.Context, secret, signature []byte, signed bool) (RecoverResult, error) {
	return retry(c, ctx, func() (RecoverResult, error) { return c.tryRecover(ctx, secret, signature, signed) })
}
