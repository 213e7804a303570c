// Package sealedstate holds the types of the Coordinator's sealed state and
// their JSON encoding: the state inside the encryption (State, with its
// update log head Log and a pending full update PendingUpdate) and the
// public, authenticated header beside it (Header). It is the format the
// seal directory and etcd hold (docs/sealing.md): its field names are the
// stored JSON's, so renaming one breaks every state already stored
// (testdata/ holds states written before this package existed; the tests
// check they still decode and encode to the same bytes).
//
// The package only describes and encodes; the core builds its in-memory
// snapshot from a State and writes a changed State through the vault, and
// MarbleRun migration (internal/migrate) produces one.
package sealedstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/updatelog"
	"github.com/quarry-cc/quarry/manifest"
)

// Format is the schema version of State and Header this package writes
// and reads.
const Format = 1

// Running is the state code a stored state has: a manifest is set and
// Marbles are accepted (MarbleRun's number, which clients read from the
// status endpoint). A state is stored only once a manifest is set.
const Running = 3

// ErrFormat means a decrypted state has a schema version this Coordinator
// does not read.
var ErrFormat = errors.New("unsupported state format")

// State is what the sealed blob holds (JSON inside the encryption).
type State struct {
	// Format is the schema version of this structure.
	Format int
	// State is the state code (Running for every stored state).
	State             int
	CA                ca.Persisted
	RootSecret        []byte
	Manifest          []byte
	ManifestSignature []byte
	// Packages are the effective packages (the manifest's, changed by
	// package updates).
	Packages map[string]manifest.Package
	// Secrets are the generated and uploaded secret values by name.
	Secrets map[string]secrets.Secret
	// PreviousSecrets are the values from before the last full update
	// (templates' .Previous.Secrets).
	PreviousSecrets map[string]secrets.Secret `json:",omitempty"`
	// PreviousRootSecret is the root secret before the last rotation.
	PreviousRootSecret []byte `json:",omitempty"`
	// UpdateLog is the tail of the append-only log of applied changes
	// (one JSON entry per string): the entries after the last full
	// segment stored beside the state (docs/update-log.md). In a state
	// from before the verifiable log (no Log) it is the whole log.
	UpdateLog []string `json:",omitempty"`
	// Log is the update log's head.
	Log *Log `json:",omitempty"`
	// Pending is the full manifest update waiting for acknowledgements.
	Pending *PendingUpdate `json:",omitempty"`
	// Activations counts the activations of each Marble type with
	// MaxActivations (never reset, not even by updates).
	Activations map[string]uint64 `json:",omitempty"`
	// MonotonicCounters are the Marbles' counters by counter key.
	MonotonicCounters map[string]uint64 `json:",omitempty"`
	// RecoverySecrets are the encrypted recovery secrets last handed out
	// (at manifest set, or by the update that changed the recovery keys),
	// kept so that a lost response can be fetched again. They are
	// encrypted to the recovery keys' holders.
	RecoverySecrets map[string][]byte `json:",omitempty"`
}

// Encode returns the state's JSON (the plaintext that is sealed).
func Encode(st *State) ([]byte, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("encoding state: %w", err)
	}
	return b, nil
}

// Decode reads a decrypted state (seal.DecodeJSON's rules); a state of
// another Format is an error wrapping ErrFormat.
func Decode(plaintext []byte) (*State, error) {
	var st State
	if err := seal.DecodeJSON(plaintext, &st); err != nil {
		return nil, err
	}
	if st.Format != Format {
		return nil, fmt.Errorf("%w %d (this Coordinator reads format %d)", ErrFormat, st.Format, Format)
	}
	return &st, nil
}

