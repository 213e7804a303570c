package manifest

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Secret size limits. MarbleRun accepts any RSA size of at least 1024 bits
// and any symmetric key size; a manifest could make the Coordinator search
// for primes for hours or allocate gigabytes. These bounds are decisions of
// this Coordinator: 8192-bit RSA is the largest size in common use, and 8 KiB
// is far more key material than any symmetric algorithm takes.
const (
	MaxRSASecretSize       = 8192  // bits, cert-rsa
	MaxSymmetricSecretSize = 65536 // bits, symmetric-key
	// MaxRecoveryKeySize bounds the RSA recovery keys: the Coordinator
	// encrypts with them, which takes time quadratic in their size.
	MaxRecoveryKeySize = 16384 // bits
)

// minRSASize is Go's minimum (crypto/rsa refuses smaller keys).
const minRSASize = 1024

// MaxNameLength bounds the names of packages, infrastructures, marbles,
// secrets, users, roles, recovery keys and TLS tags, in bytes. Names must
// also be non-empty, valid UTF-8 and free of control characters: they appear
// in certificates, logs, store keys, URLs and error messages.
const MaxNameLength = 256

// maxSGXField is the largest ISVPRODID and ISVSVN: both are 16-bit fields of
// the SGX report.
const maxSGXField = 1<<16 - 1

// idHexDigits is the length of a SignerID (MRSIGNER) or UniqueID (MRENCLAVE)
// in hexadecimal: both are 32-byte SHA-256 digests.
const idHexDigits = 64

// tcbStatuses are the DCAP TCB statuses a package may accept, in the order
// messages list them. "Unknown" is not among them: a quote whose status is
// unknown is never accepted.
var tcbStatuses = []string{
	"UpToDate", "SWHardeningNeeded", "ConfigurationNeeded", "ConfigurationAndSWHardeningNeeded",
	"OutOfDate", "OutOfDateConfigurationNeeded", "Revoked",
}

// ValidationError reports the first rule a manifest breaks. Section is the
// top-level section ("Packages", "Infrastructures", "Marbles", "Secrets",
// "Users", "Roles", "RecoveryKeys", "TLS" or "Config"), Name the entry's key
// ("" for Config and for a missing section), Field the offending field (for
// example "SignerID", "Incoming[0].Port" or "Parameters.Files./etc/app.conf";
// "" when the entry's name itself is invalid) and Message the
// MarbleRun-compatible text, without a prefix.
type ValidationError struct {
	Section string
	Name    string
	Field   string
	Message string

	stage string
}

// Error returns Message.
func (e *ValidationError) Error() string { return e.Message }

// Unwrap returns ErrInvalid.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// Stage names the MarbleRun step that reports this error, which MarbleRun
// puts in front of Message: "checking manifest" (the structural rules),
// "generating secrets from manifest" or "generating placeholder secrets from
// manifest" (secret types and sizes), "generating recovery encryption key",
// "generating users from manifest", "running manifest template dry run", or
// "checking update manifest" (ValidatePackageUpdate).
func (e *ValidationError) Stage() string {
	if e.stage == "" {
		return stageCheck
	}
	return e.stage
}

const (
	stageCheck           = "checking manifest"
	stageSharedSecrets   = "generating secrets from manifest"
	stageMarbleSecrets   = "generating placeholder secrets from manifest"
	stageRecoveryKeys    = "generating recovery encryption key"
	stageUsers           = "generating users from manifest"
	stageTemplateDryRun  = "running manifest template dry run"
	stageCheckUpdate     = "checking update manifest"
	sectionPackages      = "Packages"
	sectionInfras        = "Infrastructures"
	sectionMarbles       = "Marbles"
	sectionSecrets       = "Secrets"
	sectionUsers         = "Users"
	sectionRoles         = "Roles"
	sectionRecoveryKeys  = "RecoveryKeys"
	sectionTLS           = "TLS"
	sectionConfig        = "Config"
	azureHSMNotSupported = "sealing with an Azure HSM key is not supported by this Coordinator"
)

