package seal

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// The key file (sealed_key) holds the data key sealed by a [KeySealer],
// bound to the exact sealed blob it opens. While the data key changes it
// holds two entries, the new key bound to the new blob and the current key
// bound to the blob still on disk, so that whichever blob a crash leaves
// behind, the key file opens it (docs/design/decisions.md#d17; docs/sealing.md).
//
// Format version 1:
//
//	magic "QRYKEY\x00\x01" (8 bytes)
//	version    u16 little-endian (1)
//	count      u8, 1 or 2
//	count × {
//	    binding    32 bytes: SHA-256 of the sealed blob the entry opens
//	    length L   u32 little-endian
//	    sealed key L bytes, from KeySealer.SealKey(dek, binding)
//	}
//
// Nothing may follow the last entry. A file of exactly KeySize bytes is the
// legacy form (Quarry before its crash-safe key change, and MarbleRun
// without an enclave): the raw
// data key, bound to nothing.

// KeyFileMagic starts every key file of format version 1 or later.
const KeyFileMagic = "QRYKEY\x00\x01"

// KeyFileVersion is the key file format version that EncodeKeyFile writes.
const KeyFileVersion = 1

const (
	bindingSize = sha256.Size
	// maxKeyFileEntries is the most entries a key file holds.
	maxKeyFileEntries = 2
	// maxSealedKey bounds one sealed key (a sealed 32-byte key with any
	// sealer's header is far smaller).
	maxSealedKey = 64 << 10
)

// ErrKeyFile means a key file is malformed.
var ErrKeyFile = errors.New("seal: malformed key file")

// Binding returns the binding of a sealed blob: its SHA-256.
func Binding(blob []byte) [32]byte { return sha256.Sum256(blob) }

// KeyEntry is one sealed data key and the blob it is bound to.
type KeyEntry struct {
	// Binding is the SHA-256 of the sealed blob the key opens; the zero
	// value in a legacy key file (bound to nothing).
	Binding [32]byte
	// Legacy marks the entry of a legacy key file (the raw data key).
	Legacy bool
	// Sealed is the sealed data key.
	Sealed []byte
}

// EncodeKeyFile encodes one or two entries (none of them legacy).
func EncodeKeyFile(entries []KeyEntry) ([]byte, error) {
	if len(entries) == 0 || len(entries) > maxKeyFileEntries {
		return nil, fmt.Errorf("seal: a key file holds 1 or %d entries, not %d", maxKeyFileEntries, len(entries))
	}
	out := make([]byte, 0, len(KeyFileMagic)+3+len(entries)*(bindingSize+4+64))
	out = append(out, KeyFileMagic...)
	out = binary.LittleEndian.AppendUint16(out, KeyFileVersion)
	out = append(out, byte(len(entries)))
	for _, e := range entries {
		if e.Legacy || len(e.Sealed) == 0 || len(e.Sealed) > maxSealedKey {
			return nil, fmt.Errorf("seal: key file entry with %d sealed bytes (legacy %v)", len(e.Sealed), e.Legacy)
		}
		out = append(out, e.Binding[:]...)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(e.Sealed)))
		out = append(out, e.Sealed...)
	}
	return out, nil
}

// DecodeKeyFile parses a key file. A file of exactly KeySize bytes is the
// legacy raw data key (one Legacy entry). The entries' Sealed slices are
// copies.
func DecodeKeyFile(b []byte) ([]KeyEntry, error) {
	if len(b) == KeySize { // shorter than any key file
		return []KeyEntry{{Legacy: true, Sealed: append([]byte{}, b...)}}, nil
	}
	if len(b) < len(KeyFileMagic) || string(b[:len(KeyFileMagic)]) != KeyFileMagic {
		return nil, fmt.Errorf("%w: %d bytes that are neither a key file (bad magic) nor a raw %d-byte key", ErrKeyFile, len(b), KeySize)
	}
	rest := b[len(KeyFileMagic):]
	if len(rest) < 3 {
		return nil, fmt.Errorf("%w: truncated header", ErrKeyFile)
	}
	if v := binary.LittleEndian.Uint16(rest); v != KeyFileVersion {
		return nil, fmt.Errorf("%w: version %d (this build reads version %d)", ErrKeyFile, v, KeyFileVersion)
	}
	n := int(rest[2])
	if n == 0 || n > maxKeyFileEntries {
		return nil, fmt.Errorf("%w: %d entries", ErrKeyFile, n)
	}
	rest = rest[3:]
	entries := make([]KeyEntry, 0, n)
	for i := range n {
		if len(rest) < bindingSize+4 {
			return nil, fmt.Errorf("%w: entry %d truncated", ErrKeyFile, i)
		}
		var e KeyEntry
		copy(e.Binding[:], rest)
		l := binary.LittleEndian.Uint32(rest[bindingSize:])
		rest = rest[bindingSize+4:]
		if l == 0 || l > maxSealedKey || uint64(l) > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: entry %d has a sealed key of %d bytes (%d left)", ErrKeyFile, i, l, len(rest))
		}
		e.Sealed = append([]byte{}, rest[:l]...)
		rest = rest[l:]
		entries = append(entries, e)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last entry", ErrKeyFile, len(rest))
	}
	return entries, nil
}

// Find returns the entry of entries bound to blob: the entry whose binding
// is blob's SHA-256, else a legacy entry (bound to nothing; the caller's
// decryption of blob decides), else false.
func Find(entries []KeyEntry, blob []byte) (KeyEntry, bool) {
	b := Binding(blob)
	for _, e := range entries {
		if !e.Legacy && e.Binding == b {
			return e, true
		}
	}
	for _, e := range entries {
		if e.Legacy {
			return e, true
		}
	}
	return KeyEntry{}, false
}
