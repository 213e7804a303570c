package updatelog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
)

// MsgRestored is the "update" of the record of a restore from a backup
// (logchain.RestoreUpdate; docs/update-log.md).
const MsgRestored = logchain.RestoreUpdate

// Restored: the state was restored from a backup (taken at backupCreated,
// as the backup file says) whose log ends in restored; the restore
// replaced a state whose checkpoint was replaced (replacedState
// logchain.ReplacedCheckpoint), or no state (ReplacedNone), or a state
// whose checkpoint is not known (ReplacedUnknown; replaced nil).
func Restored(now time.Time, backupCreated string, restored logchain.Head, replacedState string, replaced *logchain.Checkpoint) string {
	return entry(now, MsgRestored, Field{KeyUser, logchain.RestoreUser},
		Field{"backupCreated", backupCreated},
		Field{"restoredCount", restored.Count}, Field{"restoredHead", restored.Hash},
		Field{"replacedState", replacedState}, Field{"replaced", replaced})
}

// HeaderCheckpoint is the part of the sealed state's public header that
// carries the update log's latest checkpoint (signed, so not secret: GET
// /api/v2/update-log serves it). `coordinator restore` reads it, without
// the data key, to say which head the state it replaces had.
type HeaderCheckpoint struct {
	UpdateLog *logchain.Checkpoint `json:"updateLog,omitempty"`
}

// CheckpointInHeader returns the checkpoint in a sealed state's public
// header (JSON), or nil when it has none (a state written by an earlier
// version) or the header is not JSON.
func CheckpointInHeader(header []byte) *logchain.Checkpoint {
	var h HeaderCheckpoint
	if json.Unmarshal(header, &h) != nil {
		return nil
	}
	return h.UpdateLog
}

// RestoreMarkerFile is the name of the restore marker in the seal
// directory.
const RestoreMarkerFile = "restored-from-backup"

// restoreMarkerFormat names the marker's format and version.
const restoreMarkerFormat = "quarry-restore-marker/v1"

// maxRestoreMarker bounds a marker file.
const maxRestoreMarker = 16 << 10

// RestoreMarker is what `coordinator restore` leaves in the seal directory
// for the next start: the restored state (SealedData, the SHA-256 of its
// sealed_data) and what it replaced. The host writes it, so the
// Coordinator trusts none of it: it records a restore only for the very
// sealed_data it opened, and a replaced checkpoint only when this state's
// root signed it; BackupCreated is the backup file's claim.
type RestoreMarker struct {
	Format string `json:"format"`
	// Restored is when the restore ran (RFC 3339, UTC).
	Restored string `json:"restored"`
	// BackupCreated is when the backup says it was taken (RFC 3339).
	BackupCreated string `json:"backupCreated"`
	// SealedData is the lowercase hex SHA-256 of the restored sealed_data.
	SealedData string `json:"sealedData"`
	// ReplacedState and Replaced: see Restored.
	ReplacedState string               `json:"replacedState"`
	Replaced      *logchain.Checkpoint `json:"replaced,omitempty"`
}

// ErrBadRestoreMarker means a restore marker is not one.
var ErrBadRestoreMarker = errors.New("the restore marker is not well formed")

// Encode returns the marker's file content.
func (m RestoreMarker) Encode() ([]byte, error) {
	m.Format = restoreMarkerFormat
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// DecodeRestoreMarker reads a marker file and checks its form.
func DecodeRestoreMarker(b []byte) (RestoreMarker, error) {
	var m RestoreMarker
	if len(b) > maxRestoreMarker {
		return m, fmt.Errorf("%w: %d bytes", ErrBadRestoreMarker, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: %v", ErrBadRestoreMarker, err)
	}
	if m.Format != restoreMarkerFormat {
		return m, fmt.Errorf("%w: format %q, this build reads %q", ErrBadRestoreMarker, m.Format, restoreMarkerFormat)
	}
	if _, err := logchain.ParseHash(m.SealedData); err != nil {
		return m, fmt.Errorf("%w: sealedData: %v", ErrBadRestoreMarker, err)
	}
	if _, err := time.Parse(time.RFC3339, m.BackupCreated); err != nil {
		return m, fmt.Errorf("%w: backupCreated: %v", ErrBadRestoreMarker, err)
	}
	switch {
	case m.ReplacedState == logchain.ReplacedCheckpoint && m.Replaced != nil:
	case (m.ReplacedState == logchain.ReplacedNone || m.ReplacedState == logchain.ReplacedUnknown) && m.Replaced == nil:
	default:
		return m, fmt.Errorf("%w: replacedState %q with replaced %v", ErrBadRestoreMarker, m.ReplacedState, m.Replaced != nil)
	}
	return m, nil
}
