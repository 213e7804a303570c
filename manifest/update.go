package manifest

import (
	"encoding/pem"
	"slices"
	"strings"
)

// IsPackageUpdate reports whether m, uploaded as an update, is a package
// update: Infrastructures, Marbles, Users, RecoveryKeys, Roles, Secrets and
// TLS are all empty. Config is not considered (a package update ignores it).
// Anything else is a full update.
func (m *Manifest) IsPackageUpdate() bool {
	if m == nil {
		return false
	}
	return len(m.Infrastructures) == 0 && len(m.Marbles) == 0 && len(m.Users) == 0 &&
		len(m.RecoveryKeys) == 0 && len(m.Roles) == 0 && len(m.Secrets) == 0 && len(m.TLS) == 0
}

// ValidatePackageUpdate checks a package update against the current packages,
// in sorted package order: the update names at least one package, every named
// package exists, sets neither Debug, UniqueID, SignerID nor ProductID, sets
// SecurityVersion (at most 65535, the SGX field's range), and does not lower
// it. AcceptedTCBStatuses and AcceptedAdvisories are ignored. The error is a
// *ValidationError (Stage "checking update manifest") and wraps ErrInvalid.
func (m *Manifest) ValidatePackageUpdate(current map[string]Package) error {
	if m == nil || len(m.Packages) == 0 {
		return m.updateError("", "", "no packages defined")
	}
	names := sorted(m.Packages)
	for _, name := range names {
		if _, ok := current[name]; !ok {
			return m.updateError(name, "", "update manifest specifies package %s, which the current manifest does not contain", name)
		}
	}
	for _, name := range names {
		p := m.Packages[name]
		switch {
		case p.Debug:
			return m.updateError(name, "Debug", "update manifest contains unupdatable values")
		case p.UniqueID != "":
			return m.updateError(name, "UniqueID", "update manifest contains unupdatable values")
		case p.SignerID != "":
			return m.updateError(name, "SignerID", "update manifest contains unupdatable values")
		case p.ProductID != nil:
			return m.updateError(name, "ProductID", "update manifest contains unupdatable values")
		case p.IsTDX():
			return m.updateError(name, "MRTD", "update manifest contains unupdatable values (TDX measurements)")
		case current[name].IsTDX():
			return m.updateError(name, "SecurityVersion", "package %s describes a TDX guest, which has no SecurityVersion to update", name)
		case p.SecurityVersion == nil:
			return m.updateError(name, "SecurityVersion", "update manifest does not specify a SecurityVersion to update")
		case uint64(*p.SecurityVersion) > maxSGXField:
			return m.updateError(name, "SecurityVersion", "update manifest sets SecurityVersion of package %s to %d, outside the SGX range 0 to %d", name, *p.SecurityVersion, maxSGXField)
		}
		if cur := current[name].SecurityVersion; cur != nil && *p.SecurityVersion < *cur {
			return m.updateError(name, "SecurityVersion", "update manifest tries to downgrade SecurityVersion of the original manifest")
		}
	}
	return nil
}

func (m *Manifest) updateError(name, field, format string, args ...any) *ValidationError {
	e := invalid(sectionPackages, name, field, format, args...)
	e.stage = stageCheckUpdate
	return e
}

// UpdateManifestUsers returns the sorted names of the users allowed to update
// the whole manifest: a user counts if any of their roles has ResourceType
// "Manifest" and any action equal to "UpdateManifest" (case-insensitive).
// (MarbleRun looks only at each role's first action.)
func (m *Manifest) UpdateManifestUsers() []string {
	if m == nil {
		return nil
	}
	var users []string
	for _, name := range sorted(m.Users) {
		if slices.ContainsFunc(m.Users[name].Roles, m.grantsUpdateManifest) {
			users = append(users, name)
		}
	}
	return users
}

func (m *Manifest) grantsUpdateManifest(roleName string) bool {
	role, ok := m.Roles[roleName]
	if !ok || role.ResourceType != ResourceManifest {
		return false
	}
	return slices.ContainsFunc(role.Actions, func(a string) bool {
		return strings.EqualFold(a, ActionUpdateManifest)
	})
}

// FeatureEnabled reports whether Config.FeatureGates lists gate, compared
// case-insensitively.
func (m *Manifest) FeatureEnabled(gate string) bool {
	if m == nil {
		return false
	}
	return slices.ContainsFunc(m.Config.FeatureGates, func(g string) bool {
		return strings.EqualFold(g, gate)
	})
}

// RecoveryKeysChanged reports whether a full update from oldM to newM changes
// the recovery setup, so that new recovery secrets must be issued: the number
// of keys differs, the thresholds are not equivalent (0 means all keys), or a
// key name or key differs. Keys are compared by the bytes of their first PEM
// block, so a reformatted PEM of the same key is no change. A nil manifest
// has no recovery keys.
func RecoveryKeysChanged(oldM, newM *Manifest) bool {
	var oldKeys, newKeys map[string]string
	var oldT, newT uint
	if oldM != nil {
		oldKeys, oldT = oldM.RecoveryKeys, oldM.Config.RecoveryThreshold
	}
	if newM != nil {
		newKeys, newT = newM.RecoveryKeys, newM.Config.RecoveryThreshold
	}
	if len(oldKeys) != len(newKeys) {
		return true
	}
	if effectiveThreshold(oldT, len(oldKeys)) != effectiveThreshold(newT, len(newKeys)) {
		return true
	}
	for name, oldKey := range oldKeys {
		newKey, ok := newKeys[name]
		if !ok || keyIdentity(oldKey) != keyIdentity(newKey) {
			return true
		}
	}
	return false
}

// effectiveThreshold resolves a recovery threshold of 0 to the key count.
func effectiveThreshold(t uint, keys int) uint64 {
	if t == 0 {
		return uint64(keys)
	}
	return uint64(t)
}

// keyIdentity returns the type and bytes of the first PEM block, or the text
// itself when it holds no PEM block.
func keyIdentity(text string) string {
	if block, _ := pem.Decode([]byte(text)); block != nil {
		return "pem:" + block.Type + "\x00" + string(block.Bytes)
	}
	return "text:" + text
}
