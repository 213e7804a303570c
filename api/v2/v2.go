// Package v2 defines the /api/v2 Client API wire contract: paths, request
// and response bodies. Byte slices travel as standard base64 with padding.
package v2

// Paths of the /api/v2 generation.
const (
	PathStatus           = "/api/v2/status"
	PathManifest         = "/api/v2/manifest"
	PathQuote            = "/api/v2/quote"
	PathRecover          = "/api/v2/recover"
	PathRecoverKey       = "/api/v2/recover/public-key"
	PathRecoverSecrets   = "/api/v2/recover/secrets"
	PathSecrets          = "/api/v2/secrets"
	PathSignQuote        = "/api/v2/sign-quote"
	PathUpdate           = "/api/v2/update"
	PathUpdateManifest   = "/api/v2/update-manifest"
	PathUpdateCancel     = "/api/v2/update-cancel"
	PathMonotonicCounter = "/api/v2/monotonic-counter"
	// PathUpdateLog is the verifiable update log (docs/update-log.md).
	PathUpdateLog = "/api/v2/update-log"
	// PathOpenAPI serves the OpenAPI 3.1 description of the Client API
	// (api/openapi.yaml) as application/yaml.
	PathOpenAPI = "/api/v2/openapi.yaml"
)

// StatusResponse is the data of GET /api/v2/status. Code and Status carry the
// same state code (docs/design/decisions.md#d2).
type StatusResponse struct {
	Code    int    `json:"code"`
	Status  int    `json:"status"`
	Message string `json:"message"`
}

// ManifestSetRequest is the body of POST /api/v2/manifest.
type ManifestSetRequest struct {
	Manifest []byte `json:"manifest"`
}

// ManifestSetResponse is the data of POST /api/v2/manifest. The member name
// is capitalised, as MarbleRun's clients expect.
type ManifestSetResponse struct {
	RecoverySecrets map[string][]byte `json:"RecoverySecrets"`
}

// ManifestGetResponse is the data of GET /api/v2/manifest.
type ManifestGetResponse struct {
	ManifestSignatureRootECDSA []byte `json:"manifestSignatureRootECDSA"`
	ManifestFingerprint        string `json:"manifestFingerprint"`
	Manifest                   []byte `json:"manifest"`
}

// QuoteResponse is the data of GET /api/v2/quote. Quote is null in
// simulation mode.
type QuoteResponse struct {
	Cert  string `json:"cert"`
	Quote []byte `json:"quote"`
}

// ValidationFailure is the data of a fail response for an invalid manifest:
// where the problem is.
type ValidationFailure struct {
	Section string `json:"section,omitempty"`
	Name    string `json:"name,omitempty"`
	Field   string `json:"field,omitempty"`
}

// RecoverRequest is the body of POST /api/v2/recover.
type RecoverRequest struct {
	RecoverySecret          []byte `json:"recoverySecret"`
	RecoverySecretSignature []byte `json:"recoverySecretSignature"`
}

// RecoverResponse is the data of POST /api/v2/recover.
type RecoverResponse struct {
	Remaining int    `json:"remaining"`
	Message   string `json:"message"`
}

// RecoverySecretsResponse is the data of GET /api/v2/recover/secrets: the
// encrypted recovery secrets last handed out (by the manifest set, or by the
// update that last made a new data key: it changed RecoveryKeys, or SealMode
// to UniqueKey; docs/sealing.md), one per RecoveryKeys name, each
// encrypted to its key as in ManifestSetResponse.
type RecoverySecretsResponse struct {
	RecoverySecrets map[string][]byte `json:"recoverySecrets"`
}

// RecoveryPublicKeyResponse is the data of GET /api/v2/recover/public-key.
type RecoveryPublicKeyResponse struct {
	Algorithm          string `json:"algorithm"`
	EphemeralPublicKey []byte `json:"ephemeralPublicKey"`
}

