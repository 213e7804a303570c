// Package migrate converts a MarbleRun Coordinator's sealed state into
// Quarry's (docs/migration.md): the decrypted MarbleRun state (parsed by
// internal/marblerun) becomes a sealedstate.State and sealedstate.Header
// under the SAME data key, so MarbleRun's recovery secrets keep working,
// with a Report of what moved and what Quarry would have refused.
//
// It is a pure converter: no store, no logging, no policy. The core
// decides when a state is migrated (the setting, the enclave rule), copies
// MarbleRun's files aside and writes the result through its crash-safe
// commit.
package migrate

import (
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/quarry-cc/quarry/internal/marblerun"
	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/manifest"
)

// ErrMigration is wrapped by the errors that stop a migration of a state
// that did decrypt (an unknown store key, an inconsistent state, a data
// key Quarry does not keep): nothing is converted.
var ErrMigration = errors.New("the MarbleRun state cannot be migrated")

// Report is what a migration moves, for the dry run and the log. Convert
// fills the counts, the recovery mode and the warnings; the fields up to
// SignedRecoveryOnly are the caller's, for a state it cannot decrypt.
type Report struct {
	// NeedsRecovery is set when sealed_key does not open the state: the
	// recovery secrets are needed (the counts below are then unknown).
	NeedsRecovery bool
	// Why says why a recovery is needed.
	Why string
	// SignedRecoveryOnly: the Coordinator runs in an enclave, so only
	// signed recovery secrets (POST /api/v2/recover) are taken.
	SignedRecoveryOnly bool
	// RecoveryMode is single, xor or shamir (MarbleRun's recovery data);
	// RecoveryShares the number of share hashes.
	RecoveryMode   string
	RecoveryShares int
	// Counts of what is migrated.
	Secrets, PreviousSecrets, Users, Packages, Marbles, UpdateLogEntries int
	Activations, MonotonicCounters                                       int
	PendingUpdate                                                        bool
	ManifestFingerprint                                                  string
	// Warnings are the findings that do not stop the migration (manifest
	// rules Quarry checks and MarbleRun did not, inconsistencies).
	Warnings []string
}

// RecoveryMode names MarbleRun's recovery data.
func RecoveryMode(sd *marblerun.SealedData, shareSize int) string {
	switch {
	case sd.ShareHashes == nil:
		return string(recovery.ModeSingle)
	case shareSize == 33:
		return string(recovery.ModeShamir)
	case shareSize == 32:
		return string(recovery.ModeXOR)
	}
	return "xor or shamir"
}

// Convert decrypts MarbleRun's sealed data with its data key dek and
// converts the state into Quarry's sealed state and header (same data
// key). Every error wraps ErrMigration. The manifest is converted as it
// is stored, even where it breaks a rule Quarry enforces on new ones: the
// report's warnings name each such finding.
func Convert(sd *marblerun.SealedData, dek []byte) (*sealedstate.State, sealedstate.Header, Report, error) {
	var rep Report
	if len(dek) != seal.KeySize {
		return nil, sealedstate.Header{}, rep, fmt.Errorf("%w: the data key has %d bytes (a MarbleRun state from before 1.9.0); Quarry keeps 32-byte data keys: with MarbleRun 1.9 or later, apply a full manifest update that changes RecoveryKeys (MarbleRun then makes a new 32-byte data key and new recovery secrets), then start Quarry again; nothing was changed", ErrMigration, len(dek))
	}
	kv, err := sd.Open(dek)
	if err != nil {
		return nil, sealedstate.Header{}, rep, fmt.Errorf("%w: %w", ErrMigration, err)
	}
	mr, err := marblerun.Decode(kv)
	if err != nil {
		return nil, sealedstate.Header{}, rep, fmt.Errorf("%w: %w", ErrMigration, err)
	}
	return convertState(mr, sd, dek)
}

