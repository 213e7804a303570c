package seal

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// The key file (sealed_key) holds the data key sealed by a [KeySealer],
// bound to what it opens: either the exact sealed blob (the SHA-256 of the
// blob) or every blob sealed under that data key (the key's ID, [KeyID],
// which such a blob names in its authenticated header, see [BlobKeyID]).
// While the data key changes it holds two entries, the new key and the
// current key, so that whichever blob a crash leaves behind, the key file
// opens it (docs/sealing.md). A key bound to its key ID opens every blob of
// that key: a commit that keeps the data key leaves the key file alone.
//
// Format version 1 (every entry bound to a blob):
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
// Format version 3 (an entry bound to a blob or to a key ID):
//
//	magic "QRYKEY\x00\x01" (8 bytes)
//	version    u16 little-endian (3)
//	count      u8, 1 or 2
//	count × {
//	    kind       u8: 1 = bound to a blob, 2 = bound to a key ID
//	    binding    32 bytes: SHA-256 of the sealed blob (kind 1), or
//	               the key ID of the data key (kind 2)
//	    length L   u32 little-endian
//	    sealed key L bytes, from KeySealer.SealKey(dek, binding)
//	}
//
// Version 2 is the key file with per-instance entries (instancekeys.go).
// Nothing may follow the last entry. A file of exactly KeySize bytes is the
// legacy form (Quarry before its crash-safe key change, and MarbleRun
// without an enclave): the raw data key, bound to nothing.

// KeyFileMagic starts every key file of format version 1 or later.
const KeyFileMagic = "QRYKEY\x00\x01"

// KeyFileVersion is the key file format version that EncodeKeyFile writes
// when every entry is bound to a blob; KeyFileVersionKeyID when an entry
// is bound to a key ID.
const (
	KeyFileVersion      = 1
	KeyFileVersionKeyID = 3
)

// Entry kinds of a key file of version 3.
const (
	kindBlob  = 1
	kindKeyID = 2
)

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

// KeyEntry is one sealed data key and what it is bound to.
type KeyEntry struct {
	// Binding is the SHA-256 of the sealed blob the key opens, or, with
	// ByKeyID, the key ID of the data key (every blob that names that key
	// ID in its header); the zero value in a legacy key file (bound to
	// nothing).
	Binding [32]byte
	// ByKeyID marks an entry bound to a key ID (format version 3).
	ByKeyID bool
	// Legacy marks the entry of a legacy key file (the raw data key).
	Legacy bool
	// Sealed is the sealed data key.
	Sealed []byte
}

// Holds reports whether dek, unsealed from e, is the key e is bound to:
// for an entry bound to a key ID, dek must have that key ID (the sealer
// authenticates the binding only if it can; this check does not depend on
// it). An entry bound to a blob (or a legacy one) holds any key: the
// blob's decryption decides.
func (e KeyEntry) Holds(dek []byte) bool {
	if !e.ByKeyID {
		return true
	}
	id := KeyID(dek)
	return hmac.Equal(id[:], e.Binding[:])
}