// Secret is one secret as GET /api/v2/secrets returns it (docs/design/decisions.md#d5:
// lower-camel names). For symmetric keys and plain secrets Private and
// Public both hold the key or data.
type Secret struct {
	Type        string `json:"type"`
	Size        uint   `json:"size,omitempty"`
	Shared      bool   `json:"shared"`
	UserDefined bool   `json:"userDefined"`
	Cert        []byte `json:"cert,omitempty"`
	ValidFor    uint   `json:"validFor,omitempty"`
	Private     []byte `json:"private,omitempty"`
	Public      []byte `json:"public,omitempty"`
}

// SecretsGetResponse is the data of GET /api/v2/secrets.
type SecretsGetResponse struct {
	Secrets map[string]Secret `json:"secrets"`
}

// UserSecret is one uploaded secret (docs/design/decisions.md#d4): Key alone, or Cert with
// Private and/or Public. Member names are matched case-insensitively, so
// MarbleRun's Cert/Key/Private are accepted too.
type UserSecret struct {
	Key     []byte `json:"key,omitempty"`
	Cert    []byte `json:"cert,omitempty"`
	Private []byte `json:"private,omitempty"`
	Public  []byte `json:"public,omitempty"`
}

// SecretsSetRequest is the body of POST /api/v2/secrets.
type SecretsSetRequest struct {
	Secrets map[string]UserSecret `json:"secrets"`
}

// UpdateLogResponse is the data of GET /api/v2/update: one JSON entry per
// string.
type UpdateLogResponse struct {
	UpdateLog []string `json:"updateLog"`
}

// UpdateRequest is the body of POST /api/v2/update and POST
// /api/v2/update-manifest.
type UpdateRequest struct {
	Manifest []byte `json:"manifest"`
}

// UpdateResponse is the data of POST /api/v2/update.
type UpdateResponse struct {
	MissingAcknowledgments int               `json:"missingAcknowledgments"`
	MissingUsers           []string          `json:"missingUsers"`
	RecoverySecrets        map[string][]byte `json:"recoverySecrets,omitempty"`
}

// UpdateAckResponse is the data of POST /api/v2/update-manifest.
type UpdateAckResponse struct {
	Message                string            `json:"message"`
	MissingAcknowledgments int               `json:"missingAcknowledgments"`
	MissingUsers           []string          `json:"missingUsers"`
	RecoverySecrets        map[string][]byte `json:"recoverySecrets,omitempty"`
}

// PendingUpdateResponse is the data of GET /api/v2/update-manifest.
type PendingUpdateResponse struct {
	Manifest     []byte   `json:"manifest"`
	MissingUsers []string `json:"missingUsers"`
	Message      string   `json:"message"`
}

// UpdateCancelResponse is the data of POST /api/v2/update-cancel.
type UpdateCancelResponse struct {
	Message string `json:"message"`
}

// SignQuoteRequest is the body of POST /api/v2/sign-quote.
type SignQuoteRequest struct {
	SGXQuote []byte `json:"sgxQuote"`
}

// SignQuoteResponse is the data of POST /api/v2/sign-quote. Signature and
// VerificationSignature carry the same value (docs/design/decisions.md#d3).
type SignQuoteResponse struct {
	Signature             []byte `json:"signature"`
	VerificationSignature []byte `json:"verificationSignature"`
	TCBStatus             string `json:"tcbStatus"`
}

// SignQuoteFailure is the data of a fail response of POST /api/v2/sign-quote.
type SignQuoteFailure struct {
	SGXQuote string `json:"sgxQuote"`
}

// MonotonicCounterRequest is the body of POST /api/v2/monotonic-counter,
// which a Marble calls with its Marble certificate: raise the Marble's
// counter Name to Value (a counter never decreases).
type MonotonicCounterRequest struct {
	Name  string `json:"name"`
	Value uint64 `json:"value"`
}

// MonotonicCounterResponse is the data of POST /api/v2/monotonic-counter:
// the counter's value before the request (0 for a new counter).
type MonotonicCounterResponse struct {
	Value uint64 `json:"value"`
}
