// Package secrets turns the secret definitions of a manifest into stored
// secret values: it generates shared symmetric keys and certificates
// (docs/design/behaviour.md#secret-generation,
// docs/design/behaviour.md#secret-certificate-templates), derives per-Marble
// symmetric keys, and checks and applies the values users upload for
// user-defined secrets (docs/design/behaviour.md#user-defined-secrets,
// docs/design/decisions.md#d4).
//
// The package only computes; it neither stores nor logs. Every error names
// the secret it is about (errors.As with *Error); errors caused by a bad
// definition or a bad upload wrap ErrInvalid.
package secrets

import (
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/manifest"
)

// Size limits, in bits (defence in depth: the manifest validation checks
// them too).
const (
	MinRSABits       = 1024
	MaxRSABits       = 8192
	MaxSymmetricBits = 65536
	// MaxPerMarbleSymmetricBits is the most HKDF-SHA256 can derive
	// (255 blocks of 32 bytes).
	MaxPerMarbleSymmetricBits = 255 * 32 * 8
)

// DefaultValidFor is the validity in days of a generated certificate whose
// definition gives neither ValidFor nor Cert.NotAfter. It is written back
// into the stored secret, as MarbleRun does.
const DefaultValidFor = 365

// maxValidFor is the largest ValidFor (days) whose duration fits a
// time.Duration (about 292 years).
const maxValidFor = uint(1<<63-1) / uint(24*time.Hour)

// ErrInvalid means a secret definition or an uploaded value breaks a rule.
// The client caused it (400), never the service.
var ErrInvalid = errors.New("invalid secret")

// Error is the error about one named secret. Its text is complete (it names
// the secret); it unwraps to ErrInvalid when the definition or upload is at
// fault, and to the underlying cause when there is one (for example a
// failing random source).
type Error struct {
	Secret string // the secret's name in the manifest
	msg    string
	kind   error // ErrInvalid, or nil for a failure of the service
	cause  error
}

func (e *Error) Error() string { return e.msg }

// Unwrap returns ErrInvalid (for invalid input) and the cause, if any.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

var _ error = (*Error)(nil)

// invalidf reports invalid input about secret name.
func invalidf(name, format string, args ...any) error {
	return &Error{Secret: name, msg: fmt.Sprintf(format, args...), kind: ErrInvalid}
}

// invalidCause reports invalid input about secret name caused by err; the
// message is format ": " err.
func invalidCause(name string, err error, format string, args ...any) error {
	return &Error{Secret: name, msg: fmt.Sprintf(format, args...) + ": " + err.Error(), kind: ErrInvalid, cause: err}
}

// failed reports a failure of the service while producing secret name.
func failed(name string, err error) error {
	return &Error{Secret: name, msg: fmt.Sprintf("generating secret %s: %v", name, err), cause: err}
}

// Secret is the stored value of one secret. It is persisted as JSON inside
// the sealed state: the field names are part of that format.
//
// Which fields hold values (docs/design/behaviour.md#secret-values):
//   - symmetric-key and plain: Private and Public both hold the key or data;
//     Cert is nil.
//   - cert-*: Cert is the DER certificate, Private the PKCS#8 key (for an
//     upload: as uploaded, possibly nil), Public the PKIX public key.
//   - a definition without a value (user-defined not yet uploaded, or a
//     per-Marble secret whose values are made at activation): all three nil.
//
// A nil slice means "no value"; an empty non-nil slice is a value (an
// uploaded empty plain secret). JSON keeps the difference (null versus "").
type Secret struct {
	Type        string
	Size        uint
	Shared      bool
	UserDefined bool
	// ValidFor is the certificate validity in days. For a generated
	// certificate without Cert.NotAfter in its definition, 0 is replaced
	// by DefaultValidFor.
	ValidFor uint
	// NotAfter is the definition's explicit Cert.NotAfter (zero when the
	// validity comes from ValidFor). With the manifest's template it is what
	// a later regeneration of the certificate needs.
	NotAfter time.Time `json:",omitzero"`
	Cert     []byte
	Private  []byte
	Public   []byte
}

