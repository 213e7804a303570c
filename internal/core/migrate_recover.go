package core

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/marblerun"
	"github.com/quarry-cc/quarry/internal/migrate"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/manifest"
)

// startMarbleRun prepares the recovery of a MarbleRun sealed_data whose
// data key is not available. Its recovery public keys are inside the
// encrypted manifest, so each upload is checked for what can be checked
// (length; a single key's secret must decrypt the state; a share's hash
// must be one of the state's and unused), and the signatures when the
// state decrypts, before anything is written (MarbleRun's final check).
func (r *recoveryRound) startMarbleRun(sd *marblerun.SealedData, ttl time.Duration, now func() time.Time) {
	r.collector, r.cannot = nil, nil
	r.marbleRun = sd
	r.shares = marblerun.NewCollector(sd.ShareHashes, marblerun.CollectorOptions{Opens: sd.Opens, TTL: ttl, Now: now})
}

// startMigrated prepares the recovery of a migrated state that kept
// MarbleRun's XOR or Shamir shares: the recovery keys are in the header,
// so each upload's signature is checked on arrival (a bad share is refused
// at once, not after the round is complete) and
// matched to an unused key.
func (r *recoveryRound) startMigrated(blob []byte, hdr sealedstate.Header, ttl time.Duration, now func() time.Time) {
	keys := make(map[string]*rsa.PublicKey, len(hdr.Recovery.Keys))
	for name, k := range hdr.Recovery.Keys {
		pub, err := x509.ParsePKIXPublicKey(k.PublicKey)
		if rk, ok := pub.(*rsa.PublicKey); err == nil && ok {
			keys[name] = rk
		}
	}
	opens := func(key []byte) bool {
		_, _, err := seal.Open(key, blob)
		return err == nil
	}
	r.shares = marblerun.NewCollector(hdr.MarbleRunShares, marblerun.CollectorOptions{
		Keys: keys, Threshold: hdr.Recovery.Threshold, Opens: opens, TTL: ttl, Now: now,
	})
}

// recoverShares takes one upload for a round of MarbleRun shares. Callers
// hold mu.
func (c *Core) recoverShares(ctx context.Context, secret, signature []byte, signed bool) (RecoverResult, error) {
	r := &c.rec
	remaining, key, shares, err := r.shares.Add(secret, signature, signed)
	if err != nil {
		return RecoverResult{Remaining: remaining}, classify(ErrInvalidRequest, err)
	}
	if remaining > 0 {
		c.log.Info("recovery secret accepted", "remaining", remaining)
		return RecoverResult{Remaining: remaining}, nil
	}
	if r.marbleRun == nil { // a migrated Quarry state
		if err := c.restoreWith(ctx, key); err != nil {
			return RecoverResult{}, err
		}
		return RecoverResult{}, nil
	}
	if err := c.recoverMarbleRun(ctx, key, shares); err != nil {
		return RecoverResult{}, err
	}
	return RecoverResult{}, nil
}

// recoverMarbleRun checks the recovered MarbleRun state against its
// manifest's recovery keys and migrates it.
func (c *Core) recoverMarbleRun(ctx context.Context, key []byte, shares []marblerun.Share) error {
	sd := c.rec.marbleRun
	kv, err := sd.Open(key)
	if err != nil {
		return classify(ErrInvalidRequest, fmt.Errorf("the combined recovery secrets do not decrypt the sealed state: %w", err))
	}
	mr, err := marblerun.Decode(kv)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMigration, err)
	}
	m, err := manifest.ParseStored(mr.Manifest)
	if err != nil {
		return fmt.Errorf("%w: the stored manifest: %v", ErrMigration, err)
	}
	// MarbleRun's final check (the recovered state's recovery keys are the
	// manifest's), here before
	// anything is written.
	if _, err := marblerun.CheckSignatures(shares, migrate.RecoveryKeys(m), int(m.Config.RecoveryThreshold)); err != nil {
		return classify(ErrInvalidRequest, fmt.Errorf("%w; upload the recovery secrets again", err))
	}
	snap, err := c.migrate(ctx, c.unreadable, sd, key, false, eventRecovered, StateRecovery)
	if err != nil {
		if errors.Is(err, ErrMigration) {
			return classify(ErrConflict, err)
		}
		return err
	}
	c.unreadable = nil
	c.rec.stop()
	c.snap.Store(snap)
	c.log.Info("recovery successful: the MarbleRun state is migrated and sealed by Quarry", "manifestFingerprint", snap.fingerprint)
	return nil
}
