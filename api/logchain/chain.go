// Package logchain is the verifiable update log's wire contract
// (docs/update-log.md): how entries are chained by hash, how a head is
// signed as a checkpoint by the Coordinator's root key, and how a client
// verifies pages of entries and that a later checkpoint extends an earlier
// one. It is pure (no I/O), shared by the Coordinator and the SDK.
package logchain

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// The verifiable log (docs/update-log.md): every entry is chained to the
// one before it by
//
//	hash(n) = SHA-256("quarry-update-log/v1" ‖ 0x00 ‖ hash(n-1) ‖ uint64be(n) ‖ entry bytes)
//
// where n is the entry's sequence number (1 for the first entry) and
// hash(0) is 32 zero bytes. The head of a log of n entries is (n, hash(n));
// a checkpoint is a head signed by the root key.

// hashDomain separates the chain's hashes from every other SHA-256 use.
const hashDomain = "quarry-update-log/v1\x00"

// Hash is an entry's chain hash.
type Hash [sha256.Size]byte

// String is the lowercase hex of h.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// MarshalText encodes h as lowercase hex.
func (h Hash) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText decodes lowercase or uppercase hex of exactly 32 bytes.
func (h *Hash) UnmarshalText(b []byte) error {
	p, err := ParseHash(string(b))
	if err != nil {
		return err
	}
	*h = p
	return nil
}

// ErrBadHash means a hash is not 64 hex digits.
var ErrBadHash = errors.New("update log hash is not 64 hex digits")

// ParseHash decodes 64 hex digits.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if len(s) != 2*len(h) {
		return h, ErrBadHash
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, ErrBadHash
	}
	return h, nil
}

// Next returns the hash of the entry with sequence number seq whose
// predecessor has hash prev.
func Next(prev Hash, seq uint64, entry string) Hash {
	d := sha256.New()
	d.Write([]byte(hashDomain))
	d.Write(prev[:])
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], seq)
	d.Write(n[:])
	d.Write([]byte(entry))
	var h Hash
	d.Sum(h[:0])
	return h
}

// Head is the state of a log: how many entries it has and the hash of the
// last one (the zero Hash for an empty log).
type Head struct {
	Count uint64 `json:"count"`
	Hash  Hash   `json:"hash"`
}

// Append returns the head after entries are appended to h.
func (h Head) Append(entries ...string) Head {
	for _, e := range entries {
		h.Count++
		h.Hash = Next(h.Hash, h.Count, e)
	}
	return h
}

// Record is one entry with its sequence number and chain hash, as the
// verifiable API returns it.
type Record struct {
	Seq   uint64 `json:"seq"`
	Entry string `json:"entry"`
	Hash  Hash   `json:"hash"`
}

// Verification failures. Each names what was found; errors wrap one of
// them and say where.
var (
	// ErrEntryAltered: an entry's bytes do not hash to the hash given for
	// it (an entry was changed).
	ErrEntryAltered = errors.New("update log entry altered: its bytes do not match its chain hash")
	// ErrEntryMissing: a sequence number is skipped (an entry was removed).
	ErrEntryMissing = errors.New("update log entry missing: a sequence number is skipped")
	// ErrEntriesReordered: sequence numbers go backwards or repeat.
	ErrEntriesReordered = errors.New("update log entries reordered: sequence numbers are out of order")
	// ErrHeadMismatch: the recomputed chain does not end in the signed
	// head (entries were changed and their hashes recomputed, or entries
	// are missing at the end).
	ErrHeadMismatch = errors.New("update log does not match the signed checkpoint")
)

// VerifyRecords checks that records continue the log whose head is from:
// sequence numbers from.Count+1 on without gap, each hash recomputed from
// the previous one and the entry's exact bytes. It returns the head after
// the last record.
func VerifyRecords(from Head, records []Record) (Head, error) {
	for i := 1; i < len(records); i++ {
		if records[i].Seq <= records[i-1].Seq {
			return from, fmt.Errorf("%w: entry %d comes after entry %d (records %d and %d of the page)", ErrEntriesReordered, records[i].Seq, records[i-1].Seq, i-1, i)
		}
	}
	h := from
	for i, r := range records {
		switch {
		case r.Seq <= h.Count:
			return h, fmt.Errorf("%w: entry %d follows entry %d (record %d of the page)", ErrEntriesReordered, r.Seq, h.Count, i)
		case r.Seq > h.Count+1:
			return h, fmt.Errorf("%w: entries %d to %d are not there (record %d of the page is entry %d)", ErrEntryMissing, h.Count+1, r.Seq-1, i, r.Seq)
		}
		next := Next(h.Hash, r.Seq, r.Entry)
		if next != r.Hash {
			return h, fmt.Errorf("%w: entry %d does not chain from entry %d (its bytes were changed, or the entries from it on come from another copy of the log spliced in here)", ErrEntryAltered, r.Seq, h.Count)
		}
		h = Head{Count: r.Seq, Hash: next}
	}
	return h, nil
}

// Chain returns entries as records continuing from.
func Chain(from Head, entries []string) []Record {
	out := make([]Record, len(entries))
	h := from
	for i, e := range entries {
		h = h.Append(e)
		out[i] = Record{Seq: h.Count, Entry: e, Hash: h.Hash}
	}
	return out
}