// EncodeKeyFile encodes one or two entries (none of them legacy): in
// format version 1 when every entry is bound to a blob, else version 3.
func EncodeKeyFile(entries []KeyEntry) ([]byte, error) {
	if len(entries) == 0 || len(entries) > maxKeyFileEntries {
		return nil, fmt.Errorf("seal: a key file holds 1 or %d entries, not %d", maxKeyFileEntries, len(entries))
	}
	version := uint16(KeyFileVersion)
	for _, e := range entries {
		if e.ByKeyID {
			version = KeyFileVersionKeyID
		}
	}
	out := make([]byte, 0, len(KeyFileMagic)+3+len(entries)*(1+bindingSize+4+64))
	out = append(out, KeyFileMagic...)
	out = binary.LittleEndian.AppendUint16(out, version)
	out = append(out, byte(len(entries)))
	for _, e := range entries {
		if e.Legacy || len(e.Sealed) == 0 || len(e.Sealed) > maxSealedKey {
			return nil, fmt.Errorf("seal: key file entry with %d sealed bytes (legacy %v)", len(e.Sealed), e.Legacy)
		}
		if version == KeyFileVersionKeyID {
			kind := byte(kindBlob)
			if e.ByKeyID {
				kind = kindKeyID
			}
			out = append(out, kind)
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
	version := binary.LittleEndian.Uint16(rest)
	if version != KeyFileVersion && version != KeyFileVersionKeyID {
		return nil, fmt.Errorf("%w: version %d (this build reads versions %d and %d here)", ErrKeyFile, version, KeyFileVersion, KeyFileVersionKeyID)
	}
	n := int(rest[2])
	if n == 0 || n > maxKeyFileEntries {
		return nil, fmt.Errorf("%w: %d entries", ErrKeyFile, n)
	}
	rest = rest[3:]
	entries := make([]KeyEntry, 0, n)
	for i := range n {
		var e KeyEntry
		if version == KeyFileVersionKeyID {
			if len(rest) < 1 {
				return nil, fmt.Errorf("%w: entry %d truncated", ErrKeyFile, i)
			}
			switch rest[0] {
			case kindBlob:
			case kindKeyID:
				e.ByKeyID = true
			default:
				return nil, fmt.Errorf("%w: entry %d is of unknown kind %d", ErrKeyFile, i, rest[0])
			}
			rest = rest[1:]
		}
		if len(rest) < bindingSize+4 {
			return nil, fmt.Errorf("%w: entry %d truncated", ErrKeyFile, i)
		}
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

// Find returns the entry of entries that opens blob: the entry bound to
// blob's SHA-256, else the entry bound to the key ID blob names in its
// header (BlobKeyID: not authenticated before the blob opens, so the
// caller checks the unsealed key with Holds and decrypts the blob), else
// a legacy entry (bound to nothing; the caller's decryption of blob
// decides), else false.
func Find(entries []KeyEntry, blob []byte) (KeyEntry, bool) {
	b := Binding(blob)
	for _, e := range entries {
		if !e.Legacy && !e.ByKeyID && e.Binding == b {
			return e, true
		}
	}
	if id, ok := BlobKeyID(blob); ok {
		for _, e := range entries {
			if e.ByKeyID && e.Binding == id {
				return e, true
			}
		}
	}
	for _, e := range entries {
		if e.Legacy {
			return e, true
		}
	}
	return KeyEntry{}, false
}

// HeaderKeyIDField is the field of a sealed blob's JSON header that names
// the data key the blob is sealed under: the hex of its KeyID. The header
// is authenticated under the data key, so a blob whose header names
// another key than the one that seals it does not open.
const HeaderKeyIDField = "dataKeyID"

// KeyIDText is the value of HeaderKeyIDField for dek.
func KeyIDText(dek []byte) string {
	id := KeyID(dek)
	return hex.EncodeToString(id[:])
}

// BlobKeyID returns the key ID that a sealed blob's header names
// (HeaderKeyIDField), read without a key: untrusted until the blob opens.
// ok is false for a blob that names none (written before key IDs, or not
// a sealed blob with a JSON header).
func BlobKeyID(blob []byte) (id [32]byte, ok bool) {
	hdr, err := ReadHeader(blob)
	if err != nil || len(hdr) == 0 || hdr[0] != '{' {
		return id, false
	}
	var h map[string]json.RawMessage
	if json.Unmarshal(hdr, &h) != nil {
		return id, false
	}
	raw, found := h[HeaderKeyIDField]
	if !found {
		return id, false
	}
	var text string
	if json.Unmarshal(raw, &text) != nil || len(text) != 2*len(id) {
		return id, false
	}
	if _, err := hex.Decode(id[:], []byte(text)); err != nil {
		return [32]byte{}, false
	}
	return id, true
}