// Log is the head of the update log in the sealed state
// (docs/update-log.md): the full segments are stored beside the state,
// the entries after them (the tail) are the state's UpdateLog.
type Log struct {
	// ID identifies this log (a new one with every new manifest set).
	ID []byte
	// Key seals the segments (32 bytes). It is kept in the state rather
	// than the data key so that a new data key does not orphan segments.
	Key []byte
	// Count and Head are the number of entries and the last entry's hash.
	Count uint64
	Head  logchain.Hash
	// Segments is the number of full segments stored; the tail (the
	// state's UpdateLog) holds entries Segments*SegmentSize+1 on.
	Segments uint64
	// TailPrev is the hash before the tail's first entry.
	TailPrev logchain.Hash
	// Checkpoint is the head signed by the root key at the last change.
	Checkpoint logchain.Checkpoint
	// CounterIncrements counts the monotonic-counter increments;
	// RecordedIncrements and RecordedActivations are the counts (and the
	// state's Activations) the log last recorded. Marble activity is
	// recorded only as counts, with the next entry.
	CounterIncrements   uint64            `json:",omitempty"`
	RecordedIncrements  uint64            `json:",omitempty"`
	RecordedActivations map[string]uint64 `json:",omitempty"`
}

// Chain returns the log's head as the hash chain sees it.
func (l *Log) Chain() logchain.Head { return logchain.Head{Count: l.Count, Hash: l.Head} }

// Counted returns a copy of l with one more counter increment (nil for
// nil).
func (l *Log) Counted() *Log {
	if l == nil {
		return nil
	}
	n := *l
	n.CounterIncrements++
	return &n
}

// PendingUpdate is a full manifest update waiting for acknowledgements.
// It is part of the sealed state and survives restarts.
type PendingUpdate struct {
	ManifestRaw []byte
	// RequiredUsers may acknowledge: the users holding UpdateManifest when
	// the update was initiated (sorted).
	RequiredUsers []string
	// Acknowledged lists who has acknowledged (the initiator first).
	Acknowledged []string
	// Needed is the number of acknowledgements that apply the update.
	Needed int
}

// MissingAcknowledgments is how many acknowledgements are still needed.
func (p *PendingUpdate) MissingAcknowledgments() int { return max(p.Needed-len(p.Acknowledged), 0) }

// MissingUsers are the required users who have not acknowledged.
func (p *PendingUpdate) MissingUsers() []string {
	var out []string
	for _, u := range p.RequiredUsers {
		if !slices.Contains(p.Acknowledged, u) {
			out = append(out, u)
		}
	}
	return out
}

// Header is the public, authenticated part of the sealed blob: what
// recovery needs before the state can be decrypted.
type Header struct {
	Format   int             `json:"format"`
	Recovery recovery.Public `json:"recovery"`
	// MarbleRunShares are the share hashes of a state migrated from
	// MarbleRun with XOR or Shamir recovery (docs/migration.md): MarbleRun
	// does not record which recovery key holds which share, so
	// Recovery.Keys carry no share hashes and each upload is matched to
	// its key by its signature.
	MarbleRunShares []string `json:"marbleRunShares,omitempty"`
	// DataKeyID names the data key the blob is sealed under: the hex of
	// seal.KeyID, seal.HeaderKeyIDField. The key file binds the data key
	// to it, so every blob of one key opens with the same key file entry
	// (docs/sealing.md). Absent in a blob written before key IDs.
	DataKeyID string `json:"dataKeyID,omitempty"`
	// The update log's latest checkpoint (set at every commit), which
	// `coordinator restore` reads without the data key
	// (docs/update-log.md, "Restores").
	updatelog.HeaderCheckpoint
}

// EncodeHeader returns the header's JSON.
func EncodeHeader(h Header) ([]byte, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encoding header: %w", err)
	}
	return b, nil
}

// ParseHeader reads a header's JSON (as seal.Open returns it).
func ParseHeader(raw []byte) (Header, error) {
	var h Header
	if err := json.Unmarshal(raw, &h); err != nil {
		return Header{}, err
	}
	return h, nil
}

// ReadHeader reads the public header of a sealed blob without a key; a
// header that is not JSON wraps seal.ErrCorrupt.
func ReadHeader(blob []byte) (Header, error) {
	raw, err := seal.ReadHeader(blob)
	if err != nil {
		return Header{}, err
	}
	h, err := ParseHeader(raw)
	if err != nil {
		return Header{}, fmt.Errorf("%w: header: %v", seal.ErrCorrupt, err)
	}
	return h, nil
}
