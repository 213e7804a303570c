package logchain

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"time"
)

// Checkpoint is a head signed by the Coordinator's root key (the key of
// the root certificate clients pin; P-384 for a root Quarry made) when the
// log changed: the signature is ECDSA, DER-encoded, over
// SHA-256(SignedBytes()) (docs/update-log.md, "Checkpoints").
type Checkpoint struct {
	Count uint64 `json:"count"`
	Head  Hash   `json:"head"`
	// Time is when the head was signed (TimeFormat, UTC).
	Time      string `json:"time"`
	Signature []byte `json:"signature"`
}

// TimeFormat is the format of a checkpoint's time (applied to UTC times),
// as the update log's entries use it.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// checkpointDomain starts the signed bytes.
const checkpointDomain = "quarry-update-log-checkpoint/v1\n"

// SignedBytes are the bytes the signature covers.
func (c Checkpoint) SignedBytes() []byte {
	return fmt.Appendf(nil, "%scount %d\nhead %s\ntime %s\n", checkpointDomain, c.Count, c.Head, c.Time)
}

// HeadOf returns the checkpoint's head.
func (c Checkpoint) HeadOf() Head { return Head{Count: c.Count, Hash: c.Head} }

// Sign returns the checkpoint of head at now, signed by key (the root key).
func Sign(rand io.Reader, key *ecdsa.PrivateKey, head Head, now time.Time) (Checkpoint, error) {
	c := Checkpoint{Count: head.Count, Head: head.Hash, Time: now.UTC().Format(TimeFormat)}
	digest := sha256.Sum256(c.SignedBytes())
	sig, err := ecdsa.SignASN1(rand, key, digest[:])
	if err != nil {
		return Checkpoint{}, fmt.Errorf("signing update log checkpoint: %w", err)
	}
	c.Signature = sig
	return c, nil
}

var (
	// ErrCheckpointSignature: the checkpoint is not signed by the pinned
	// root (another Coordinator's root, or changed after signing).
	ErrCheckpointSignature = errors.New("update log checkpoint is not signed by the pinned root certificate")
	// ErrNotExtension: a later checkpoint does not extend an earlier one
	// (the log was rewritten, truncated, or forked).
	ErrNotExtension = errors.New("update log checkpoint does not extend the earlier checkpoint")
)

// Verify checks the signature against the root certificate's ECDSA key.
func (c Checkpoint) Verify(root *x509.Certificate) error {
	pub, ok := root.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("%w: the root certificate has no ECDSA key", ErrCheckpointSignature)
	}
	if t, err := time.Parse(TimeFormat, c.Time); err != nil || t.UTC().Format(TimeFormat) != c.Time {
		return fmt.Errorf("%w: bad time %q (the form is 2006-01-02T15:04:05.000Z: UTC, milliseconds)", ErrCheckpointSignature, c.Time)
	}
	digest := sha256.Sum256(c.SignedBytes())
	if !ecdsa.VerifyASN1(pub, digest[:], c.Signature) {
		return ErrCheckpointSignature
	}
	return nil
}

// VerifyPage checks a page of records against a signed checkpoint: the
// checkpoint's signature by root, and that the records continue from (the
// head before the page's first record; the zero Head for the start) and,
// when the page reaches the checkpoint's count, end exactly in its head.
// It returns the head after the page.
func VerifyPage(root *x509.Certificate, cp Checkpoint, from Head, records []Record) (Head, error) {
	if err := cp.Verify(root); err != nil {
		return from, err
	}
	h, err := VerifyRecords(from, records)
	if err != nil {
		return h, err
	}
	if h.Count > cp.Count {
		return h, fmt.Errorf("%w: the page goes to entry %d, beyond the checkpoint's %d", ErrHeadMismatch, h.Count, cp.Count)
	}
	if h.Count == cp.Count && h.Hash != cp.Head {
		return h, fmt.Errorf("%w: entries 1 to %d hash to %s, the checkpoint says %s", ErrHeadMismatch, h.Count, h.Hash, cp.Head)
	}
	return h, nil
}

// VerifyExtension proves that later extends earlier: both signed by root,
// later not shorter, and records (entries earlier.Count+1 to later.Count)
// chained from earlier's head to exactly later's head.
func VerifyExtension(root *x509.Certificate, earlier, later Checkpoint, records []Record) error {
	if err := earlier.Verify(root); err != nil {
		return fmt.Errorf("earlier checkpoint: %w", err)
	}
	if err := later.Verify(root); err != nil {
		return fmt.Errorf("later checkpoint: %w", err)
	}
	if later.Count < earlier.Count {
		return fmt.Errorf("%w: it has %d entries, the earlier one %d", ErrNotExtension, later.Count, earlier.Count)
	}
	h, err := VerifyRecords(earlier.HeadOf(), records)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotExtension, err)
	}
	if h != later.HeadOf() {
		return fmt.Errorf("%w: entries %d to %d from the earlier head end in %s at %d, the later checkpoint says %s at %d",
			ErrNotExtension, earlier.Count+1, later.Count, h.Hash, h.Count, later.Head, later.Count)
	}
	return nil
}
