// Package v1 defines the unprefixed (version 1.2) Client API wire contract:
// paths and bodies. Members are capitalised; byte slices are standard base64
// except where noted.
package v1

// Paths of the unprefixed generation.
const (
	PathStatus         = "/status"
	PathManifest       = "/manifest"
	PathQuote          = "/quote"
	PathRecover        = "/recover"
	PathSecrets        = "/secrets"
	PathUpdate         = "/update"
	PathUpdateManifest = "/update-manifest"
	PathUpdateCancel   = "/update-cancel"
)

// StatusResponse is the data of GET /status.
type StatusResponse struct {
	StatusCode    int
	StatusMessage string
}

// ManifestGetResponse is the data of GET /manifest. ManifestSignature is
// the hex SHA-256 of the manifest (its fingerprint).
type ManifestGetResponse struct {
	ManifestSignatureRootECDSA []byte
	ManifestSignature          string
	Manifest                   []byte
}

// ManifestSetResponse is the data of POST /manifest when recovery secrets
// were made (otherwise the data is null).
type ManifestSetResponse struct {
	RecoverySecrets map[string][]byte
}

// QuoteResponse is the data of GET /quote.
type QuoteResponse struct {
	Cert  string
	Quote []byte
}

// RecoverResponse is the data of POST /recover, whose body is the plain
// recovery secret as a JSON array of byte values.
type RecoverResponse struct {
	StatusMessage string
	Remaining     int
}

// Secret is one secret as GET /secrets returns it.
type Secret struct {
	Type        string
	Size        uint
	Shared      bool
	UserDefined bool
	Cert        []byte
	ValidFor    uint
	Private     []byte
	Public      []byte
}

// UserSecret is one uploaded secret in POST /secrets. Cert is the DER
// certificate (base64); Key and Private are arrays of byte values or base64.
type UserSecret struct {
	Cert    []byte
	Key     []byte
	Private []byte
}

// PendingUpdateResponse is the data of GET /update-manifest.
type PendingUpdateResponse struct {
	Manifest     []byte   `json:"manifest"`
	MissingUsers []string `json:"missingUsers"`
	Message      string   `json:"message"`
}
