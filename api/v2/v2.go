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
	PathSecrets          = "/api/v2/secrets"
	PathSignQuote        = "/api/v2/sign-quote"
	PathUpdate           = "/api/v2/update"
	PathUpdateManifest   = "/api/v2/update-manifest"
	PathUpdateCancel     = "/api/v2/update-cancel"
	PathMonotonicCounter = "/api/v2/monotonic-counter"
)

// StatusResponse is the data of GET /api/v2/status. Code and Status carry the
// same state code (decision D2).
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

// RecoveryPublicKeyResponse is the data of GET /api/v2/recover/public-key.
type RecoveryPublicKeyResponse struct {
	Algorithm          string `json:"algorithm"`
	EphemeralPublicKey []byte `json:"ephemeralPublicKey"`
}
