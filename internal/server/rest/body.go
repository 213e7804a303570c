package rest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// decodeBody reads one JSON value from the request body, at most limit
// bytes, into v. Unknown members are ignored (as MarbleRun's clients may
// send extra ones); trailing data is rejected.
func decodeBody(r *http.Request, limit int64, v any) error {
	body := http.MaxBytesReader(nil, r.Body, limit)
	dec := json.NewDecoder(body)
	err := dec.Decode(v)
	if err == nil {
		if _, tErr := dec.Token(); tErr != io.EOF {
			err = errTrailing
			if tErr != nil {
				err = tErr
			}
		}
	}
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooLarge):
		return &bodyError{tooLarge: true, msg: fmt.Sprintf("request body too large: the limit is %d bytes", limit)}
	case errors.Is(err, io.EOF):
		return &bodyError{msg: "invalid request: the body is empty; a JSON object is expected"}
	case errors.Is(err, errTrailing):
		return &bodyError{msg: "invalid request: unexpected data after the JSON object"}
	}
	return &bodyError{msg: "invalid request: malformed JSON body: " + err.Error()}
}

var errTrailing = errors.New("trailing data")
