package manifest

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is wrapped by every error that Parse, Validate and
// ValidatePackageUpdate return: the manifest (or update) is unacceptable.
var ErrInvalid = errors.New("invalid manifest")

// File encodings. Encoding names are compared case-insensitively when parsed
// and stored in this canonical (lower-case) form.
const (
	EncodingString = "string"
	EncodingBase64 = "base64"
	EncodingHex    = "hex"
)

// maxCertDigits bounds the length of any run of decimal digits in a secret's
// Cert template. Go decodes the template's SerialNumber (a big.Int) and
// Policies (OIDs parsed through big.Int) in time quadratic in the number of
// digits: a few megabytes of digits take minutes. A real serial number has at
// most 49 decimal digits.
const maxCertDigits = 1000

// Parse decodes a manifest from JSON as MarbleRun's Coordinator does:
// member names match case-insensitively, unknown members are ignored and
// trailing data is rejected. Empty input and a top-level null are errors.
// File values are decoded from their Encoding (see File). Unlike MarbleRun,
// Parse refuses an object that has a member twice, at any depth: two keys
// that decode into the same struct field (equal under Unicode simple case
// folding, like "Packages" and "packages"), or two equal keys anywhere else
// (map keys such as package and secret names are case-sensitive, so "app"
// and "App" are two entries). The error names the key and the object, e.g.
// `duplicate key "SignerID" (also spelled "signerid") at $.Packages.backend`.
// Every error has the text "unmarshaling manifest: <cause>" and wraps
// ErrInvalid.
//
// Parse checks only the JSON shape; call Validate for the manifest rules.
func Parse(raw []byte) (*Manifest, error) {
	m, err := ParseStored(raw)
	if err != nil {
		return nil, err
	}
	if err := checkDuplicateKeys(raw); err != nil {
		return nil, &parseError{err}
	}
	return m, nil
}

// ParseStored decodes a manifest that was accepted and stored before (by
// this or an earlier version): like Parse, but without the checks added
// since (duplicate keys), so that a state sealed by an earlier version
// still opens. Never use it for a manifest a client sends.
func ParseStored(raw []byte) (*Manifest, error) {
	if string(bytes.Trim(raw, " \t\r\n")) == "null" {
		return nil, &parseError{errors.New("manifest is null")}
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, &parseError{err}
	}
	return &m, nil
}

// parseError is the error of Parse. It wraps both ErrInvalid and its cause,
// so errors.As can still reach a *json.SyntaxError, for instance.
type parseError struct{ err error }

func (e *parseError) Error() string   { return "unmarshaling manifest: " + e.err.Error() }
func (e *parseError) Unwrap() []error { return []error{ErrInvalid, e.err} }

// fileJSON is the object form of a File.
type fileJSON struct {
	Data        string
	Encoding    string
	NoTemplates bool
}

// UnmarshalJSON accepts a plain JSON string (the content itself, encoding
// "string", templates enabled) or an object {"Data","Encoding","NoTemplates"}
// whose Data is decoded according to Encoding ("string", "base64" with the
// standard padded alphabet, or "hex"; case-insensitive; default "string").
// Any other JSON value, null included, is an error.
func (f *File) UnmarshalJSON(data []byte) error {
	data = bytes.TrimLeft(data, " \t\r\n")
	if len(data) == 0 {
		return errors.New("invalid file value: empty")
	}
	switch data[0] {
	case '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*f = File{Data: s, Encoding: EncodingString}
		return nil
	case '{':
		var obj fileJSON
		if err := json.Unmarshal(data, &obj); err != nil {
			return err
		}
		enc := strings.ToLower(obj.Encoding)
		var content []byte
		var err error
		switch enc {
		case "", EncodingString:
			enc = EncodingString
			content = []byte(obj.Data)
		case EncodingBase64:
			content, err = base64.StdEncoding.DecodeString(obj.Data)
		case EncodingHex:
			content, err = hex.DecodeString(obj.Data)
		default:
			return fmt.Errorf("unknown encoding type: %s", obj.Encoding)
		}
		if err != nil {
			return err
		}
		*f = File{Data: string(content), Encoding: enc, NoTemplates: obj.NoTemplates}
		return nil
	default:
		return fmt.Errorf("invalid file value: want a JSON string or object, got %s", jsonKind(data[0]))
	}
}

// jsonKind names the kind of JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case 'n':
		return "null"
	case 't', 'f':
		return "boolean"
	case '[':
		return "array"
	default:
		return "number"
	}
}

// MarshalJSON writes the object form, with Data encoded again in its Encoding
// (an empty Encoding means "string").
func (f File) MarshalJSON() ([]byte, error) {
	obj := fileJSON{Encoding: strings.ToLower(f.Encoding), NoTemplates: f.NoTemplates}
	switch obj.Encoding {
	case "", EncodingString:
		obj.Encoding = EncodingString
		obj.Data = f.Data
	case EncodingBase64:
		obj.Data = base64.StdEncoding.EncodeToString([]byte(f.Data))
	case EncodingHex:
		obj.Data = hex.EncodeToString([]byte(f.Data))
	default:
		return nil, fmt.Errorf("unknown encoding type: %s", f.Encoding)
	}
	return json.Marshal(obj)
}

// UnmarshalJSON decodes a secret definition like encoding/json would, but
// first bounds the digit runs in the Cert template (see maxCertDigits).
func (s *Secret) UnmarshalJSON(data []byte) error {
	type secret Secret // no methods: no recursion
	aux := struct {
		*secret
		Cert certTemplate // shadows secret.Cert
	}{secret: (*secret)(s), Cert: certTemplate{s.Cert}}
	if err := json.Unmarshal(data, &aux); err != nil {
		return err
	}
	s.Cert = aux.Cert.Certificate
	return nil
}

// certTemplate decodes an x509.Certificate template after checking that it
// holds no overlong digit runs.
type certTemplate struct{ x509.Certificate }

func (c *certTemplate) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if tooManyDigits(v) {
		return fmt.Errorf("certificate template contains a number with more than %d digits", maxCertDigits)
	}
	return json.Unmarshal(data, &c.Certificate)
}

// tooManyDigits reports whether a decoded JSON value holds a string, key or
// number with a run of more than maxCertDigits decimal digits.
func tooManyDigits(v any) bool {
	switch v := v.(type) {
	case json.Number:
		return digitRun(string(v)) > maxCertDigits
	case string:
		return digitRun(v) > maxCertDigits
	case []any:
		for _, e := range v {
			if tooManyDigits(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if digitRun(k) > maxCertDigits || tooManyDigits(e) {
				return true
			}
		}
	}
	return false
}

// digitRun returns the length of the longest run of ASCII digits in s.
func digitRun(s string) int {
	longest, cur := 0, 0
	for i := 0; i < len(s); i++ {
		if s[i] >= '0' && s[i] <= '9' {
			cur++
			longest = max(longest, cur)
		} else {
			cur = 0
		}
	}
	return longest
}
