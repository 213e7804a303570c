package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/store/filestore"
)

// ErrNotMigratable is returned by CheckMigration when the seal directory
// holds a MarbleRun state that a start would not migrate.
var ErrNotMigratable = errors.New("the MarbleRun state cannot be migrated")

// CheckMigration is the dry run of `coordinator --check-migration`: it
// reads the seal directory (without locking or creating anything, so that
// no byte and no modification time changes) and writes a report of what a
// start would migrate from a MarbleRun state to out.
func CheckMigration(ctx context.Context, cfg config.Config, log *slog.Logger, out io.Writer) error {
	info, err := os.Stat(cfg.SealDir)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(out, "seal directory %s does not exist: nothing to migrate (a start begins with a fresh state)\n", cfg.SealDir)
		return nil
	}
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("seal directory %s is not a directory", cfg.SealDir)
	}
	data, err := filestore.New(cfg.SealDir, SealedDataFile)
	if err != nil {
		return err
	}
	key, err := filestore.New(cfg.SealDir, SealedKeyFile)
	if err != nil {
		return err
	}
	a := &App{cfg: cfg, log: log}
	issuer, err := a.issuer()
	if err != nil {
		return err
	}
	sealer, err := a.keySealer(issuer)
	if err != nil {
		return err
	}
	rep, err := core.InspectMigration(ctx, data, key, sealer, cfg.MigrateMarbleRun)
	if errors.Is(err, core.ErrNoMarbleRunState) {
		fmt.Fprintf(out, "%v: nothing to migrate\n", err)
		return nil
	}
	if err != nil {
		fmt.Fprintf(out, "MarbleRun state found in %s, but a start would NOT migrate it:\n  %v\nNothing was written.\n", cfg.SealDir, err)
		return fmt.Errorf("%w: %w", ErrNotMigratable, err)
	}
	writeReport(out, cfg.SealDir, rep)
	return nil
}

func writeReport(out io.Writer, dir string, rep core.MigrationReport) {
	var b strings.Builder
	fmt.Fprintf(&b, "MarbleRun state found in %s.\n", dir)
	if rep.NeedsRecovery {
		fmt.Fprintf(&b, "recovery needed: yes (%s)\n", rep.Why)
		fmt.Fprintf(&b, "recovery data: %s", rep.RecoveryMode)
		if rep.RecoveryShares > 0 {
			fmt.Fprintf(&b, ", %d shares", rep.RecoveryShares)
		}
		b.WriteString("\nA start enters recovery mode (state 1); upload MarbleRun's recovery secrets (marblerun recover / quarry recover) and the state is migrated.\n")
		if rep.SignedRecoveryOnly {
			b.WriteString("In an enclave only signed recovery secrets are taken (POST /api/v2/recover), checked against the recovery keys of the manifest inside the state.\n")
		}
		b.WriteString("The contents are encrypted: counts are known only after the recovery.\nNothing was written.\n")
		fmt.Fprint(out, b.String())
		return
	}
	b.WriteString("recovery needed: no (sealed_key holds the data key)\n")
	fmt.Fprintf(&b, "manifest fingerprint: %s\n", rep.ManifestFingerprint)
	fmt.Fprintf(&b, "secrets: %d (previous values: %d)\n", rep.Secrets, rep.PreviousSecrets)
	fmt.Fprintf(&b, "users: %d\n", rep.Users)
	fmt.Fprintf(&b, "packages: %d\n", rep.Packages)
	fmt.Fprintf(&b, "marbles: %d\n", rep.Marbles)
	fmt.Fprintf(&b, "update log entries: %d\n", rep.UpdateLogEntries)
	fmt.Fprintf(&b, "activation counters: %d\n", rep.Activations)
	fmt.Fprintf(&b, "monotonic counters: %d\n", rep.MonotonicCounters)
	fmt.Fprintf(&b, "pending update: %t\n", rep.PendingUpdate)
	fmt.Fprintf(&b, "recovery keys: %s", rep.RecoveryMode)
	if rep.RecoveryShares > 0 {
		fmt.Fprintf(&b, " (%d shares)", rep.RecoveryShares)
	}
	b.WriteString("; MarbleRun's recovery secrets keep working after the migration\n")
	fmt.Fprintf(&b, "warnings: %d\n", len(rep.Warnings))
	for _, w := range rep.Warnings {
		fmt.Fprintf(&b, "  - %s\n", w)
	}
	b.WriteString("A start migrates this state (sealed_data and sealed_key are kept as *.marblerun-<time>). Nothing was written.\n")
	fmt.Fprint(out, b.String())
}
