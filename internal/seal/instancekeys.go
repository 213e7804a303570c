package seal

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Key file format version 2 holds the data key once per Coordinator
// instance sharing one state (store etcd, docs/ha.md "The data key"). An
// instance's entry is the data key sealed by that instance's KeySealer —
// for its own CPU and enclave — so no other instance can re-seal it. The
// binding of a key to the sealed blob it opens (docs/design/decisions.md#d17) is therefore kept
// outside the sealed entries, authenticated under the data key itself:
//
//	keyID   = HMAC-SHA256(dek, "quarry key id v2")
//	tag     = HMAC-SHA256(dek, "quarry key binding v2" ‖ binding)
//
// An entry is sealed with its key ID as the sealer's binding (it never
// changes while the data key stays), and a record binds the key ID to the
// SHA-256 of a blob with the tag. An instance that commits a new blob
// knows the data key, so it writes new records for every instance, and
// copies the others' sealed entries unchanged.
//
//	magic "QRYKEY\x00\x01" (8 bytes)
//	version  u16 little-endian (2)
//	records  u8, 1 or 2
//	records × { keyID 32 bytes ‖ binding 32 bytes ‖ tag 32 bytes }
//	entries  u16 little-endian, 1 to MaxInstanceEntries
//	entries × {
//	    instance  16 bytes (the instance id)
//	    keyID     32 bytes
//	    length L  u32 little-endian
//	    sealed    L bytes, from KeySealer.SealKey(dek, keyID, mode)
//	}
//
// Nothing may follow the last entry.

// InstanceKeyFileVersion is the key file version with per-instance entries.
const InstanceKeyFileVersion = 2

// InstanceIDSize is the size of an instance id.
const InstanceIDSize = 16

// MaxInstanceEntries bounds the entries of a version 2 key file; a commit
// drops the oldest entries of other instances beyond it.
const MaxInstanceEntries = 64

// maxKeyRecords is the most records (key bound to blob) a key file holds:
// the new one and, while the data key changes, the current one (docs/design/decisions.md#d17).
const maxKeyRecords = 2

// InstanceID names one Coordinator instance in a key file.
type InstanceID [InstanceIDSize]byte

// KeyRecord binds a data key (by its key ID) to the sealed blob it opens.
type KeyRecord struct {
	KeyID   [32]byte
	Binding [32]byte
	Tag     [32]byte
}

// InstanceEntry is one instance's sealed copy of a data key.
type InstanceEntry struct {
	Instance InstanceID
	KeyID    [32]byte
	Sealed   []byte
}

// InstanceKeyFile is a decoded key file of version 2.
type InstanceKeyFile struct {
	Records []KeyRecord
	Entries []InstanceEntry
}

// KeyID returns the key ID of a data key.
func KeyID(dek []byte) [32]byte {
	m := hmac.New(sha256.New, dek)
	m.Write([]byte("quarry key id v2"))
	return [32]byte(m.Sum(nil))
}

func bindingTag(dek []byte, binding [32]byte) [32]byte {
	m := hmac.New(sha256.New, dek)
	m.Write([]byte("quarry key binding v2"))
	m.Write(binding[:])
	return [32]byte(m.Sum(nil))
}

// NewKeyRecord binds dek to the blob with SHA-256 binding.
func NewKeyRecord(dek []byte, binding [32]byte) KeyRecord {
	return KeyRecord{KeyID: KeyID(dek), Binding: binding, Tag: bindingTag(dek, binding)}
}

// Verify reports whether dek is the data key of r: its key ID matches and
// the binding's tag is authentic.
func (r KeyRecord) Verify(dek []byte) bool {
	id, tag := KeyID(dek), bindingTag(dek, r.Binding)
	return hmac.Equal(id[:], r.KeyID[:]) && hmac.Equal(tag[:], r.Tag[:])
}

// IsInstanceKeyFile reports whether b starts like a version 2 key file.
func IsInstanceKeyFile(b []byte) bool {
	return len(b) >= len(KeyFileMagic)+2 && string(b[:len(KeyFileMagic)]) == KeyFileMagic &&
		binary.LittleEndian.Uint16(b[len(KeyFileMagic):]) == InstanceKeyFileVersion
}

// Record returns the record bound to blob.
func (f *InstanceKeyFile) Record(blob []byte) (KeyRecord, bool) {
	b := Binding(blob)
	for _, r := range f.Records {
		if r.Binding == b {
			return r, true
		}
	}
	return KeyRecord{}, false
}

// Entry returns the entry of instance id for key keyID.
func (f *InstanceKeyFile) Entry(id InstanceID, keyID [32]byte) (InstanceEntry, bool) {
	for _, e := range f.Entries {
		if e.Instance == id && e.KeyID == keyID {
			return e, true
		}
	}
	return InstanceEntry{}, false
}

