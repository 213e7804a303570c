package client

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quarry-cc/quarry/api/logchain"
	v2 "github.com/quarry-cc/quarry/api/v2"
)

// The verifiable update log (docs/update-log.md): entries chained by
// SHA-256, the head signed by the Coordinator's root key.
type (
	// LogRecord is one entry with its sequence number and chain hash.
	LogRecord = logchain.Record
	// LogHead is a log's entry count and last hash.
	LogHead = logchain.Head
	// LogCheckpoint is a head signed by the root key.
	LogCheckpoint = logchain.Checkpoint
)

// Verification failures of the update log, each naming what was found
// (errors wrap them; test with errors.Is).
var (
	ErrLogEntryAltered      = logchain.ErrEntryAltered
	ErrLogEntryMissing      = logchain.ErrEntryMissing
	ErrLogEntriesReordered  = logchain.ErrEntriesReordered
	ErrLogHeadMismatch      = logchain.ErrHeadMismatch
	ErrCheckpointSignature  = logchain.ErrCheckpointSignature
	ErrCheckpointNotExtends = logchain.ErrNotExtension
	// ErrLogRestored: the log does not extend a saved checkpoint because
	// a restore from a backup, recorded in the log, discarded entries
	// after it (a *LogRestoredError says where). It comes with
	// ErrCheckpointNotExtends: a restore is not an extension.
	ErrLogRestored = logchain.ErrRestored
)

// LogRestoredError explains a checkpoint that a restore from a backup
// discarded (docs/update-log.md, "Restores").
type LogRestoredError = logchain.RestoreError

// ErrLogNoRoot: verifying the log needs the pinned root certificate.
var ErrLogNoRoot = errors.New("verifying the update log needs a pinned root certificate (WithRootCertificate)")

// LogPage is one page of GET /api/v2/update-log, decoded (not verified).
type LogPage struct {
	Records []LogRecord
	// Prev is the head before the first record.
	Prev       LogHead
	Checkpoint LogCheckpoint
}

// UpdateLogPage returns up to limit entries (0: the server's default)
// after entry number after, with their hashes and the latest checkpoint
// (GET /api/v2/update-log). Verify it with VerifyLogPage.
func (c *Client) UpdateLogPage(ctx context.Context, after, limit uint64) (*LogPage, error) {
	q := url.Values{v2.QueryAfter: {strconv.FormatUint(after, 10)}}
	if limit > 0 {
		q.Set(v2.QueryLimit, strconv.FormatUint(limit, 10))
	}
	var out v2.UpdateLogPageResponse
	if _, err := c.do(ctx, http.MethodGet, v2.PathUpdateLog, q, nil, &out); err != nil {
		return nil, err
	}
	return DecodeLogPage(after, &out)
}

// DecodeLogPage converts the wire form of a page.
func DecodeLogPage(after uint64, in *v2.UpdateLogPageResponse) (*LogPage, error) {
	prev, err := logchain.ParseHash(in.Prev)
	if err != nil {
		return nil, fmt.Errorf("update log page: prev: %w", err)
	}
	head, err := logchain.ParseHash(in.Checkpoint.Head)
	if err != nil {
		return nil, fmt.Errorf("update log page: checkpoint head: %w", err)
	}
	p := &LogPage{
		Prev:       LogHead{Count: after, Hash: prev},
		Checkpoint: LogCheckpoint{Count: in.Checkpoint.Count, Head: head, Time: in.Checkpoint.Time, Signature: in.Checkpoint.Signature},
		Records:    make([]LogRecord, len(in.Entries)),
	}
	for i, e := range in.Entries {
		h, err := logchain.ParseHash(e.Hash)
		if err != nil {
			return nil, fmt.Errorf("update log page: entry %d: %w", e.Seq, err)
		}
		p.Records[i] = LogRecord{Seq: e.Seq, Entry: e.Entry, Hash: h}
	}
	return p, nil
}

// VerifyLogPage checks a page against the root certificate: the
// checkpoint's signature, and the records chained from from (the head the
// caller has verified up to; the zero head for the start), ending in the
// checkpoint's head when they reach its count. It returns the head after
// the page.
func VerifyLogPage(root *x509.Certificate, from LogHead, p *LogPage) (LogHead, error) {
	return logchain.VerifyPage(root, p.Checkpoint, from, p.Records)
}

