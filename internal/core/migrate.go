package core

// Taking over a MarbleRun Coordinator's sealed state (docs/migration.md).
// A seal directory whose sealed_data is MarbleRun's is opened (with
// MarbleRun's no-enclave data key from sealed_key, only when the key
// sealer does not protect the key, or through MarbleRun's recovery
// secrets, signed in an enclave), converted into Quarry's sealed state by
// internal/migrate (a pure converter; this file is the orchestration), and
// written with Quarry's ordinary crash-safe commit under the SAME data key,
// so MarbleRun's recovery secrets keep working. MarbleRun's files are copied
// aside first (byte-identical, never deleted); the originals stay in place
// until the commit replaces them, so a crash at any point leaves MarbleRun's
// files (and a restart migrates again) or the complete Quarry state.

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/quarry-cc/quarry/internal/marblerun"
	"github.com/quarry-cc/quarry/internal/migrate"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/vault"
)

// ErrMixedFormats means the seal directory holds MarbleRun's sealed_data
// beside a Quarry sealed_key that belongs to another state: which one is
// meant cannot be told, so the Coordinator does not start (nothing is
// changed).
var ErrMixedFormats = errors.New("the seal directory holds both formats: MarbleRun's sealed_data and a Quarry sealed_key that belongs to another state")

// ErrMigration is wrapped by the errors that stop a migration of a state
// that did decrypt (an unknown store key, an inconsistent state): the
// Coordinator does not start and the MarbleRun files stay as they are.
// It is migrate.ErrMigration, which the converter's errors wrap.
var ErrMigration = migrate.ErrMigration

// MigrationReport is what a migration moves, for the dry run and the log
// (migrate.Report).
type MigrationReport = migrate.Report

// MarbleRunMigration says whether a MarbleRun sealed_data found at start
// is migrated (docs/migration.md, "The enclave rule").
type MarbleRunMigration int

const (
	// MigrateMarbleRunAuto (the default) migrates when the key sealer does
	// not protect the data key (simulation: the host can read the state
	// anyway) and never under an enclave.
	MigrateMarbleRunAuto MarbleRunMigration = iota
	// MigrateMarbleRunOn migrates under an enclave too, but there only
	// through MarbleRun's signed recovery: a raw data key in sealed_key is
	// never taken by an enclave Coordinator.
	MigrateMarbleRunOn
	// MigrateMarbleRunOff never migrates: a MarbleRun sealed_data is an
	// unreadable state (recovery mode, files untouched; its recovery is
	// refused naming the setting; a new manifest replaces it, docs/sealing.md).
	MigrateMarbleRunOff
)

// String is the setting's value: auto, 1 or 0.
func (m MarbleRunMigration) String() string {
	switch m {
	case MigrateMarbleRunOn:
		return "1"
	case MigrateMarbleRunOff:
		return "0"
	}
	return "auto"
}

// MigrateMarbleRunSetting names the setting that enables the migration
// (internal/config).
const MigrateMarbleRunSetting = "--migrate-marblerun=1 (QUARRY_MIGRATE_MARBLERUN=1)"

// ErrMigrationOff means a MarbleRun state is not migrated because the
// migration is off (the setting, or its default under an enclave).
var ErrMigrationOff = errors.New("migrating a MarbleRun state is off")

// migrationOn reports whether a MarbleRun state may be migrated with
// policy and sealer.
func migrationOn(policy MarbleRunMigration, sealer seal.KeySealer) bool {
	switch policy {
	case MigrateMarbleRunOn:
		return true
	case MigrateMarbleRunOff:
		return false
	}
	return !seal.ProtectsKey(sealer)
}

// migrationOffError says why a MarbleRun state is not migrated and which
// setting enables the migration.
func migrationOffError(policy MarbleRunMigration) error {
	if policy == MigrateMarbleRunOff {
		return fmt.Errorf("%w (QUARRY_MIGRATE_MARBLERUN=0): sealed_data is a MarbleRun state; start with %s to migrate it", ErrMigrationOff, MigrateMarbleRunSetting)
	}
	return fmt.Errorf("%w under an enclave by default: sealed_data is a MarbleRun state, which anyone who can write the seal directory could have planted; "+
		"start an enclave built with %s to migrate it through MarbleRun's signed recovery (docs/migration.md)", ErrMigrationOff, MigrateMarbleRunSetting)
}

// isQuarryBlob reports whether blob starts like Quarry's sealed blob
// (anything else is taken for MarbleRun's sealed_data).
func isQuarryBlob(blob []byte) bool { return bytes.HasPrefix(blob, []byte(seal.Magic)) }

// marbleRunData parses MarbleRun's sealed_data layout.
func marbleRunData(blob []byte) (*marblerun.SealedData, error) {
	return marblerun.ParseSealedData(blob)
}

