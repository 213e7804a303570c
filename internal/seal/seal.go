// Package seal defines Quarry's sealed-state format: the Coordinator's state
// encrypted and authenticated under a 32-byte data key (DEK), next to a
// plaintext but authenticated header that holds public recovery data.
//
// A sealed blob (format version 1) is
//
//	magic "QRYSEAL\x00" (8 bytes)
//	version            u16 little-endian (1)
//	header length H    u32 little-endian
//	header             H bytes, plaintext
//	nonce              12 bytes
//	ciphertext ‖ tag   AES-256-GCM, 16-byte tag
//
// The GCM additional data is everything before the nonce (magic, version,
// header length and header), so the header cannot be changed without the
// data key. The format is Quarry's own; it is not MarbleRun's sealed_data.
//
// The data key itself is protected by a [KeySealer].
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	cryptorand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Version is the format version that Seal writes and Open reads.
const Version = 1

// KeySize is the size of a data key in bytes (AES-256).
const KeySize = 32

// Magic starts every sealed blob.
const Magic = "QRYSEAL\x00"

const (
	nonceSize = 12
	tagSize   = 16
	// prefixSize is magic ‖ version ‖ header length.
	prefixSize = len(Magic) + 2 + 4
	// minSize is a sealed blob with an empty header and empty plaintext.
	minSize = prefixSize + nonceSize + tagSize
	// maxPlaintext is the most that AES-GCM encrypts under one nonce.
	maxPlaintext = (1<<32 - 2) * aes.BlockSize
)

// Errors that callers branch on. Errors returned by this package wrap one of
// them; compare with errors.Is.
var (
	// ErrCorrupt means the blob is not a well-formed sealed blob: bad magic,
	// truncated, or a header length that does not fit the blob.
	ErrCorrupt = errors.New("seal: corrupt sealed data")
	// ErrVersion means the blob has a format version this build does not
	// read. The error's message names the version.
	ErrVersion = errors.New("seal: unsupported format version")
	// ErrDecrypt means authentication failed: the key is wrong, or the
	// header, nonce or ciphertext was changed.
	ErrDecrypt = errors.New("seal: decryption failed (wrong key or tampered data)")
	// ErrKeySize means a data key is not KeySize bytes long.
	ErrKeySize = errors.New("seal: data key must be 32 bytes")
)

// NewDataKey returns a fresh KeySize-byte data key read from rand. A nil
// rand means crypto/rand.
func NewDataKey(rand io.Reader) ([]byte, error) {
	dek := make([]byte, KeySize)
	if rand == nil {
		rand = cryptorand.Reader
	}
	if _, err := io.ReadFull(rand, dek); err != nil {
		return nil, fmt.Errorf("seal: generate data key: %w", err)
	}
	return dek, nil
}

// Seal encrypts plaintext under dek and returns a sealed blob whose header is
// header (stored in plaintext, authenticated). The nonce is read from rand;
// a nil rand lets the FIPS 140 module generate the nonce itself, which is
// the approved service and the only one allowed under GODEBUG=fips140=only,
// so production callers pass nil. A key must not seal more than 2^32 blobs
// (random nonces).
func Seal(rand io.Reader, dek, header, plaintext []byte) ([]byte, error) {
	if len(dek) != KeySize {
		return nil, fmt.Errorf("%w: got %d bytes", ErrKeySize, len(dek))
	}
	if uint64(len(header)) > math.MaxUint32 {
		return nil, fmt.Errorf("seal: header of %d bytes is too large", len(header))
	}
	if uint64(len(plaintext)) > maxPlaintext {
		return nil, fmt.Errorf("seal: plaintext of %d bytes is too large", len(plaintext))
	}
	block, err := aes.NewCipher(dek)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}

	out := make([]byte, prefixSize+len(header), minSize+len(header)+len(plaintext))
	copy(out, Magic)
	binary.LittleEndian.PutUint16(out[len(Magic):], Version)
	binary.LittleEndian.PutUint32(out[len(Magic)+2:], uint32(len(header)))
	copy(out[prefixSize:], header)
	aad := out[:prefixSize+len(header)]

	if rand == nil {
		aead, err := cipher.NewGCMWithRandomNonce(block)
		if err != nil {
			return nil, fmt.Errorf("seal: %w", err)
		}
		// Appends nonce ‖ ciphertext ‖ tag. The additional data is a prefix
		// of out and out's capacity covers the result, so Seal writes after
		// aad without reallocating and the two do not overlap.
		return aead.Seal(out, nil, plaintext, aad[:len(aad):len(aad)]), nil
	}

	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	out = out[:len(out)+nonceSize]
	nonce := out[len(out)-nonceSize:]
	if _, err := io.ReadFull(rand, nonce); err != nil {
		return nil, fmt.Errorf("seal: read nonce: %w", err)
	}
	return aead.Seal(out, nonce, plaintext, out[:len(aad):len(aad)]), nil
}

