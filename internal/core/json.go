package core

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// jsonUnmarshalStrict decodes exactly one JSON value and rejects unknown
// fields and trailing data: the sealed state is our own format.
func jsonUnmarshalStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the state")
	}
	return nil
}
