package v2

// Query parameters of GET /api/v2/update-log.
const (
	// QueryAfter skips the entries up to and including this sequence
	// number (default 0: from the first entry).
	QueryAfter = "after"
	// QueryLimit is the most entries returned: 1 to 10000, 1000 when it
	// is absent; 0 and larger values are refused (400).
	QueryLimit = "limit"
)

// LogRecord is one entry of the verifiable update log: its sequence number
// (1 for the first entry), its exact bytes (as GET /api/v2/update shows
// them, or one of Quarry's own "quarry: " entries) and its chain hash
// (lowercase hex).
type LogRecord struct {
	Seq   uint64 `json:"seq"`
	Entry string `json:"entry"`
	Hash  string `json:"hash"`
}

// LogCheckpoint is the log's head signed by the root key: count, head hash
// (hex), time (RFC 3339 UTC, milliseconds) and the ECDSA signature (ASN.1,
// base64) over SHA-256 of the signed bytes (docs/update-log.md).
type LogCheckpoint struct {
	Count     uint64 `json:"count"`
	Head      string `json:"head"`
	Time      string `json:"time"`
	Signature []byte `json:"signature"`
}

// UpdateLogPageResponse is the data of GET /api/v2/update-log: the
// entries after QueryAfter, the chain hash of entry QueryAfter (Prev; 64
// zeros for 0), and the latest checkpoint, from the same state as the
// entries (its count is at least the last entry's seq).
type UpdateLogPageResponse struct {
	Entries    []LogRecord   `json:"entries"`
	Prev       string        `json:"prev"`
	Checkpoint LogCheckpoint `json:"checkpoint"`
}
