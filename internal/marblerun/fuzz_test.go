package marblerun

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"testing"
)

// fuzzKey is the data key the fuzz corpus is sealed under.
var fuzzKey = bytes.Repeat([]byte{0x42}, 32)

// sealForFuzz seals plaintext as MarbleRun's sealed_data under fuzzKey
// with a fixed nonce, so that the fuzzer reaches the store decoder.
func sealForFuzz(recoveryData, plaintext []byte) []byte {
	block, _ := aes.NewCipher(fuzzKey)
	aead, _ := cipher.NewGCM(block)
	out := binary.LittleEndian.AppendUint32(nil, uint32(len(recoveryData)))
	out = append(out, recoveryData...)
	nonce := make([]byte, 12)
	out = append(out, nonce...)
	return aead.Seal(out, nonce, plaintext, nil)
}

// FuzzParse feeds arbitrary sealed_data files (the raw bytes) and arbitrary
// decrypted stores (sealed by the target, so the decoder is reached) to the
// parser: it must never panic, and whatever it accepts must be consistent.
func FuzzParse(f *testing.F) {
	// Small seeds of every key kind (the vectors' files are large, which
	// makes minimising slow; TestVectorsDecode covers them).
	f.Add([]byte(nil), []byte(`{"package:p":"eyJEZWJ1ZyI6ZmFsc2UsIlNlY3VyaXR5VmVyc2lvbiI6Mn0=","user:u":"eyJOYW1lIjoidSIsIkNlcnRpZmljYXRlIjpudWxsfQ==","marble:m":"e30=","pendingUpdate":"eyJtYW5pZmVzdFJhdyI6IiIsInJlcXVpcmVkVXNlcnMiOnt9fQ=="}`))
	f.Add(append([]byte{70, 0, 0, 0}, append([]byte(`{"5207da2b52195d643027c12a789622f8030ffd1a129e0c86d841066f6cd84cf9":true}`), make([]byte, 28)...)...), []byte(`{}`))
	f.Add([]byte{4, 0, 0, 0, 'n', 'u', 'l', 'l'}, []byte(`{"state":"Mw==","activations:a":"Mg==","monotonicCounter:YQ==:AAAAAAAAAAAAAAAAAAAAAA==:Yg==":"AwAAAAAAAAA="}`))
	f.Add([]byte(nil), []byte(`{"secret:x":"eyJUeXBlIjoicGxhaW4ifQ==","updateLog":"e30K"}`))
	f.Fuzz(func(t *testing.T, raw, plaintext []byte) {
		if sd, err := ParseSealedData(raw); err == nil {
			sd.Open(fuzzKey)
			if sd.ShareHashes != nil && len(sd.ShareHashes) == 0 {
				t.Fatal("empty non-nil share hashes")
			}
		}
		sd, err := ParseSealedData(sealForFuzz([]byte("null"), plaintext))
		if err != nil {
			t.Fatalf("a well-formed file is refused: %v", err)
		}
		kv, err := sd.Open(fuzzKey)
		if err != nil {
			return
		}
		st, err := Decode(kv)
		if err != nil {
			return
		}
		for _, line := range st.UpdateLog {
			if line == "" {
				t.Fatal("empty update log line accepted")
			}
		}
	})
}