func invalid(section, name, field, format string, args ...any) *ValidationError {
	return &ValidationError{Section: section, Name: name, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Validate checks the manifest and returns a *ValidationError for the first
// rule it breaks, or nil. The rules run in MarbleRun's order, and map entries
// in sorted key order, so a manifest always reports the same error:
//
//  1. structure (MarbleRun's Check): packages, marbles, TLS tags, users,
//     roles, secret types and validity, thresholds, seal mode, feature gates;
//  2. secret types and sizes, shared secrets first (MarbleRun finds these when
//     generating the secrets);
//  3. recovery keys: PEM "PUBLIC KEY" holding an RSA key;
//  4. user certificates: the first PEM block is an X.509 certificate;
//  5. a template dry run of every Marble's Files and Env with dummy secrets.
//
// Unlike MarbleRun, Validate also checks packages no Marble references,
// compares user certificates by their DER bytes, names the role's resource
// type instead of printing the role, bounds secret and recovery key sizes,
// rejects the AzureHSMSealing gate, and checks the
// sizes of user-defined secrets (a user-defined symmetric key needs a valid
// size; a user-defined certificate may leave Size at 0). It refuses values
// that can never be right (docs/manifest-validation.md): entry names that are
// empty, longer than MaxNameLength bytes, not UTF-8 or hold control
// characters (checked after rules 1 and 2); SignerID and UniqueID that are
// not 64 hex digits, ProductID and SecurityVersion above 65535, and unknown
// AcceptedTCBStatuses (checked after rules 4 and 5); and templates that name
// a secret the manifest does not define or a field the template data lacks
// (rule 31).
func (m *Manifest) Validate() error {
	if m == nil {
		m = &Manifest{}
	}
	checks := []func() *ValidationError{
		m.checkSections,
		m.checkNames,
		m.checkMarblePackages,
		m.checkPackages,
		m.checkTDXPackages,
		m.checkPackageValues,
		m.checkMarbleTLS,
		m.checkTLSIncoming,
		m.checkTLSOutgoing,
		m.checkUserFields,
		m.checkUserRoles,
		m.checkDuplicateUsers,
		m.checkRoles,
		m.checkSecretTypes,
		m.checkSecretValidity,
		m.checkUpdateThreshold,
		m.checkSealMode,
		m.checkFeatureGates,
		m.checkRecoveryThreshold,
		m.checkSecretSizes,
		m.checkRecoveryKeys,
		m.checkUserCertificates,
		m.checkTemplates,
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// sorted returns the keys of a map in order.
func sorted[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// Rules 1 and 2.
func (m *Manifest) checkSections() *ValidationError {
	if len(m.Packages) == 0 {
		return invalid(sectionPackages, "", "", "no allowed packages defined")
	}
	if len(m.Marbles) == 0 {
		return invalid(sectionMarbles, "", "", "no allowed marbles defined")
	}
	return nil
}

// checkNames refuses entry names that are empty, too long, not UTF-8 or
// hold a control character (an addition to MarbleRun's rules).
func (m *Manifest) checkNames() *ValidationError {
	sections := []struct {
		section, kind string
		names         []string
	}{
		{sectionPackages, "package", sorted(m.Packages)},
		{sectionInfras, "infrastructure", sorted(m.Infrastructures)},
		{sectionMarbles, "marble", sorted(m.Marbles)},
		{sectionSecrets, "secret", sorted(m.Secrets)},
		{sectionUsers, "user", sorted(m.Users)},
		{sectionRoles, "role", sorted(m.Roles)},
		{sectionRecoveryKeys, "recovery key", sorted(m.RecoveryKeys)},
		{sectionTLS, "TLS tag", sorted(m.TLS)},
	}
	for _, sec := range sections {
		for _, name := range sec.names {
			if problem := nameProblem(name); problem != "" {
				return invalid(sec.section, name, "", "invalid %s name %s: %s", sec.kind, quoteClipped(name), problem)
			}
		}
	}
	return nil
}

// nameProblem returns what is wrong with an entry name, or "".
func nameProblem(name string) string {
	switch {
	case name == "":
		return "empty"
	case len(name) > MaxNameLength:
		return fmt.Sprintf("%d bytes, more than %d", len(name), MaxNameLength)
	case !utf8.ValidString(name):
		return "not valid UTF-8"
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Sprintf("contains the control character %U", r)
		}
	}
	return ""
}

// Rule 3.
func (m *Manifest) checkMarblePackages() *ValidationError {
	for _, name := range sorted(m.Marbles) {
		pkg := m.Marbles[name].Package
		if _, ok := m.Packages[pkg]; !ok {
			return invalid(sectionMarbles, name, "Package", "manifest does not contain marble package %s", pkg)
		}
	}
	return nil
}

// Rules 4 and 5, for every package (MarbleRun checks only referenced ones).
func (m *Manifest) checkPackages() *ValidationError {
	for _, name := range sorted(m.Packages) {
		p := m.Packages[name]
		if p.Debug || p.IsTDX() {
			continue
		}
		if p.UniqueID != "" {
			if p.SignerID != "" || p.ProductID != nil || p.SecurityVersion != nil {
				return invalid(sectionPackages, name, "UniqueID", "manifest specifies both UniqueID *and* SignerID/ProductID/SecurityVersion in package %s", name)
			}
			continue
		}
		var missing string
		switch {
		case p.SignerID == "":
			missing = "SignerID"
		case p.ProductID == nil:
			missing = "ProductID"
		case p.SecurityVersion == nil:
			missing = "SecurityVersion"
		default:
			continue
		}
		return invalid(sectionPackages, name, missing, "manifest misses value for %s in package %s", missing, name)
	}
	return nil
}

// checkPackageValues refuses package values that no enclave can match (an
// addition to MarbleRun's rules, which compare them only at activation):
// IDs that are not 32 bytes of hex (either case, as they are compared
// case-insensitively), ProductID and SecurityVersion beyond the 16 bits of
// the SGX report, and TCB statuses that DCAP never reports. Debug packages
// are checked too.
func (m *Manifest) checkPackageValues() *ValidationError {
	for _, name := range sorted(m.Packages) {
		p := m.Packages[name]
		for _, id := range []struct{ field, value string }{{"UniqueID", p.UniqueID}, {"SignerID", p.SignerID}} {
			if id.value != "" && !isHexID(id.value) {
				return invalid(sectionPackages, name, id.field, "invalid %s in package %s: want %d hexadecimal digits (32 bytes), got %s",
					id.field, name, idHexDigits, quoteClipped(id.value))
			}
		}
		if p.ProductID != nil && *p.ProductID > maxSGXField {
			return invalid(sectionPackages, name, "ProductID", "invalid ProductID in package %s: %d is outside the SGX range 0 to %d", name, *p.ProductID, maxSGXField)
		}
		if p.SecurityVersion != nil && uint64(*p.SecurityVersion) > maxSGXField {
			return invalid(sectionPackages, name, "SecurityVersion", "invalid SecurityVersion in package %s: %d is outside the SGX range 0 to %d", name, *p.SecurityVersion, maxSGXField)
		}
		for _, status := range p.AcceptedTCBStatuses {
			if !p.acceptedStatusKnown(status) {
				return invalid(sectionPackages, name, "AcceptedTCBStatuses", "unknown TCB status %s in AcceptedTCBStatuses of package %s: want one of %s",
					quoteClipped(status), name, strings.Join(tcbStatuses, ", "))
			}
		}
	}
	return nil
}

// isHexID reports whether s is idHexDigits hexadecimal digits.
func isHexID(s string) bool {
	if len(s) != idHexDigits {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// Rule 6.
func (m *Manifest) checkMarbleTLS() *ValidationError {
	for _, name := range sorted(m.Marbles) {
		for _, tag := range m.Marbles[name].TLS {
			if _, ok := m.TLS[tag]; !ok {
				return invalid(sectionMarbles, name, "TLS", "manifest misses TLS entry for %s", tag)
			}
		}
	}
	return nil
}

// Rules 7 to 10.
func (m *Manifest) checkTLSIncoming() *ValidationError {
	for _, tag := range sorted(m.TLS) {
		for i, e := range m.TLS[tag].Incoming {
			field := fmt.Sprintf("Incoming[%d].", i)
			if e.Port == "" {
				return invalid(sectionTLS, tag, field+"Port", "manifest misses Port in TLS.Incoming.%s", tag)
			}
			if e.Cert != "" {
				if _, ok := m.Secrets[e.Cert]; !ok {
					return invalid(sectionTLS, tag, field+"Cert", "TLS.Incoming.%s references undefined secret %s", tag, e.Cert)
				}
				if !e.DisableClientAuth {
					return invalid(sectionTLS, tag, field+"DisableClientAuth", "TLS.Incoming.%s defines Cert but does not disable client authentication", tag)
				}
			} else if e.DisableClientAuth {
				return invalid(sectionTLS, tag, field+"Cert", "TLS.Incoming.%s disables client authentication", tag)
			}
		}
	}
	return nil
}

// Rule 11.
func (m *Manifest) checkTLSOutgoing() *ValidationError {
	for _, tag := range sorted(m.TLS) {
		for i, e := range m.TLS[tag].Outgoing {
			field := fmt.Sprintf("Outgoing[%d].", i)
			if e.Addr == "" {
				return invalid(sectionTLS, tag, field+"Addr", "manifest misses Addr in TLS.Outgoing.%s", tag)
			}
			if e.Port == "" {
				return invalid(sectionTLS, tag, field+"Port", "manifest misses Port in TLS.Outgoing.%s", tag)
			}
		}
	}
	return nil
}

// Rule 12.
func (m *Manifest) checkUserFields() *ValidationError {
	for _, name := range sorted(m.Users) {
		if m.Users[name].Certificate == "" {
			return invalid(sectionUsers, name, "Certificate", "manifest does not contain a certificate for user %s", name)
		}
	}
	return nil
}

// Rule 13.
func (m *Manifest) checkUserRoles() *ValidationError {
	for _, name := range sorted(m.Users) {
		for _, role := range m.Users[name].Roles {
			if _, ok := m.Roles[role]; !ok {
				return invalid(sectionUsers, name, "Roles", "manifest specifies role %s for user %s, but role does not exist", role, name)
			}
		}
	}
	return nil
}

// Rule 14, comparing DER (MarbleRun compares the PEM text).
func (m *Manifest) checkDuplicateUsers() *ValidationError {
	seen := make(map[string]string, len(m.Users))
	for _, name := range sorted(m.Users) {
		key := certIdentity(m.Users[name].Certificate)
		if first, ok := seen[key]; ok {
			return invalid(sectionUsers, name, "Certificate", "manifest contains the same certificate for users %s and %s", first, name)
		}
		seen[key] = name
	}
	return nil
}

// certIdentity returns the DER bytes of the first PEM block, or the text
// itself when it holds no PEM block.
func certIdentity(text string) string {
	if block, _ := pem.Decode([]byte(text)); block != nil {
		return "der:" + string(block.Bytes)
	}
	return "text:" + text
}

// Rules 15 to 20.
func (m *Manifest) checkRoles() *ValidationError {
	for _, name := range sorted(m.Roles) {
		role := m.Roles[name]
		switch role.ResourceType {
		case ResourcePackages:
			for _, res := range role.ResourceNames {
				if _, ok := m.Packages[res]; !ok {
					return invalid(sectionRoles, name, "ResourceNames", "role %s: resource %s of type Packages is not defined in manifest", name, res)
				}
			}
			for _, action := range role.Actions {
				if !strings.EqualFold(action, ActionUpdateSecurityVersion) {
					return invalid(sectionRoles, name, "Actions", "unknown action: %s for type Packages in role: %s", action, name)
				}
			}
		case ResourceSecrets:
			for _, action := range role.Actions {
				if !strings.EqualFold(action, ActionReadSecret) && !strings.EqualFold(action, ActionWriteSecret) {
					return invalid(sectionRoles, name, "Actions", "unknown action: %s for type Secrets in role: %s", action, name)
				}
			}
			for _, res := range role.ResourceNames {
				secret, ok := m.Secrets[res]
				if !ok {
					return invalid(sectionRoles, name, "ResourceNames", "role %s: resource %s of type Secrets is not defined in manifest", name, res)
				}
				for _, action := range role.Actions {
					if strings.EqualFold(action, ActionWriteSecret) && !secret.UserDefined {
						return invalid(sectionRoles, name, "Actions", "manifest specifies write permission for role %s and secret %s, but secret is not user-defined", name, res)
					}
					if strings.EqualFold(action, ActionReadSecret) && !secret.Shared && !secret.UserDefined {
						return invalid(sectionRoles, name, "Actions", "manifest specifies read permission for role %s and per-marble-unique secret %s", name, res)
					}
				}
			}
		case ResourceManifest:
			if len(role.ResourceNames) > 0 {
				return invalid(sectionRoles, name, "ResourceNames", "role %s: resource names are not allowed for type Manifest", name)
			}
			for _, action := range role.Actions {
				if !strings.EqualFold(action, ActionUpdateManifest) {
					return invalid(sectionRoles, name, "Actions", "unknown action: %s for type Manifest in role: %s", action, name)
				}
			}
		default:
			return invalid(sectionRoles, name, "ResourceType", "unrecognized resource type: %s for role: %s", role.ResourceType, name)
		}
	}
	return nil
}

func isCertType(t string) bool {
	return t == SecretTypeCertECDSA || t == SecretTypeCertED25519 || t == SecretTypeCertRSA
}

// Rule 21.
func (m *Manifest) checkSecretTypes() *ValidationError {
	for _, name := range sorted(m.Secrets) {
		switch t := m.Secrets[name].Type; t {
		case SecretTypeCertECDSA, SecretTypeCertED25519, SecretTypeCertRSA, SecretTypeSymmetric, SecretTypePlain:
		default:
			return invalid(sectionSecrets, name, "Type", "unknown type: %s for secret: %s", t, name)
		}
	}
	return nil
}

// Rule 22.
func (m *Manifest) checkSecretValidity() *ValidationError {
	for _, name := range sorted(m.Secrets) {
		s := m.Secrets[name]
		if isCertType(s.Type) && !s.Cert.NotAfter.IsZero() && s.ValidFor != 0 {
			return invalid(sectionSecrets, name, "ValidFor", "ambiguous certificate validity duration for secret: %s, both NotAfter and ValidFor are specified", name)
		}
	}
	return nil
}

// Rule 23, counting users as UpdateManifestUsers does.
func (m *Manifest) checkUpdateThreshold() *ValidationError {
	n := len(m.UpdateManifestUsers())
	if t := m.Config.UpdateThreshold; uint64(t) > uint64(n) {
		return invalid(sectionConfig, "", "UpdateThreshold", "not enough users with manifest update permissions (%d) to meet the threshold of %d", n, t)
	}
	return nil
}

// Rule 24.
func (m *Manifest) checkSealMode() *ValidationError {
	switch mode := m.Config.SealMode; mode {
	case SealModeDefault, SealModeProductKey, SealModeUniqueKey, SealModeDisabled:
		return nil
	default:
		return invalid(sectionConfig, "", "SealMode", "unknown seal mode: %s", mode)
	}
}

// Rule 25. SignQuoteEndpoint and MonotonicCounter are accepted.
// AzureHSMSealing is a known MarbleRun gate that this Coordinator does not
// implement, so it is rejected rather than accepted and ignored.
func (m *Manifest) checkFeatureGates() *ValidationError {
	for _, gate := range m.Config.FeatureGates {
		switch {
		case strings.EqualFold(gate, FeatureSignQuoteEndpoint), strings.EqualFold(gate, FeatureMonotonicCounter):
		case strings.EqualFold(gate, FeatureAzureHSMSealing):
			return invalid(sectionConfig, "", "FeatureGates", "unsupported feature gate: %s: %s", gate, azureHSMNotSupported)
		default:
			return invalid(sectionConfig, "", "FeatureGates", "unknown feature gate: %s", gate)
		}
	}
	return nil
}

// Rules 26 and 27.
func (m *Manifest) checkRecoveryThreshold() *ValidationError {
	t, n := m.Config.RecoveryThreshold, len(m.RecoveryKeys)
	if uint64(t) > uint64(n) {
		return invalid(sectionConfig, "", "RecoveryThreshold", "not enough recovery keys (%d) defined to meet the recovery threshold of %d", n, t)
	}
	if t == 1 {
		return invalid(sectionConfig, "", "RecoveryThreshold", "invalid recovery threshold: if set, threshold must be at least 2")
	}
	return nil
}

// Rule 28: what secret generation would reject, shared secrets first, then
// per-Marble ones, then (an addition) user-defined ones.
func (m *Manifest) checkSecretSizes() *ValidationError {
	names := sorted(m.Secrets)
	passes := []struct {
		stage  string
		filter func(Secret) bool
	}{
		{stageSharedSecrets, func(s Secret) bool { return !s.UserDefined && s.Shared }},
		{stageMarbleSecrets, func(s Secret) bool { return !s.UserDefined && !s.Shared }},
		{stageCheck, func(s Secret) bool { return s.UserDefined }},
	}
	for _, pass := range passes {
		for _, name := range names {
			s := m.Secrets[name]
			if !pass.filter(s) {
				continue
			}
			if err := checkSecretSize(name, s); err != nil {
				err.stage = pass.stage
				return err
			}
		}
	}
	return nil
}

// checkSecretSize checks one secret's Size against its Type. A user-defined
// certificate may leave Size at 0: any key size is then accepted on upload.
func checkSecretSize(name string, s Secret) *ValidationError {
	switch s.Type {
	case SecretTypeSymmetric:
		if s.Size == 0 || s.Size%8 != 0 {
			return invalid(sectionSecrets, name, "Size", "invalid secret size: %s", name)
		}
		if s.Size > MaxSymmetricSecretSize {
			return invalid(sectionSecrets, name, "Size", "invalid secret size for symmetric-key secret %s: %d bits exceed the maximum of %d", name, s.Size, MaxSymmetricSecretSize)
		}
	case SecretTypeCertECDSA:
		switch s.Size {
		case 224, 256, 384, 521:
		default:
			if s.Size != 0 || !s.UserDefined {
				return invalid(sectionSecrets, name, "Size", "invalid secret size for cert-ecdsa secret %s: unsupported size %d: does not map to a supported curve", name, s.Size)
			}
		}
	case SecretTypeCertED25519:
		if s.Size != 0 {
			return invalid(sectionSecrets, name, "Size", "invalid secret size for cert-ed25519 secret %s: none is expected, got: %d", name, s.Size)
		}
	case SecretTypeCertRSA:
		if s.Size == 0 && s.UserDefined {
			return nil
		}
		if s.Size < minRSASize {
			return invalid(sectionSecrets, name, "Size", "crypto/rsa: %d-bit keys are insecure (see https://go.dev/pkg/crypto/rsa#hdr-Minimum_key_size)", s.Size)
		}
		if s.Size > MaxRSASecretSize {
			return invalid(sectionSecrets, name, "Size", "invalid secret size for cert-rsa secret %s: %d-bit keys exceed the maximum of %d", name, s.Size, MaxRSASecretSize)
		}
	case SecretTypePlain:
		if !s.UserDefined {
			return invalid(sectionSecrets, name, "UserDefined", "secret %s is invalid: unsupported secret of type plain", name)
		}
	}
	return nil
}

// Rule 29.
func (m *Manifest) checkRecoveryKeys() *ValidationError {
	for _, name := range sorted(m.RecoveryKeys) {
		if msg := checkRecoveryKey(m.RecoveryKeys[name]); msg != "" {
			err := invalid(sectionRecoveryKeys, name, "", "%s", msg)
			err.stage = stageRecoveryKeys
			return err
		}
	}
	return nil
}

// checkRecoveryKey returns why a recovery key PEM is unusable, or "".
func checkRecoveryKey(text string) string {
	block, _ := pem.Decode([]byte(text))
	if block == nil || block.Type != "PUBLIC KEY" {
		return "given PEM data is not a public key"
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return err.Error()
	}
	key, ok := pub.(*rsa.PublicKey)
	if !ok {
		return "unsupported type of public key"
	}
	switch bits := key.N.BitLen(); {
	case bits < minRSASize:
		return fmt.Sprintf("crypto/rsa: %d-bit keys are insecure (see https://go.dev/pkg/crypto/rsa#hdr-Minimum_key_size)", bits)
	case bits > MaxRecoveryKeySize:
		return fmt.Sprintf("recovery key of %d bits exceeds the maximum of %d", bits, MaxRecoveryKeySize)
	}
	return ""
}

// Rule 30.
func (m *Manifest) checkUserCertificates() *ValidationError {
	for _, name := range sorted(m.Users) {
		if _, err := ParseUserCertificate(m.Users[name].Certificate); err != nil {
			e := invalid(sectionUsers, name, "Certificate", "received invalid certificate for user %s", name)
			e.stage = stageUsers
			return e
		}
	}
	return nil
}

// ParseUserCertificate parses a user's Certificate as MarbleRun does: the
// first PEM block, whatever its type, must hold an X.509 certificate.
// Validity period, issuer and subject are not checked.
func ParseUserCertificate(text string) (*x509.Certificate, error) {
	block, _ := pem.Decode([]byte(text))
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM block in user certificate", ErrInvalid)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return cert, nil
}

// Rule 31: every Marble's Files and Env are rendered with dummy values;
// all Marbles share one execution budget.
func (m *Manifest) checkTemplates() *ValidationError {
	return m.renderAll(m.dryRunData())
}

// DryRun renders every Marble's Files and Env as rule 31 does, except that
// the given values replace the dummies of the secrets they name (the
// Coordinator passes the secrets that have a value, e.g. after an upload).
// The error is a *ValidationError naming the Marble and the field.
func (m *Manifest) DryRun(values map[string]TemplateSecret) error {
	data := m.dryRunData()
	for name, v := range values {
		data.Secrets[name] = v // Previous.Secrets is the same map
	}
	if e := m.renderAll(data); e != nil {
		return e
	}
	return nil
}

// renderAll renders every Marble's Files and Env with data; all Marbles
// share one execution budget. Templates may name only the secrets the
// manifest defines (see checkReferences).
func (m *Manifest) renderAll(data *TemplateData) *ValidationError {
	r := newRenderer(data, newBudget(), false)
	r.defined = func(name string) bool {
		_, ok := m.Secrets[name]
		return ok
	}
	for _, name := range sorted(m.Marbles) {
		params := m.Marbles[name].Parameters
		for _, path := range sorted(params.Files) {
			if _, err := r.file(path, params.Files[path]); err != nil {
				return dryRunError(name, "Parameters.Files."+path, err)
			}
		}
		for _, env := range sorted(params.Env) {
			if _, err := r.env(env, params.Env[env]); err != nil {
				return dryRunError(name, "Parameters.Env."+env, err)
			}
		}
	}
	return nil
}

func dryRunError(marble, field string, err error) *ValidationError {
	e := invalid(sectionMarbles, marble, field, "in Marble %s: %s", marble, err)
	e.stage = stageTemplateDryRun
	return e
}

// dryRunData returns the template data of the dry run. As in MarbleRun,
// user-defined secrets have a dummy Cert, Private and Public (the byte 'A');
// generated secrets have what generation would give them: a symmetric key has
// Private and Public but no Cert. The Coordinator certificates have only a
// Cert, the Marble certificate also its keys. Previous.Secrets is Secrets.
func (m *Manifest) dryRunData() *TemplateData {
	dummy := []byte{'A'}
	secrets := make(map[string]TemplateSecret, len(m.Secrets))
	for name, s := range m.Secrets {
		ts := TemplateSecret{
			Type: s.Type, Size: s.Size, Shared: s.Shared, UserDefined: s.UserDefined, ValidFor: s.ValidFor,
			Cert: dummy, Private: dummy, Public: dummy,
		}
		if !s.UserDefined {
			switch {
			case s.Type == SecretTypeSymmetric:
				ts.Cert = nil
			case isCertType(s.Type) && s.ValidFor == 0 && s.Cert.NotAfter.IsZero():
				ts.ValidFor = 365
			}
		}
		secrets[name] = ts
	}
	certOnly := TemplateSecret{Cert: dummy}
	return &TemplateData{
		MarbleRun: TemplateMarbleRun{
			RootCA:                  certOnly,
			MarbleCert:              TemplateSecret{Cert: dummy, Private: dummy, Public: dummy},
			CoordinatorRoot:         certOnly,
			CoordinatorIntermediate: certOnly,
		},
		Secrets:  secrets,
		Previous: TemplatePrevious{Secrets: secrets},
	}
}
