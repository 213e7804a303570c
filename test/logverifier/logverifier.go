// Package logverifier is a verifier of the Coordinator's update log written
// from docs/update-log.md alone, the way a stranger would write one: it
// imports only Go's standard library and none of Quarry's packages (a test
// checks), so that the integration tests can hold Quarry's log and its own
// verification (client/, api/logchain, `quarry manifest log --verify`)
// against an independent reading of the documentation.
package logverifier

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"
)

// Checkpoint is a signed head: docs/update-log.md, "Checkpoints".
type Checkpoint struct {
	Count     uint64 `json:"count"`
	Head      string `json:"head"`
	Time      string `json:"time"`
	Signature []byte `json:"signature"`
}

// Entry is one entry of a page: its number, its text and hash(seq).
type Entry struct {
	Seq   uint64 `json:"seq"`
	Entry string `json:"entry"`
	Hash  string `json:"hash"`
}

// Page is the data of GET /api/v2/update-log.
type Page struct {
	Entries    []Entry    `json:"entries"`
	Prev       string     `json:"prev"`
	Checkpoint Checkpoint `json:"checkpoint"`
}

// Hash is a chain hash.
type Hash [32]byte

func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// ChainHash is hash(n) of the documentation: SHA-256 over the ASCII
// "quarry-update-log/v1", a zero byte, the raw previous hash, n as 8 bytes
// big-endian, and the entry's UTF-8 bytes.
func ChainHash(prev Hash, n uint64, entry string) Hash {
	var buf bytes.Buffer
	buf.WriteString("quarry-update-log/v1")
	buf.WriteByte(0)
	buf.Write(prev[:])
	var nb [8]byte
	binary.BigEndian.PutUint64(nb[:], n)
	buf.Write(nb[:])
	buf.WriteString(entry)
	return sha256.Sum256(buf.Bytes())
}

// SignedBytes are the four lines a checkpoint's signature covers.
func SignedBytes(cp Checkpoint) []byte {
	return []byte("quarry-update-log-checkpoint/v1\n" +
		"count " + strconv.FormatUint(cp.Count, 10) + "\n" +
		"head " + cp.Head + "\n" +
		"time " + cp.Time + "\n")
}