// marbleRunKey reads sealed_key beside MarbleRun's sealed_data: the data key
// that opens blob, or why there is none (recovery is then needed). A Quarry
// key file with an entry bound to blob is left by a migration that was
// interrupted before the new state was written; one without is ErrMixedFormats.
func marbleRunKey(ctx context.Context, key store.Store, sealer seal.KeySealer, blob []byte, sd *marblerun.SealedData) (dek []byte, raw bool, rev store.Revision, why string, err error) {
	b, rev, err := key.Load(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, false, "", "sealed_key is missing", nil
	case err != nil:
		return nil, false, "", "sealed_key cannot be read (" + err.Error() + ")", nil
	}
	if bytes.HasPrefix(b, []byte(seal.KeyFileMagic)) {
		entries, err := seal.DecodeKeyFile(b)
		if err != nil {
			return nil, false, rev, "", fmt.Errorf("%w (sealed_key is a corrupt Quarry key file: %v)", ErrMixedFormats, err)
		}
		e, ok := seal.Find(entries, blob)
		if !ok || e.Legacy {
			return nil, false, rev, "", ErrMixedFormats
		}
		dek, err := sealer.UnsealKey(e.Sealed, e.Binding[:])
		if err != nil || !sd.Opens(dek) {
			return nil, false, rev, "the Quarry sealed_key of an interrupted migration cannot be unsealed here", nil
		}
		return dek, false, rev, "", nil
	}
	if len(b) == 32 || len(b) == 16 {
		if seal.ProtectsKey(sealer) {
			// Whoever can write the seal directory could have planted
			// the state with a key of their choosing (docs/threat-model.md).
			return nil, true, rev, "sealed_key holds a raw data key, which a Coordinator in an enclave never takes from the host's disk; the state is migrated only after MarbleRun's signed recovery", nil
		}
		if sd.Opens(b) {
			return bytes.Clone(b), true, rev, "", nil
		}
		return nil, true, rev, "sealed_key holds a raw key that does not decrypt sealed_data (sealed_data was changed, or belongs to another key)", nil
	}
	return nil, false, rev, fmt.Sprintf("sealed_key (%d bytes) is not MarbleRun's no-enclave data key: a key sealed by MarbleRun's SGX enclave, which Quarry cannot unseal", len(b)), nil
}

// loadMarbleRun handles a MarbleRun sealed_data found at start: migrate it
// now, or enter recovery mode for it.
func (c *Core) loadMarbleRun(ctx context.Context, blob []byte, sd *marblerun.SealedData) (*snapshot, error) {
	if !migrationOn(c.opts.MigrateMarbleRun, c.opts.KeySealer) {
		// Like any state that cannot be opened (docs/sealing.md).
		off := migrationOffError(c.opts.MigrateMarbleRun)
		return c.enterRecoveryRefused(blob, "sealed_data is a MarbleRun state, which this Coordinator does not migrate", off)
	}
	dek, raw, rev, why, err := marbleRunKey(ctx, c.vault.KeyStore(), c.opts.KeySealer, blob, sd)
	if err != nil {
		return nil, err
	}
	c.vault.KeyRead(rev)
	if dek == nil {
		c.log.Warn("MarbleRun state found; its data key is not available, so it is migrated after a recovery with MarbleRun's recovery secrets", "why", why, "signedOnly", seal.ProtectsKey(c.opts.KeySealer))
		c.unreadable = blob
		c.rec.startMarbleRun(sd, c.opts.RecoveryTimeout, c.opts.Now)
		c.log.Error("entering recovery mode: "+why+"; the MarbleRun files are left untouched",
			"todo", "upload MarbleRun's recovery secrets (POST /api/v2/recover, e.g. marblerun recover or quarry recover); the state is then migrated")
		return c.fresh(eventStartUnreadable)
	}
	c.log.Info("MarbleRun state found; migrating it to Quarry's sealed state")
	return c.migrate(ctx, blob, sd, dek, raw, eventStartSealed, StateUninitialized)
}