// IsSet reports whether the secret holds a value (generated, derived or
// uploaded), as opposed to a bare definition.
func (s Secret) IsSet() bool {
	return s.Cert != nil || s.Private != nil || s.Public != nil
}

// definition returns the value-less stored form of def.
func definition(def manifest.Secret) Secret {
	return Secret{
		Type:        def.Type,
		Size:        def.Size,
		Shared:      def.Shared,
		UserDefined: def.UserDefined,
		ValidFor:    def.ValidFor,
		NotAfter:    def.Cert.NotAfter,
	}
}

func isCertType(t string) bool {
	switch t {
	case manifest.SecretTypeCertECDSA, manifest.SecretTypeCertRSA, manifest.SecretTypeCertED25519:
		return true
	}
	return false
}

// checkType reports an unknown secret type (MarbleRun's text).
func checkType(name string, def manifest.Secret) error {
	switch def.Type {
	case manifest.SecretTypeCertECDSA, manifest.SecretTypeCertRSA, manifest.SecretTypeCertED25519,
		manifest.SecretTypeSymmetric, manifest.SecretTypePlain:
		return nil
	}
	return invalidf(name, "unknown type: %s for secret: %s", def.Type, name)
}

// checkSymmetricSize checks a symmetric-key size: > 0, a multiple of 8 and
// at most MaxSymmetricBits (MaxPerMarbleSymmetricBits for a derived key).
func checkSymmetricSize(name string, size uint, derived bool) error {
	if size == 0 || size%8 != 0 {
		return invalidf(name, "invalid secret size: %s", name)
	}
	if size > MaxSymmetricBits {
		return invalidf(name, "invalid secret size: %s: %d bits is more than the maximum of %d", name, size, MaxSymmetricBits)
	}
	if derived && size > MaxPerMarbleSymmetricBits {
		return invalidf(name, "invalid secret size: %s: a per-Marble key is derived with HKDF-SHA256 and has at most %d bits, not %d", name, MaxPerMarbleSymmetricBits, size)
	}
	return nil
}

// checkGenerated checks a definition whose value the Coordinator makes
// (shared or per-Marble, not user-defined): type, size and validity.
func checkGenerated(name string, def manifest.Secret) error {
	if err := checkType(name, def); err != nil {
		return err
	}
	switch def.Type {
	case manifest.SecretTypePlain:
		return invalidf(name, "secret %s is invalid: unsupported secret of type plain (a plain secret must be user-defined)", name)
	case manifest.SecretTypeSymmetric:
		return checkSymmetricSize(name, def.Size, !def.Shared)
	case manifest.SecretTypeCertECDSA:
		if _, ok := curveForSize(def.Size); !ok {
			return invalidf(name, "invalid secret size for cert-ecdsa secret %s: unsupported size %d: does not map to a supported curve", name, def.Size)
		}
	case manifest.SecretTypeCertRSA:
		if def.Size < MinRSABits || def.Size > MaxRSABits {
			return invalidf(name, "invalid secret size for cert-rsa secret %s: %d bits, must be between %d and %d", name, def.Size, MinRSABits, MaxRSABits)
		}
	case manifest.SecretTypeCertED25519:
		if def.Size != 0 {
			return invalidf(name, "invalid secret size for cert-ed25519 secret %s: none is expected, got: %d", name, def.Size)
		}
	}
	if !def.Cert.NotAfter.IsZero() && def.ValidFor != 0 {
		return invalidf(name, "ambiguous certificate validity duration for secret: %s, both NotAfter and ValidFor are specified", name)
	}
	if def.ValidFor > maxValidFor {
		return invalidf(name, "invalid validity for secret %s: ValidFor %d days is more than the maximum of %d", name, def.ValidFor, maxValidFor)
	}
	return nil
}