var (
	timeForm = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$`)
	hexForm  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Errors name what the verifier found.
var (
	ErrSignature  = errors.New("checkpoint signature does not verify against the root")
	ErrForm       = errors.New("not in the documented form")
	ErrChain      = errors.New("entries do not chain")
	ErrHead       = errors.New("entries do not end in the checkpoint's head")
	ErrNotExtends = errors.New("the log does not extend the saved checkpoint")
	ErrAPI        = errors.New("the API answered otherwise than documented")
)

// VerifyCheckpoint checks a checkpoint's form and its ECDSA signature by
// the root certificate's key over SHA-256 of its signed bytes (DER).
func VerifyCheckpoint(root *x509.Certificate, cp Checkpoint) error {
	if !timeForm.MatchString(cp.Time) {
		return fmt.Errorf("%w: checkpoint time %q", ErrForm, cp.Time)
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000Z", cp.Time); err != nil {
		return fmt.Errorf("%w: checkpoint time %q: %v", ErrForm, cp.Time, err)
	}
	if !hexForm.MatchString(cp.Head) {
		return fmt.Errorf("%w: checkpoint head %q", ErrForm, cp.Head)
	}
	pub, ok := root.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("%w: the root has no ECDSA key", ErrSignature)
	}
	d := sha256.Sum256(SignedBytes(cp))
	if !ecdsa.VerifyASN1(pub, d[:], cp.Signature) {
		return ErrSignature
	}
	return nil
}

// Fetch gets one page: after and limit as given (limit < 0: none sent).
// It returns the HTTP status and the JSend message when the answer is not
// a success.
type Fetch func(ctx context.Context, after uint64, limit int) (*Page, int, string, error)

// HTTPFetch fetches pages from base ("https://host:port") with hc. The
// transport is not part of the verification: everything is checked
// against the root.
func HTTPFetch(hc *http.Client, base string) Fetch {
	return func(ctx context.Context, after uint64, limit int) (*Page, int, string, error) {
		q := url.Values{"after": {strconv.FormatUint(after, 10)}}
		if limit >= 0 {
			q.Set("limit", strconv.Itoa(limit))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v2/update-log?"+q.Encode(), nil)
		if err != nil {
			return nil, 0, "", err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return nil, resp.StatusCode, "", err
		}
		var js struct {
			Status  string          `json:"status"`
			Data    json.RawMessage `json:"data"`
			Message string          `json:"message"`
		}
		if err := json.Unmarshal(body, &js); err != nil {
			return nil, resp.StatusCode, "", fmt.Errorf("%w: not JSend: %v", ErrAPI, err)
		}
		if resp.StatusCode != http.StatusOK || js.Status != "success" {
			return nil, resp.StatusCode, js.Message, nil
		}
		var p Page
		dec := json.NewDecoder(bytes.NewReader(js.Data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, resp.StatusCode, "", fmt.Errorf("%w: page: %v", ErrAPI, err)
		}
		return &p, resp.StatusCode, "", nil
	}
}

// Log is a verified log: its checkpoint and entries 1 to its count.
type Log struct {
	Checkpoint Checkpoint
	Entries    []Entry
}

// HashAt returns hash(n) of the log, recomputed (n from 1 to the count).
func (l *Log) HashAt(n uint64) (Hash, bool) {
	if n < 1 || n > uint64(len(l.Entries)) {
		return Hash{}, false
	}
	h := Hash{}
	for _, e := range l.Entries[:n] {
		h = ChainHash(h, e.Seq, e.Entry)
	}
	return h, true
}

// Verify fetches the whole log in pages of pageSize (-1: the server's
// default) and verifies it: the first page's checkpoint against root,
// every page's prev, sequence numbers and per-entry hashes, and that the
// entries up to the checkpoint's count end in its head. Pages may carry
// later checkpoints (the log may grow meanwhile); each must verify and
// cover its page.
func Verify(ctx context.Context, fetch Fetch, root *x509.Certificate, pageSize int) (*Log, error) {
	first, status, msg, err := fetch(ctx, 0, pageSize)
	if err != nil {
		return nil, err
	}
	if first == nil {
		return nil, fmt.Errorf("%w: first page: HTTP %d %q", ErrAPI, status, msg)
	}
	cp := first.Checkpoint
	if err := VerifyCheckpoint(root, cp); err != nil {
		return nil, err
	}
	log := &Log{Checkpoint: cp}
	h := Hash{}
	page := first
	for uint64(len(log.Entries)) < cp.Count {
		n := uint64(len(log.Entries))
		if page == nil {
			if page, status, msg, err = fetch(ctx, n, pageSize); err != nil {
				return nil, err
			}
			if page == nil {
				return nil, fmt.Errorf("%w: page after %d: HTTP %d %q", ErrAPI, n, status, msg)
			}
		}
		if page.Prev != h.String() {
			return nil, fmt.Errorf("%w: page after %d has prev %s, the hash of entry %d is %s", ErrChain, n, page.Prev, n, h)
		}
		if err := VerifyCheckpoint(root, page.Checkpoint); err != nil {
			return nil, fmt.Errorf("page after %d: %w", n, err)
		}
		if page.Checkpoint.Count < n+uint64(len(page.Entries)) {
			return nil, fmt.Errorf("%w: page after %d has %d entries, its checkpoint only %d", ErrAPI, n, len(page.Entries), page.Checkpoint.Count)
		}
		if len(page.Entries) == 0 {
			return nil, fmt.Errorf("%w: no entries after %d of %d", ErrHead, n, cp.Count)
		}
		for _, e := range page.Entries {
			if uint64(len(log.Entries)) == cp.Count {
				break // beyond the checkpoint fixed at the start
			}
			if e.Seq != uint64(len(log.Entries))+1 {
				return nil, fmt.Errorf("%w: entry %d where %d was due", ErrChain, e.Seq, len(log.Entries)+1)
			}
			h = ChainHash(h, e.Seq, e.Entry)
			if e.Hash != h.String() {
				return nil, fmt.Errorf("%w: entry %d hashes to %s, the page says %s", ErrChain, e.Seq, h, e.Hash)
			}
			log.Entries = append(log.Entries, e)
		}
		page = nil
	}
	if h.String() != cp.Head {
		return nil, fmt.Errorf("%w: entries 1 to %d hash to %s, the checkpoint says %s", ErrHead, cp.Count, h, cp.Head)
	}
	return log, nil
}

// VerifyEntries verifies entries 1 to cp.Count offline against cp and
// root, recomputing every hash; the entries' own hash fields must agree.
func VerifyEntries(root *x509.Certificate, cp Checkpoint, entries []Entry) error {
	if err := VerifyCheckpoint(root, cp); err != nil {
		return err
	}
	if uint64(len(entries)) != cp.Count {
		return fmt.Errorf("%w: %d entries, the checkpoint says %d", ErrHead, len(entries), cp.Count)
	}
	h := Hash{}
	for i, e := range entries {
		if e.Seq != uint64(i)+1 {
			return fmt.Errorf("%w: entry %d where %d was due", ErrChain, e.Seq, i+1)
		}
		h = ChainHash(h, e.Seq, e.Entry)
		if e.Hash != h.String() {
			return fmt.Errorf("%w: entry %d hashes to %s, its hash field says %s", ErrChain, e.Seq, h, e.Hash)
		}
	}
	if h.String() != cp.Head {
		return fmt.Errorf("%w: the entries hash to %s, the checkpoint says %s", ErrHead, h, cp.Head)
	}
	return nil
}

// Fields decodes an entry's JSON object.
func Fields(e Entry) (map[string]any, error) {
	var m map[string]any
	if err := json.Unmarshal([]byte(e.Entry), &m); err != nil {
		return nil, fmt.Errorf("%w: entry %d is not a JSON object: %v", ErrForm, e.Seq, err)
	}
	return m, nil
}

// Select returns the entries whose "update" is update.
func (l *Log) Select(update string) []Entry {
	var out []Entry
	for _, e := range l.Entries {
		if m, err := Fields(e); err == nil && m["update"] == update {
			out = append(out, e)
		}
	}
	return out
}

// Restore is a "quarry: restored from backup" record.
type Restore struct {
	Seq           uint64
	BackupCreated string      `json:"backupCreated"`
	RestoredCount uint64      `json:"restoredCount"`
	RestoredHead  string      `json:"restoredHead"`
	ReplacedState string      `json:"replacedState"`
	Replaced      *Checkpoint `json:"replaced"`
}

// Restores returns the log's restore records.
func (l *Log) Restores() ([]Restore, error) {
	var out []Restore
	for _, e := range l.Select("quarry: restored from backup") {
		var r Restore
		if err := json.Unmarshal([]byte(e.Entry), &r); err != nil {
			return nil, fmt.Errorf("%w: restore record %d: %v", ErrForm, e.Seq, err)
		}
		r.Seq = e.Seq
		out = append(out, r)
	}
	return out, nil
}

// Verdict is how a verified log relates to a saved checkpoint.
type Verdict struct {
	// Extends: the log's entry saved.Count hashes to saved.Head.
	Extends bool
	// Restore, when the log does not extend saved, is the restore record
	// that explains it (restored before saved's count, at the log's own
	// hash there); Exact when it names saved as the head it replaced.
	Restore *Restore
	Exact   bool
}

// Check relates log to saved, a checkpoint verified against root.
func Check(root *x509.Certificate, saved Checkpoint, log *Log) (Verdict, error) {
	if err := VerifyCheckpoint(root, saved); err != nil {
		return Verdict{}, fmt.Errorf("saved checkpoint: %w", err)
	}
	if h, ok := log.HashAt(saved.Count); ok && h.String() == saved.Head {
		return Verdict{Extends: true}, nil
	}
	rs, err := log.Restores()
	if err != nil {
		return Verdict{}, err
	}
	var v Verdict
	for i := range rs {
		r := &rs[i]
		h, ok := log.HashAt(r.RestoredCount)
		if !ok || r.RestoredCount >= r.Seq || r.RestoredCount >= saved.Count || h.String() != r.RestoredHead {
			continue
		}
		if r.Replaced != nil && VerifyCheckpoint(root, *r.Replaced) != nil {
			continue
		}
		if r.Replaced != nil && r.Replaced.Count == saved.Count && r.Replaced.Head == saved.Head {
			return Verdict{Restore: r, Exact: true}, nil
		}
		v.Restore = r
	}
	return v, nil
}

// ParseSaved reads a saved-checkpoint file: a JSON object with exactly
// count, head, time and signature.
func ParseSaved(b []byte) (Checkpoint, error) {
	var cp Checkpoint
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cp); err != nil {
		return cp, fmt.Errorf("%w: saved checkpoint: %v", ErrForm, err)
	}
	return cp, nil
}

// EncodeSaved writes a saved-checkpoint file as `quarry manifest log
// --save-checkpoint` does: indented by two spaces, ending in a newline.
func EncodeSaved(cp Checkpoint) []byte {
	b, _ := json.MarshalIndent(cp, "", "  ")
	return append(b, '\n')
}
