// Package marbleruntest writes MarbleRun sealed_data files for tests: the
// layout MarbleRun's Coordinator writes (docs/design/behaviour.md#sealed-state), so that tests
// can craft states the shared vectors do not cover.
package marbleruntest

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
)

// Seal returns sealed_data for the store kv (store key → raw value) under
// dek, with recoveryData as the clear recovery data ("null" if empty).
func Seal(dek, recoveryData []byte, kv map[string][]byte) ([]byte, error) {
	if len(recoveryData) == 0 {
		recoveryData = []byte("null")
	}
	enc := make(map[string]string, len(kv))
	for k, v := range kv {
		enc[k] = base64.StdEncoding.EncodeToString(v)
	}
	plaintext, err := json.Marshal(enc)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(dek)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out := binary.LittleEndian.AppendUint32(nil, uint32(len(recoveryData)))
	out = append(out, recoveryData...)
	out = append(out, nonce...)
	return aead.Seal(out, nonce, plaintext, nil), nil
}