// migrate converts the decrypted MarbleRun state and stores it as Quarry's
// state: MarbleRun's files are copied aside first (the originals stay until
// the commit replaces them), then the ordinary crash-safe commit writes the
// Quarry state under the same data key. keyIsMarbleRuns says whether
// sealed_key holds MarbleRun's own bytes (to be kept).
func (c *Core) migrate(ctx context.Context, blob []byte, sd *marblerun.SealedData, dek []byte, keyIsMarbleRuns bool, e event, from State) (*snapshot, error) {
	st, hdr, report, err := migrate.Convert(sd, dek)
	if err != nil {
		return nil, err
	}
	for _, w := range report.Warnings {
		c.log.Warn("migration: " + w)
	}
	snap, err := restore(st, c.opts.Now())
	if err != nil {
		return nil, fmt.Errorf("%w: the converted state is invalid: %v", ErrMigration, err)
	}
	if snap.state, err = next(from, e); err != nil {
		return nil, err
	}
	if from == StateRecovery {
		// At start New issues the quote; after a recovery it is issued here.
		if snap.quote, err = c.issueQuote(ctx, snap.ca, nil); err != nil {
			return nil, err
		}
	}
	suffix := c.asideSuffix("marblerun")
	var kept []string
	copier, ok := c.vault.DataStore().(store.Copier)
	if !ok {
		return nil, errors.New("the store of the sealed state cannot keep a copy of MarbleRun's sealed_data; refusing to migrate")
	}
	where, err := copier.CopyAside(ctx, suffix)
	if err != nil {
		return nil, fmt.Errorf("copying MarbleRun's sealed_data aside: %w", err)
	}
	kept = append(kept, where)
	if keyIsMarbleRuns {
		kc, ok := c.vault.KeyStore().(store.Copier)
		if !ok {
			return nil, errors.New("the store of the sealed key cannot keep a copy of MarbleRun's sealed_key; refusing to migrate")
		}
		where, err := kc.CopyAside(ctx, suffix)
		if err != nil {
			return nil, fmt.Errorf("copying MarbleRun's sealed_key aside: %w", err)
		}
		kept = append(kept, where)
	}
	mode := snap.manifest.Config.SealMode
	if from == StateRecovery {
		// As after any recovery: the key file that could not open the
		// state is moved aside (MarbleRun's, so it is kept under the
		// migration's suffix).
		if err := c.vault.Recovered(ctx, suffix); err != nil {
			return nil, err
		}
	}
	// The key is bound to the MarbleRun blob too (sealed by this sealer,
	// after the recovery's checks): a failure or crash between the two
	// writes of the commit leaves MarbleRun's blob with a key file that
	// opens it, and the next start migrates again. Without that entry the
	// key file would belong to another state (ErrMixedFormats).
	c.vault.Opened(dek, mode, nil)
	if err := c.commit(ctx, st, hdr, dek, mode); !vault.Stored(err) {
		return nil, fmt.Errorf("writing the migrated state: %w", err)
	}
	c.log.Info("MarbleRun state migrated: the seal directory now holds Quarry's sealed state; MarbleRun's files are kept",
		"keptAt", kept, "manifestFingerprint", snap.fingerprint,
		"secrets", report.Secrets, "users", report.Users, "updateLogEntries", report.UpdateLogEntries,
		"recoveryMode", report.RecoveryMode)
	return snap, nil
}

// InspectMigration is the dry run of a migration: it reads (never writes)
// the stores and reports what a start with sealer and policy would
// migrate. It returns ErrNoMarbleRunState when the stores hold no MarbleRun
// state (nothing, or Quarry's), an error wrapping ErrMigrationOff when the
// migration is off, ErrMixedFormats, or an error wrapping ErrMigration when
// the state decrypts but cannot be migrated.
func InspectMigration(ctx context.Context, data, key store.Store, sealer seal.KeySealer, policy MarbleRunMigration) (MigrationReport, error) {
	var rep MigrationReport
	blob, _, err := data.Load(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return rep, fmt.Errorf("%w: there is no sealed_data", ErrNoMarbleRunState)
	}
	if err != nil {
		return rep, err
	}
	if isQuarryBlob(blob) {
		return rep, fmt.Errorf("%w: sealed_data is already Quarry's sealed state", ErrNoMarbleRunState)
	}
	sd, err := marbleRunData(blob)
	if err != nil {
		return rep, fmt.Errorf("sealed_data is neither Quarry's sealed state nor MarbleRun's (truncated or damaged?): %w", err)
	}
	if !migrationOn(policy, sealer) {
		return rep, migrationOffError(policy)
	}
	rep.SignedRecoveryOnly = seal.ProtectsKey(sealer)
	dek, _, _, why, err := marbleRunKey(ctx, key, sealer, blob, sd)
	if err != nil {
		return rep, err
	}
	if dek == nil {
		rep.NeedsRecovery, rep.Why = true, why
		rep.RecoveryMode = migrate.RecoveryMode(sd, 0)
		rep.RecoveryShares = len(sd.ShareHashes)
		return rep, nil
	}
	_, _, rep, err = migrate.Convert(sd, dek)
	return rep, err
}

// ErrNoMarbleRunState means there is no MarbleRun state to migrate.
var ErrNoMarbleRunState = errors.New("no MarbleRun state to migrate")
