package seal

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// DecodeJSON decodes exactly one JSON value and rejects unknown fields
// and trailing data: for Quarry's own sealed formats (the state, its head
// and chunks), which only Quarry writes.
func DecodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}