// convertState converts a decoded MarbleRun state (sd is its sealed data,
// for the recovery data).
func convertState(mr *marblerun.State, sd *marblerun.SealedData, dek []byte) (*sealedstate.State, sealedstate.Header, Report, error) {
	var rep Report
	warn := func(format string, args ...any) { rep.Warnings = append(rep.Warnings, fmt.Sprintf(format, args...)) }
	if mr.StateCode != sealedstate.Running {
		return nil, sealedstate.Header{}, rep, fmt.Errorf("%w: the stored state is %d, not %d (a manifest set)", ErrMigration, mr.StateCode, sealedstate.Running)
	}
	m, err := manifest.ParseStored(mr.Manifest)
	if err != nil {
		return nil, sealedstate.Header{}, rep, fmt.Errorf("%w: the stored manifest: %v", ErrMigration, err)
	}
	// Quarry's own rules are reported, never enforced: MarbleRun accepted
	// this manifest, and the deployment runs with it.
	if _, err := manifest.Parse(mr.Manifest); err != nil {
		warn("the manifest breaks a rule MarbleRun does not enforce (it is migrated as is): %v", err)
	}
	if err := m.Validate(); err != nil {
		var ve *manifest.ValidationError
		if errors.As(err, &ve) {
			warn("the manifest breaks a rule MarbleRun does not enforce (it is migrated as is): %s: %s (section %s, entry %q, field %q)", ve.Stage(), ve.Message, ve.Section, ve.Name, ve.Field)
		} else {
			warn("the manifest breaks a rule MarbleRun does not enforce (it is migrated as is): %v", err)
		}
	}
	rep.ManifestFingerprint = fingerprint(mr.Manifest)

	// Definitions MarbleRun keeps beside the manifest must be the
	// manifest's: Quarry serves them from the manifest.
	sameNames := func(what string, stored []string, want []string) {
		if !slices.Equal(slices.Sorted(slices.Values(stored)), slices.Sorted(slices.Values(want))) {
			warn("the stored %s %v differ from the manifest's %v; Quarry uses the manifest's", what, stored, want)
		}
	}
	sameNames("marbles", mr.Marbles, slices.Collect(maps.Keys(m.Marbles)))
	sameNames("TLS tags", mr.TLS, slices.Collect(maps.Keys(m.TLS)))
	sameNames("infrastructures", mr.Infrastructures, slices.Collect(maps.Keys(m.Infrastructures)))
	sameNames("users", mr.Users, slices.Collect(maps.Keys(m.Users)))

	packages := maps.Clone(mr.Packages)
	for name, p := range m.Packages {
		if _, ok := packages[name]; !ok {
			warn("package %s has no stored entry; the manifest's definition is used", name)
			packages[name] = p
		}
	}
	for name := range mr.Packages {
		if _, ok := m.Packages[name]; !ok {
			warn("the stored package %s is not in the manifest; it is kept", name)
		}
	}

	cur := convertSecrets(mr.Secrets, m)
	prev := convertSecrets(mr.PreviousSecrets, m)
	for name := range m.Secrets {
		if _, ok := cur[name]; !ok {
			warn("secret %s of the manifest has no stored value", name)
		}
	}
	if len(prev) == 0 {
		prev = nil
	}
	var pending *sealedstate.PendingUpdate
	if p := mr.Pending; p != nil {
		pending = &sealedstate.PendingUpdate{ManifestRaw: p.ManifestRaw, RequiredUsers: slices.Sorted(maps.Keys(p.RequiredUsers))}
		for _, u := range pending.RequiredUsers {
			if p.RequiredUsers[u] {
				pending.Acknowledged = append(pending.Acknowledged, u)
			}
		}
		pending.Needed = len(pending.Acknowledged) + max(p.Missing(), 0)
	}
	rootSecret := mr.RootSecret
	if len(rootSecret) == 0 {
		// MarbleRun's fallback for states without one: it derives from
		// the root key then.
		rootSecret = mr.RootKey
		warn("the state has no rootSecret; the root key's bytes are used as MarbleRun does")
	}
	st := &sealedstate.State{
		Format:             sealedstate.Format,
		State:              sealedstate.Running,
		RootSecret:         rootSecret,
		PreviousRootSecret: mr.PreviousRootSecret,
		Manifest:           mr.Manifest,
		ManifestSignature:  mr.ManifestSignature,
		Packages:           packages,
		Secrets:            cur,
		PreviousSecrets:    prev,
		UpdateLog:          mr.UpdateLog,
		Pending:            pending,
	}
	st.CA.RootCert, st.CA.RootKey = mr.RootCert, mr.RootKey
	st.CA.IntermediateCert, st.CA.IntermediateKey = mr.IntermediateCert, mr.IntermediateKey
	st.CA.MarbleRootCert = mr.MarbleRootCert
	if len(mr.Activations) > 0 {
		st.Activations = mr.Activations
	}
	if len(mr.MonotonicCounters) > 0 {
		st.MonotonicCounters = mr.MonotonicCounters
	}
	if st.UpdateLog == nil {
		st.UpdateLog = []string{}
	}
	hdr, mode, err := recoveryHeader(m, sd, dek)
	if err != nil {
		return nil, sealedstate.Header{}, rep, err
	}
	rep.RecoveryMode = mode
	rep.RecoveryShares = len(sd.ShareHashes)
	rep.Secrets, rep.PreviousSecrets, rep.Users = len(cur), len(mr.PreviousSecrets), len(mr.Users)
	rep.Packages, rep.Marbles, rep.UpdateLogEntries = len(packages), len(mr.Marbles), len(mr.UpdateLog)
	rep.Activations, rep.MonotonicCounters, rep.PendingUpdate = len(mr.Activations), len(mr.MonotonicCounters), pending != nil
	return st, hdr, rep, nil
}