// Open checks and decrypts a sealed blob under dek and returns its header
// and plaintext (both freshly allocated). It fails with ErrKeySize,
// ErrCorrupt, ErrVersion or ErrDecrypt; it never returns a header or
// plaintext that did not authenticate under dek.
func Open(dek, blob []byte) (header, plaintext []byte, err error) {
	if len(dek) != KeySize {
		return nil, nil, fmt.Errorf("%w: got %d bytes", ErrKeySize, len(dek))
	}
	hdrEnd, err := parse(blob)
	if err != nil {
		return nil, nil, err
	}
	block, err := aes.NewCipher(dek)
	if err != nil {
		return nil, nil, fmt.Errorf("seal: %w", err)
	}
	// The random-nonce AEAD reads nonce ‖ ciphertext ‖ tag, which is our
	// layout, and is usable under GODEBUG=fips140=only.
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, nil, fmt.Errorf("seal: %w", err)
	}
	plaintext, err = aead.Open(nil, nil, blob[hdrEnd:], blob[:hdrEnd])
	if err != nil {
		return nil, nil, ErrDecrypt
	}
	header = append([]byte{}, blob[prefixSize:hdrEnd]...)
	if plaintext == nil {
		plaintext = []byte{}
	}
	return header, plaintext, nil
}

// ReadHeader returns a copy of a sealed blob's header without a key, after
// checking the blob's structure only. The header is NOT authenticated until
// Open succeeds on the same blob: treat it as untrusted input (in recovery
// mode it holds public data such as recovery public keys).
func ReadHeader(blob []byte) ([]byte, error) {
	hdrEnd, err := parse(blob)
	if err != nil {
		return nil, err
	}
	return append([]byte{}, blob[prefixSize:hdrEnd]...), nil
}

// parse checks a blob's structure and returns the offset where the header
// ends (and the nonce starts).
func parse(blob []byte) (hdrEnd int, err error) {
	if len(blob) < len(Magic) || string(blob[:len(Magic)]) != Magic {
		return 0, fmt.Errorf("%w: not a Quarry sealed blob (bad magic)", ErrCorrupt)
	}
	if len(blob) < len(Magic)+2 {
		return 0, fmt.Errorf("%w: truncated at %d bytes", ErrCorrupt, len(blob))
	}
	if v := binary.LittleEndian.Uint16(blob[len(Magic):]); v != Version {
		return 0, fmt.Errorf("%w %d (this build reads version %d)", ErrVersion, v, Version)
	}
	if len(blob) < minSize {
		return 0, fmt.Errorf("%w: truncated at %d bytes (minimum %d)", ErrCorrupt, len(blob), minSize)
	}
	h := uint64(binary.LittleEndian.Uint32(blob[len(Magic)+2:]))
	if h > uint64(len(blob)-minSize) {
		return 0, fmt.Errorf("%w: header length %d does not fit in %d bytes", ErrCorrupt, h, len(blob))
	}
	return prefixSize + int(h), nil
}
