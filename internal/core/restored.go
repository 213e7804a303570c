package core

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/quarry-cc/quarry/internal/vault"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

// A restore from a backup (docs/backup.md) runs while the Coordinator is
// stopped, on the seal directory, and cannot open the state: it leaves a
// marker (updatelog.RestoreMarker) naming the restored sealed_data and the
// checkpoint of the state it replaced, read from that state's public
// header. The start that opens the restored state records the restore in
// the update log ("quarry: restored from backup", docs/update-log.md), so
// that a client holding a checkpoint of the discarded entries can tell a
// restore from tampering.
//
// The host writes the marker, and the Coordinator trusts none of it
// (docs/threat-model.md): the restore is recorded only for the exact
// sealed_data the Coordinator opened, a replaced checkpoint only when this
// state's root signed it, and the backup's time is the backup file's
// claim. A host that rolls the directory back by copying files leaves no
// marker: the record is a courtesy for honest restores, not a security
// boundary.

// restoreRecord returns the entry recording the restore that the marker
// names for blob (the sealed_data whose state, with root certificate in
// a and log head head, was just opened), and done, which moves the marker
// aside once the entry is stored. It returns "" when there is no marker
// for blob; a marker for another sealed_data (a restore that stopped
// before writing it, or one recorded already) or one that does not parse
// is moved aside at once, with a warning.
func (c *Core) restoreRecord(ctx context.Context, s *snapshot, blob []byte) (entry string, done func(), err error) {
	ms := c.opts.RestoreMarker
	if ms == nil {
		return "", nil, nil
	}
	raw, _, err := ms.Load(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("reading the restore marker %s: %w", updatelog.RestoreMarkerFile, err)
	}
	m, err := updatelog.DecodeRestoreMarker(raw)
	if err != nil {
		c.markerAside(ctx, "unreadable", "the restore marker does not parse; no restore is recorded for it", err)
		return "", nil, nil
	}
	if m.SealedData != fingerprint(blob) {
		c.markerAside(ctx, "stale", "the restore marker names another sealed_data (a restore that did not finish, or one recorded before); no restore is recorded for it",
			fmt.Errorf("the marker names sealed_data %s, the stored one is %s", m.SealedData, fingerprint(blob)))
		return "", nil, nil
	}
	state, replaced := m.ReplacedState, m.Replaced
	if replaced != nil {
		if err := replaced.Verify(s.ca.Root); err != nil {
			c.log.Warn("the checkpoint of the state the restore replaced is not signed by this state's root (another deployment's state?); the record says it is unknown", "error", err.Error())
			state, replaced = logchain.ReplacedUnknown, nil
		}
	}
	head := s.persisted.Log.Chain()
	entry = updatelog.Restored(c.opts.Now(), m.BackupCreated, head, state, replaced)
	done = func() {
		c.markerAside(ctx, "recorded", "", nil)
		attrs := []any{"restoredCount", head.Count, "backupCreated", m.BackupCreated, "replacedState", state}
		if replaced != nil {
			attrs = append(attrs, "replacedCount", replaced.Count, "replacedHead", replaced.Head.String())
		}
		c.log.Warn("this state was restored from a backup; the restore is recorded in the update log", attrs...)
	}
	return entry, done, nil
}

// recordRestore writes the record of a restore into the state just opened
// from blob (s, not yet published) when the restore marker names blob. A
// failure to store it stops the start: the marker stays, and the next
// start records the restore.
func (c *Core) recordRestore(ctx context.Context, s *snapshot, blob []byte) error {
	entry, done, err := c.restoreRecord(ctx, s, blob)
	if err != nil || entry == "" {
		return err
	}
	st := *s.persisted
	st.UpdateLog = append(slices.Clip(st.UpdateLog), entry)
	if err := c.commit(ctx, &st, c.header, c.dek, s.manifest.Config.SealMode); !vault.Stored(err) {
		return fmt.Errorf("recording the restore from a backup in the update log: %w", err)
	}
	s.persisted = &st
	done()
	return nil
}

// markerAside moves the restore marker aside (never deleting it), with a
// warning when why is set.
func (c *Core) markerAside(ctx context.Context, what, why string, cause error) {
	where, err := store.MoveAside(ctx, c.opts.RestoreMarker, c.asideSuffix(what))
	if err != nil {
		c.log.Error("the restore marker cannot be moved aside", "error", err.Error())
		return
	}
	if why != "" {
		c.log.Warn(why, "cause", cause.Error(), "movedTo", where)
	}
}