// convertSecrets turns MarbleRun's stored secrets into Quarry's; the
// explicit Cert.NotAfter of the manifest's definition is kept beside them
// as a Quarry manifest set would.
func convertSecrets(in map[string]marblerun.Secret, m *manifest.Manifest) map[string]secrets.Secret {
	out := make(map[string]secrets.Secret, len(in))
	for name, s := range in {
		out[name] = secrets.Secret{
			Type: s.Type, Size: s.Size, Shared: s.Shared, UserDefined: s.UserDefined,
			ValidFor: s.ValidFor, NotAfter: m.Secrets[name].Cert.NotAfter,
			Cert: s.Cert, Private: s.Private, Public: s.Public,
		}
	}
	return out
}

// recoveryHeader is the public recovery data of the migrated state,
// for the same data key and MarbleRun's recovery secrets: a single key's share
// is the data key (its hash is known); XOR and Shamir shares are known only
// by their hashes, not by which key holds which, so they are kept as
// MarbleRun's share hashes and matched to a key by the signature of each
// upload.
func recoveryHeader(m *manifest.Manifest, sd *marblerun.SealedData, dek []byte) (sealedstate.Header, string, error) {
	hdr := sealedstate.Header{Format: sealedstate.Format}
	keys := make(map[string]recovery.Recipient, len(m.RecoveryKeys))
	for name, text := range m.RecoveryKeys {
		k, err := recovery.ParsePublicKeyPEM(text)
		if err != nil {
			return sealedstate.Header{}, "", fmt.Errorf("%w: recovery key %s: %v", ErrMigration, name, err)
		}
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			return sealedstate.Header{}, "", err
		}
		keys[name] = recovery.Recipient{PublicKey: der}
	}
	n := len(keys)
	switch {
	case n == 0:
		hdr.Recovery = recovery.Public{Mode: recovery.ModeNone}
		return hdr, string(recovery.ModeNone), nil
	case sd.ShareHashes == nil:
		if n != 1 {
			return sealedstate.Header{}, "", fmt.Errorf("%w: the manifest has %d recovery keys but the state has single-key recovery data", ErrMigration, n)
		}
		sum := sha256.Sum256(dek)
		for name, r := range keys {
			r.ShareHash = hex.EncodeToString(sum[:])
			keys[name] = r
		}
		hdr.Recovery = recovery.Public{Mode: recovery.ModeSingle, Threshold: 1, Keys: keys}
		return hdr, string(recovery.ModeSingle), nil
	}
	if len(sd.ShareHashes) != n {
		return sealedstate.Header{}, "", fmt.Errorf("%w: the manifest has %d recovery keys but the state's recovery data holds %d shares", ErrMigration, n, len(sd.ShareHashes))
	}
	t := int(m.Config.RecoveryThreshold)
	mode := recovery.ModeXOR
	if t >= 2 && t < n {
		mode = recovery.ModeShamir
	} else {
		t = n
	}
	hdr.Recovery = recovery.Public{Mode: mode, Threshold: t, Keys: keys}
	hdr.MarbleRunShares = slices.Clone(sd.ShareHashes)
	return hdr, string(mode), nil
}

// recoveryKeys returns the manifest's recovery keys (those that parse).
func RecoveryKeys(m *manifest.Manifest) map[string]*rsa.PublicKey {
	out := make(map[string]*rsa.PublicKey, len(m.RecoveryKeys))
	for name, text := range m.RecoveryKeys {
		if k, err := recovery.ParsePublicKeyPEM(text); err == nil {
			out[name] = k
		}
	}
	return out
}

// fingerprint is the manifest's fingerprint as the Client API shows it
// (hex SHA-256 of the raw bytes).
func fingerprint(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}
