// Package marblerun reads the sealed state of a MarbleRun Coordinator
// (docs/design/behaviour.md#sealed-state,
// docs/design/behaviour.md#recovery): the sealed_data file's layout, its decryption with
// the data key, the store keys and their encodings, and MarbleRun's recovery
// data, so that Quarry can take over a running MarbleRun deployment. It only
// reads and checks; it neither writes nor logs. Converting the state into
// Quarry's is the core's job.
//
// sealed_data is
//
//	recovery data length L   u32 little-endian
//	recovery data            L bytes of clear JSON: null (single key) or
//	                         {"<sha256hex(share)>": true, ...}
//	nonce                    12 bytes
//	ciphertext ‖ tag         AES-GCM under the data key, no additional data
//
// and the plaintext is one JSON object: store key → base64 of the value.
package marblerun

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Errors callers branch on; returned errors wrap one of them.
var (
	// ErrNotSealedData means the bytes are not MarbleRun's sealed_data
	// layout (too short, a bad length prefix, recovery data that is not
	// MarbleRun's JSON).
	ErrNotSealedData = errors.New("not a MarbleRun sealed_data file")
	// ErrDecrypt means the data key does not decrypt the state (a wrong key,
	// or changed bytes).
	ErrDecrypt = errors.New("the MarbleRun state does not decrypt with this data key (wrong key, or the file was changed)")
	// ErrKeySize means a data key is neither 32 bytes nor MarbleRun's
	// legacy 16.
	ErrKeySize = errors.New("a MarbleRun data key has 32 (or, before 1.9.0, 16) bytes")
	// ErrInvalid means the decrypted state is not what MarbleRun writes.
	ErrInvalid = errors.New("invalid MarbleRun state")
)

const (
	nonceSize = 12
	tagSize   = 16
	// maxRecoveryData bounds the clear recovery data (a hash map of at most
	// 255 shares is about 18 KiB).
	maxRecoveryData = 1 << 20
)

// SealedData is a parsed, still encrypted sealed_data file.
type SealedData struct {
	// RecoveryData is the clear JSON recovery data exactly as stored.
	RecoveryData []byte
	// ShareHashes are the lowercase hex SHA-256 of the plain recovery
	// shares (XOR or Shamir), sorted; nil when the recovery data is null
	// (a single recovery key, or none).
	ShareHashes []string
	sealed      []byte // nonce ‖ ciphertext ‖ tag
}

// ParseSealedData checks the layout of a sealed_data file without a key.
// Errors wrap ErrNotSealedData.
func ParseSealedData(b []byte) (*SealedData, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: %d bytes", ErrNotSealedData, len(b))
	}
	l := uint64(binary.LittleEndian.Uint32(b))
	if l > maxRecoveryData || l > uint64(len(b)-4) {
		return nil, fmt.Errorf("%w: recovery data length %d does not fit in %d bytes", ErrNotSealedData, l, len(b))
	}
	rd := b[4 : 4+l]
	rest := b[4+l:]
	if len(rest) < nonceSize+tagSize {
		return nil, fmt.Errorf("%w: %d bytes of ciphertext, fewer than a nonce and a tag", ErrNotSealedData, len(rest))
	}
	hashes, err := parseRecoveryData(rd)
	if err != nil {
		return nil, err
	}
	return &SealedData{RecoveryData: bytes.Clone(rd), ShareHashes: hashes, sealed: bytes.Clone(rest)}, nil
}

// parseRecoveryData reads MarbleRun's clear recovery data: null, or an
// object whose keys are distinct lowercase hex SHA-256 values mapped to true.
func parseRecoveryData(rd []byte) ([]string, error) {
	trimmed := bytes.TrimSpace(rd)
	if string(trimmed) == "null" {
		return nil, nil
	}
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("%w: the recovery data is neither null nor a JSON object", ErrNotSealedData)
	}
	var m map[string]bool
	if err := json.Unmarshal(trimmed, &m); err != nil {
		return nil, fmt.Errorf("%w: recovery data: %v", ErrNotSealedData, err)
	}
	for h, used := range m {
		d, err := hex.DecodeString(h)
		if err != nil || len(d) != 32 || hex.EncodeToString(d) != h || !used {
			return nil, fmt.Errorf("%w: recovery data entry %q is not a lowercase hex SHA-256 mapped to true", ErrNotSealedData, clip(h))
		}
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("%w: empty recovery data object", ErrNotSealedData)
	}
	return slices.Sorted(maps.Keys(m)), nil
}

// Open decrypts the state with the data key and returns its store: store
// key → raw value. Errors wrap ErrKeySize, ErrDecrypt or ErrInvalid.
func (s *SealedData) Open(dek []byte) (map[string][]byte, error) {
	plaintext, err := s.decrypt(dek)
	if err != nil {
		return nil, err
	}
	return decodeStore(plaintext)
}

// Opens reports whether dek decrypts the state (the GCM tag verifies).
func (s *SealedData) Opens(dek []byte) bool {
	_, err := s.decrypt(dek)
	return err == nil
}

func (s *SealedData) decrypt(dek []byte) ([]byte, error) {
	if len(dek) != 32 && len(dek) != 16 {
		return nil, fmt.Errorf("%w: got %d bytes", ErrKeySize, len(dek))
	}
	block, err := aes.NewCipher(dek)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeySize, err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, err
	}
	plaintext, err := aead.Open(nil, nil, s.sealed, nil)
	if err != nil {
		return nil, ErrDecrypt
	}
	return plaintext, nil
}

// decodeStore decodes the plaintext: one JSON object of store key → base64
// value, no key twice.
func decodeStore(plaintext []byte) (map[string][]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(plaintext))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%w: the decrypted state is not a JSON object", ErrInvalid)
	}
	out := make(map[string][]byte)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: decrypted state: %v", ErrInvalid, err)
		}
		key, _ := tok.(string)
		var v string
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%w: store key %q: the value is not a base64 string: %v", ErrInvalid, clip(key), err)
		}
		raw, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("%w: store key %q: %v", ErrInvalid, clip(key), err)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("%w: store key %q appears twice", ErrInvalid, clip(key))
		}
		out[key] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%w: decrypted state: %v", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the state object", ErrInvalid)
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("%w: data after the state object", ErrInvalid)
	}
	return out, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	const n = 80
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
