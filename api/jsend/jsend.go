// Package jsend defines the response envelopes of the Client API: JSend
// {status,data,message} for /api/v2 and {Status,Data} for the unprefixed v1.
package jsend

// Status values.
const (
	StatusSuccess = "success"
	StatusFail    = "fail"
	StatusError   = "error"
)

// Response is the /api/v2 envelope. Data is present on success and may be
// present on fail; Message is set on fail and error.
type Response[T any] struct {
	Status  string `json:"status"`
	Data    T      `json:"data"`
	Message string `json:"message,omitempty"`
}

// V1Response is the unprefixed-generation envelope (only success and error).
type V1Response[T any] struct {
	Status  string `json:"Status"`
	Data    T      `json:"Data"`
	Message string `json:"Message,omitempty"`
}
