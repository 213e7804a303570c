package updatelog

import (
	"strings"
	"time"
)

// Quarry's own entries: recorded in the verifiable log (GET
// /api/v2/update-log) but left out of the existing endpoints, whose answers
// stay exactly MarbleRun's (IsAudit). Their "update" message starts with
// "quarry: ".
const (
	MsgManifestChanged = auditPrefix + "manifest changed"
	MsgRecovered       = auditPrefix + "state recovered"
	MsgMarbleUsage     = auditPrefix + "marble activity"
)

// Keys of Quarry's own entries.
const (
	KeyOldManifestFingerprint = "oldManifestFingerprint"
	KeyUsers                  = "users"
	KeyActivations            = "activations"
	KeyCounterIncrements      = "counterIncrements"
)

// WhoRecovery is the "user" of a recovery.
const WhoRecovery = "recovery"

// ManifestChanged: a full update replaced the manifest with fingerprint
// oldFP by the one with newFP; users acknowledged it (the initiator first;
// empty when the initiator alone applied it, who the entry before names).
func ManifestChanged(now time.Time, users []string, oldFP, newFP string) string {
	return entry(now, MsgManifestChanged, Field{KeyUsers, nonNil(users)},
		Field{KeyOldManifestFingerprint, oldFP}, Field{KeyManifestFingerprint, newFP})
}

// Recovered: the sealed state was recovered with the recovery secrets.
func Recovered(now time.Time, fingerprint string) string {
	return entry(now, MsgRecovered, Field{KeyUser, WhoRecovery}, Field{KeyManifestFingerprint, fingerprint})
}

// auditPrefix starts the "update" message of Quarry's own entries. The
// existing endpoints (GET /api/v2/update, v1 GET /update) do not show them.
const auditPrefix = "quarry: "

// IsAudit reports whether entry is one of Quarry's own entries, which the
// existing GET /api/v2/update and v1 /update leave out so that their
// answers stay exactly MarbleRun's.
func IsAudit(entry string) bool {
	// Entries written by Entry start {"time":"<24 characters>","update":"
	const pre = `{"time":"` + "2006-01-02T15:04:05.000Z" + `","update":"`
	return len(entry) > len(pre) && strings.HasPrefix(entry, `{"time":"`) &&
		entry[len(pre)-len(`","update":"`):len(pre)] == `","update":"` &&
		strings.HasPrefix(entry[len(pre):], auditPrefix)
}

// Legacy returns log without Quarry's own entries (a new slice only when
// there are any).
func Legacy(log []string) []string {
	for i, e := range log {
		if IsAudit(e) {
			out := append([]string(nil), log[:i]...)
			for _, e := range log[i+1:] {
				if !IsAudit(e) {
					out = append(out, e)
				}
			}
			return out
		}
	}
	return log
}

// MarbleUsage: since the previous entry, Marbles of each type with
// MaxActivations were activated activations[type] times, and monotonic
// counters were increased increments times. Marble activity is recorded
// only as these counts, with the next governance change.
func MarbleUsage(now time.Time, activations map[string]uint64, increments uint64) string {
	if activations == nil {
		activations = map[string]uint64{}
	}
	return entry(now, MsgMarbleUsage, Field{KeyUser, "Marbles"},
		Field{KeyActivations, activations}, Field{KeyCounterIncrements, increments})
}