// Encode encodes f. Records and entries must be within bounds, every
// entry's key must have a record, and no instance may have two entries for
// one key.
func (f *InstanceKeyFile) Encode() ([]byte, error) {
	if len(f.Records) == 0 || len(f.Records) > maxKeyRecords {
		return nil, fmt.Errorf("seal: a key file holds 1 or %d key records, not %d", maxKeyRecords, len(f.Records))
	}
	if len(f.Entries) == 0 || len(f.Entries) > MaxInstanceEntries {
		return nil, fmt.Errorf("seal: a key file holds 1 to %d instance entries, not %d", MaxInstanceEntries, len(f.Entries))
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(KeyFileMagic)+5+len(f.Records)*96+len(f.Entries)*(InstanceIDSize+36+64))
	out = append(out, KeyFileMagic...)
	out = binary.LittleEndian.AppendUint16(out, InstanceKeyFileVersion)
	out = append(out, byte(len(f.Records)))
	for _, r := range f.Records {
		out = append(out, r.KeyID[:]...)
		out = append(out, r.Binding[:]...)
		out = append(out, r.Tag[:]...)
	}
	out = binary.LittleEndian.AppendUint16(out, uint16(len(f.Entries)))
	for _, e := range f.Entries {
		if len(e.Sealed) == 0 || len(e.Sealed) > maxSealedKey {
			return nil, fmt.Errorf("seal: instance entry with %d sealed bytes", len(e.Sealed))
		}
		out = append(out, e.Instance[:]...)
		out = append(out, e.KeyID[:]...)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(e.Sealed)))
		out = append(out, e.Sealed...)
	}
	return out, nil
}

func (f *InstanceKeyFile) check() error {
	type pair struct {
		id  InstanceID
		key [32]byte
	}
	seen := make(map[pair]bool, len(f.Entries))
	for i, e := range f.Entries {
		known := false
		for _, r := range f.Records {
			known = known || r.KeyID == e.KeyID
		}
		if !known {
			return fmt.Errorf("%w: entry %d is for a key without a record", ErrKeyFile, i)
		}
		p := pair{e.Instance, e.KeyID}
		if seen[p] {
			return fmt.Errorf("%w: entry %d repeats an instance's entry for one key", ErrKeyFile, i)
		}
		seen[p] = true
	}
	return nil
}

// DecodeInstanceKeyFile parses a key file of version 2. The entries'
// Sealed slices are copies.
func DecodeInstanceKeyFile(b []byte) (*InstanceKeyFile, error) {
	if !IsInstanceKeyFile(b) {
		return nil, fmt.Errorf("%w: not a key file of version %d", ErrKeyFile, InstanceKeyFileVersion)
	}
	rest := b[len(KeyFileMagic)+2:]
	if len(rest) < 1 {
		return nil, fmt.Errorf("%w: truncated header", ErrKeyFile)
	}
	n := int(rest[0])
	rest = rest[1:]
	if n == 0 || n > maxKeyRecords {
		return nil, fmt.Errorf("%w: %d key records", ErrKeyFile, n)
	}
	if len(rest) < n*96+2 {
		return nil, fmt.Errorf("%w: key records truncated", ErrKeyFile)
	}
	f := &InstanceKeyFile{}
	for range n {
		var r KeyRecord
		copy(r.KeyID[:], rest)
		copy(r.Binding[:], rest[32:])
		copy(r.Tag[:], rest[64:])
		rest = rest[96:]
		f.Records = append(f.Records, r)
	}
	m := int(binary.LittleEndian.Uint16(rest))
	rest = rest[2:]
	if m == 0 || m > MaxInstanceEntries {
		return nil, fmt.Errorf("%w: %d instance entries", ErrKeyFile, m)
	}
	for i := range m {
		if len(rest) < InstanceIDSize+32+4 {
			return nil, fmt.Errorf("%w: entry %d truncated", ErrKeyFile, i)
		}
		var e InstanceEntry
		copy(e.Instance[:], rest)
		copy(e.KeyID[:], rest[InstanceIDSize:])
		l := binary.LittleEndian.Uint32(rest[InstanceIDSize+32:])
		rest = rest[InstanceIDSize+36:]
		if l == 0 || l > maxSealedKey || uint64(l) > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: entry %d has a sealed key of %d bytes (%d left)", ErrKeyFile, i, l, len(rest))
		}
		e.Sealed = append([]byte{}, rest[:l]...)
		rest = rest[l:]
		f.Entries = append(f.Entries, e)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last entry", ErrKeyFile, len(rest))
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	return f, nil
}
