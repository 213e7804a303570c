// Package manifest models a Coordinator deployment manifest: its sections and
// fields (MarbleRun-compatible JSON), parsing from the exact uploaded bytes,
// validation that names the offending section and field, and the Files and
// Env templates delivered to Marbles.
//
// Parse and Validate accept what MarbleRun's Coordinator accepts and report
// the same messages, except where MarbleRun has a defect or no limit (the
// user-facing list is docs/manifest-validation.md):
//   - a JSON object that names a member twice is refused at any depth,
//     including two spellings of one struct field ("Packages", "packages");
//   - entry names must be non-empty UTF-8 of at most MaxNameLength bytes
//     without control characters;
//   - SignerID and UniqueID must be 64 hex digits, ProductID and
//     SecurityVersion at most 65535, AcceptedTCBStatuses DCAP's names;
//   - templates may name only secrets and fields that exist;
//   - packages that no Marble references are validated too;
//   - user certificates are compared by DER, not by PEM text;
//   - an unknown role resource type is named, not printed as a struct;
//   - UpdateManifest holders are counted by any action, not the first;
//   - secret sizes are bounded (cert-rsa at most MaxRSASecretSize bits,
//     symmetric-key at most MaxSymmetricSecretSize bits, recovery keys at most
//     MaxRecoveryKeySize bits), and user-defined secrets are size-checked;
//   - the AzureHSMSealing feature gate is rejected as unsupported;
//   - secret generation, recovery key and user certificate errors and the
//     template dry run are found by Validate, before anything is stored;
//   - a File value of JSON null is an error;
//   - templates run within limits on nesting, template calls, work, value
//     and output sizes, and rendered Env values must not contain NUL.
package manifest

import (
	"crypto/x509"
)

// Manifest is a whole deployment manifest. Field names are the JSON names;
// decoding is case-insensitive and ignores unknown members, as MarbleRun's is.
type Manifest struct {
	Packages        map[string]Package        `json:",omitempty"`
	Infrastructures map[string]Infrastructure `json:",omitempty"`
	Marbles         map[string]Marble         `json:",omitempty"`
	Secrets         map[string]Secret         `json:",omitempty"`
	Users           map[string]User           `json:",omitempty"`
	Roles           map[string]Role           `json:",omitempty"`
	RecoveryKeys    map[string]string         `json:",omitempty"`
	TLS             map[string]TLSTag         `json:",omitempty"`
	Config          Config
}

// Package describes the enclave properties a Marble's quote must satisfy.
type Package struct {
	Debug               bool
	UniqueID            string   `json:",omitempty"`
	SignerID            string   `json:",omitempty"`
	ProductID           *uint64  `json:",omitempty"`
	SecurityVersion     *uint    `json:",omitempty"`
	AcceptedTCBStatuses []string `json:",omitempty"`
	AcceptedAdvisories  []string `json:",omitempty"`
	// TDXMeasurements make the package describe a TDX guest (tdx.go).
	TDXMeasurements
}

// Infrastructure holds infrastructure properties. They are stored but, as in
// MarbleRun, not evaluated.
type Infrastructure struct {
	CPUSVN []byte  `json:",omitempty"`
	QESVN  *uint16 `json:",omitempty"`
	PCESVN *uint16 `json:",omitempty"`
	RootCA []byte  `json:",omitempty"`
}

// Marble is an allowed service: its package and its parameters.
type Marble struct {
	Package              string
	MaxActivations       uint
	Parameters           Parameters
	TLS                  []string `json:",omitempty"`
	DisableSecretBinding bool     `json:",omitempty"`
}

// Parameters are delivered to a Marble at activation.
type Parameters struct {
	Files map[string]File `json:",omitempty"`
	Env   map[string]File `json:",omitempty"`
	Argv  []string        `json:",omitempty"`
}

// File is a file or environment value. In JSON it is either a plain string or
// an object {"Data","Encoding","NoTemplates"}; Data holds the decoded content.
type File struct {
	Data        string
	Encoding    string
	NoTemplates bool
}

// Secret types.
const (
	SecretTypeCertECDSA   = "cert-ecdsa"
	SecretTypeCertED25519 = "cert-ed25519"
	SecretTypeCertRSA     = "cert-rsa"
	SecretTypeSymmetric   = "symmetric-key"
	SecretTypePlain       = "plain"
)

// Secret is a secret definition. Cert is an x509 template (Go's
// x509.Certificate JSON shape) applied when the certificate is generated.
type Secret struct {
	Type        string
	Size        uint             `json:",omitempty"`
	Shared      bool             `json:",omitempty"`
	UserDefined bool             `json:",omitempty"`
	Cert        x509.Certificate `json:",omitzero"`
	ValidFor    uint             `json:",omitempty"`
	Private     []byte           `json:",omitempty"`
	Public      []byte           `json:",omitempty"`
}

// User is a manifest user, identified by a PEM certificate.
type User struct {
	Certificate string
	Roles       []string `json:",omitempty"`
}

// Role grants actions on resources of one type.
type Role struct {
	ResourceType  string
	ResourceNames []string `json:",omitempty"`
	Actions       []string
}

// Resource types of a role (compared case-sensitively).
const (
	ResourcePackages = "Packages"
	ResourceSecrets  = "Secrets"
	ResourceManifest = "Manifest"
)

// Actions of a role (compared case-insensitively).
const (
	ActionReadSecret            = "ReadSecret"
	ActionWriteSecret           = "WriteSecret"
	ActionUpdateSecurityVersion = "UpdateSecurityVersion"
	ActionUpdateManifest        = "UpdateManifest"
)

// TLSTag selects which connections of a Marble are elevated to TLS.
type TLSTag struct {
	Outgoing []TLSTagEntry `json:",omitempty"`
	Incoming []TLSTagEntry `json:",omitempty"`
}

// TLSTagEntry is one incoming or outgoing TLS connection.
type TLSTagEntry struct {
	Port              string
	Addr              string `json:",omitempty"`
	Cert              string `json:",omitempty"`
	DisableClientAuth bool   `json:",omitempty"`
}

// Seal modes.
const (
	SealModeDefault    = ""
	SealModeProductKey = "ProductKey"
	SealModeUniqueKey  = "UniqueKey"
	SealModeDisabled   = "Disabled"
)

// Feature gates. Validate accepts only FeatureSignQuoteEndpoint: this
// Coordinator does not implement the other two.
const (
	FeatureSignQuoteEndpoint = "SignQuoteEndpoint"
	FeatureMonotonicCounter  = "MonotonicCounter"
	FeatureAzureHSMSealing   = "AzureHSMSealing"
)

// Config holds deployment-wide settings.
type Config struct {
	SealMode          string   `json:",omitempty"`
	FeatureGates      []string `json:",omitempty"`
	UpdateThreshold   uint     `json:",omitempty"`
	RecoveryThreshold uint     `json:",omitempty"`
	RotateRootSecret  bool     `json:",omitempty"`
}