// VerifyCheckpointExtension proves that later extends earlier, given the
// entries earlier.Count+1 to later.Count.
func VerifyCheckpointExtension(root *x509.Certificate, earlier, later LogCheckpoint, records []LogRecord) error {
	return logchain.VerifyExtension(root, earlier, later, records)
}

// VerifiedLog is a log verified against the pinned root.
type VerifiedLog struct {
	// Checkpoint is the verified checkpoint; Records are entries From.Count+1
	// to Checkpoint.Count.
	Checkpoint LogCheckpoint
	From       LogHead
	Records    []LogRecord
}

// VerifyUpdateLog fetches the log page by page and verifies it against
// the pinned root certificate: every entry from the first (or, with since,
// from a checkpoint saved earlier, which the current one must extend) to
// the latest checkpoint.
//
// When the log does not extend since, it fetches and verifies the whole
// log and looks for a restore from a backup recorded in it that discarded
// since's entries: the error is then a *LogRestoredError (wrapping
// ErrCheckpointNotExtends and ErrLogRestored) saying at which entry the
// log was restored and what it discarded; otherwise it wraps
// ErrCheckpointNotExtends alone. Either way the log is not accepted as an
// extension of since.
func (c *Client) VerifyUpdateLog(ctx context.Context, since *LogCheckpoint) (*VerifiedLog, error) {
	v, err := c.verifyUpdateLog(ctx, since)
	if since == nil || !errors.Is(err, ErrCheckpointNotExtends) {
		return v, err
	}
	whole, werr := c.verifyUpdateLog(ctx, nil)
	if werr != nil {
		return nil, errors.Join(err, fmt.Errorf("verifying the whole log: %w", werr))
	}
	if why := logchain.ExplainNotExtension(c.Root(), *since, whole.Records); why != nil {
		return nil, why
	}
	return nil, err
}

func (c *Client) verifyUpdateLog(ctx context.Context, since *LogCheckpoint) (*VerifiedLog, error) {
	root := c.Root()
	if root == nil {
		return nil, ErrLogNoRoot
	}
	from := LogHead{}
	if since != nil {
		if err := since.Verify(root); err != nil {
			return nil, fmt.Errorf("saved checkpoint: %w", err)
		}
		from = since.HeadOf()
	}
	first, err := c.UpdateLogPage(ctx, 0, 1)
	if err != nil {
		return nil, err
	}
	target := first.Checkpoint
	if err := target.Verify(root); err != nil {
		return nil, err
	}
	if target.Count < from.Count {
		return nil, fmt.Errorf("%w: the log has %d entries, the saved checkpoint %d", ErrCheckpointNotExtends, target.Count, from.Count)
	}
	out := &VerifiedLog{Checkpoint: target, From: from}
	h := from
	for h.Count < target.Count {
		p, err := c.UpdateLogPage(ctx, h.Count, min(target.Count-h.Count, 10000))
		if err != nil {
			return nil, err
		}
		if len(p.Records) == 0 {
			return nil, fmt.Errorf("%w: the Coordinator returned no entries after %d of %d", ErrLogHeadMismatch, h.Count, target.Count)
		}
		if p.Records[len(p.Records)-1].Seq > target.Count {
			return nil, fmt.Errorf("%w: entry %d is beyond the checkpoint's %d", ErrLogHeadMismatch, p.Records[len(p.Records)-1].Seq, target.Count)
		}
		if h, err = logchain.VerifyRecords(h, p.Records); err != nil {
			if since != nil {
				return nil, fmt.Errorf("%w: %w", ErrCheckpointNotExtends, err)
			}
			return nil, err
		}
		out.Records = append(out.Records, p.Records...)
	}
	if h != target.HeadOf() {
		if since != nil {
			return nil, fmt.Errorf("%w: the entries after it end in %s, the current checkpoint says %s", ErrCheckpointNotExtends, h.Hash, target.Head)
		}
		return nil, fmt.Errorf("%w: entries 1 to %d hash to %s, the checkpoint says %s", ErrLogHeadMismatch, h.Count, h.Hash, target.Head)
	}
	return out, nil
}
