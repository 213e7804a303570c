// Package updatelog writes the entries of the Coordinator's update log
// (docs/update-log.md): one JSON object per line with the keys "time"
// (RFC 3339, UTC, milliseconds), "update" (the message) and then the
// event's fields in a fixed order. The marblerun CLI parses these entries
// (for example to rebuild package versions), so the messages and field
// names are exact.
//
// The log itself is a []string owned by the caller, one entry per element,
// only ever appended to; Text renders it as the v1 API's single string.
package updatelog

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// TimeFormat is the format of the "time" key (applied to UTC times).
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// The "update" messages MarbleRun's Coordinator writes.
const (
	MsgManifestSet              = "Initial manifest set"
	MsgSecurityVersion          = "SecurityVersion increased"
	MsgSecretSet                = "Secret set"
	MsgUpdateInitiatedApplied   = "Complete Manifest update initiated by user. No further acknowledgements required"
	MsgUpdateInitiatedWaiting   = "Complete Manifest update initiated by user. Waiting for acknowledgments to apply the update"
	MsgUpdateAcknowledged       = "Complete Manifest update acknowledged by user"
	MsgUpdateApplied            = "Complete Manifest updated"
	MsgUpdateCancelled          = "Complete Manifest update cancelled by user"
	MsgUpdateCancelledOnFailure = "Complete Manifest update cancelled due to error during apply"
)

// Field names of MarbleRun's entries.
const (
	KeyUser                   = "user"
	KeyPackage                = "package"
	KeyNewVersion             = "new version"
	KeySecret                 = "secret"
	KeyType                   = "type"
	KeyManifestFingerprint    = "manifestFingerprint"
	KeyMissingAcknowledgments = "missingAcknowledgments"
	KeyMissingUsers           = "missingUsers"
)

// ErrInvalidField means an entry's field has an empty or repeated key
// ("time" and "update" are taken), or a value JSON cannot encode.
var ErrInvalidField = errors.New("invalid update log field")

// Field is one key and value of an entry, written in the given order.
type Field struct {
	Key   string
	Value any // encoded with encoding/json
}

// Entry returns one log entry (without a trailing newline):
// {"time":<now in UTC>,"update":<update>,<fields in order>}.
// Strings are JSON-escaped without HTML escaping (as zap writes them), so
// an entry is always a single line.
func Entry(now time.Time, update string, fields ...Field) (string, error) {
	seen := map[string]bool{"time": true, "update": true}
	var b bytes.Buffer
	b.WriteString(`{"time":`)
	writeString(&b, now.UTC().Format(TimeFormat))
	b.WriteString(`,"update":`)
	writeString(&b, update)
	for _, f := range fields {
		if f.Key == "" || seen[f.Key] {
			return "", fmt.Errorf("%w: key %q is empty or repeated", ErrInvalidField, f.Key)
		}
		seen[f.Key] = true
		b.WriteByte(',')
		writeString(&b, f.Key)
		b.WriteByte(':')
		if err := writeValue(&b, f.Value); err != nil {
			return "", fmt.Errorf("%w: key %q: %w", ErrInvalidField, f.Key, err)
		}
	}
	b.WriteByte('}')
	return b.String(), nil
}

// writeValue appends v as JSON without HTML escaping.
func writeValue(b *bytes.Buffer, v any) error {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b.Truncate(b.Len() - 1) // Encode ends with '\n'
	return nil
}

// writeString appends s as a JSON string. A string always encodes.
func writeString(b *bytes.Buffer, s string) {
	_ = writeValue(b, s)
}

// entry is Entry for the constructors, whose keys are distinct constants
// and whose values (strings, integers, string slices) always encode.
func entry(now time.Time, update string, fields ...Field) string {
	s, err := Entry(now, update, fields...)
	if err != nil {
		// Unreachable: see above. Keep the event rather than lose it.
		s, _ = Entry(now, update)
	}
	return s
}

// Fingerprint is the manifestFingerprint of a raw manifest: the lowercase
// hex SHA-256 of its exact bytes.
func Fingerprint(rawManifest []byte) string {
	sum := sha256.Sum256(rawManifest)
	return hex.EncodeToString(sum[:])
}

// ManifestSet: the first manifest was set.
func ManifestSet(now time.Time) string {
	return entry(now, MsgManifestSet)
}

// SecurityVersionIncreased: a package update by user raised pkg's
// SecurityVersion to version.
func SecurityVersionIncreased(now time.Time, user, pkg string, version uint) string {
	return entry(now, MsgSecurityVersion,
		Field{KeyUser, user}, Field{KeyPackage, pkg}, Field{KeyNewVersion, version})
}

// SecretSet: user uploaded the user-defined secret of the given type (one
// entry per secret).
func SecretSet(now time.Time, user, secret, secretType string) string {
	return entry(now, MsgSecretSet,
		Field{KeyUser, user}, Field{KeySecret, secret}, Field{KeyType, secretType})
}

// UpdateInitiatedApplied: user proposed a full update that needed no
// further acknowledgements.
func UpdateInitiatedApplied(now time.Time, user, fingerprint string) string {
	return entry(now, MsgUpdateInitiatedApplied,
		Field{KeyUser, user}, Field{KeyManifestFingerprint, fingerprint})
}

// UpdateInitiatedWaiting: user proposed a full update that waits for
// missingAcks acknowledgements from missingUsers.
func UpdateInitiatedWaiting(now time.Time, user string, missingAcks int, missingUsers []string, fingerprint string) string {
	return entry(now, MsgUpdateInitiatedWaiting,
		Field{KeyUser, user}, Field{KeyMissingAcknowledgments, missingAcks},
		Field{KeyMissingUsers, nonNil(missingUsers)}, Field{KeyManifestFingerprint, fingerprint})
}

// UpdateAcknowledged: user acknowledged the pending update; missingAcks
// acknowledgements from missingUsers are still needed.
func UpdateAcknowledged(now time.Time, user string, missingAcks int, missingUsers []string, fingerprint string) string {
	return entry(now, MsgUpdateAcknowledged,
		Field{KeyUser, user}, Field{KeyMissingAcknowledgments, missingAcks},
		Field{KeyMissingUsers, nonNil(missingUsers)}, Field{KeyManifestFingerprint, fingerprint})
}

// UpdateApplied: the full update was applied.
func UpdateApplied(now time.Time, fingerprint string) string {
	return entry(now, MsgUpdateApplied, Field{KeyManifestFingerprint, fingerprint})
}

// UpdateCancelled: user cancelled the pending update.
func UpdateCancelled(now time.Time, user, fingerprint string) string {
	return entry(now, MsgUpdateCancelled, Field{KeyUser, user}, Field{KeyManifestFingerprint, fingerprint})
}

// UpdateCancelledOnFailure: applying the update failed, so it was
// cancelled.
func UpdateCancelledOnFailure(now time.Time, fingerprint string) string {
	return entry(now, MsgUpdateCancelledOnFailure, Field{KeyManifestFingerprint, fingerprint})
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Text renders a log as the v1 API returns it: every entry followed by
// "\n". An empty log is "".
func Text(log []string) string {
	if len(log) == 0 {
		return ""
	}
	return strings.Join(log, "\n") + "\n"
}
