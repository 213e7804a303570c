package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quarry-cc/quarry/internal/store"
)

// A state too large for one etcd request is kept as a small head (the
// Store's blob) and chunks: blobs under <prefix>chunks/<name>, written and
// deleted only together with, or before, a head that references them
// (docs/ha.md, "What is stored where"). The store does not know which
// head references which chunk; its caller does.

// chunkDir is the key directory of the chunks under the prefix.
const chunkDir = "chunks/"

// Limits of one etcd transaction as this package sends it, within etcd's
// defaults (--max-request-bytes 1.5 MiB, --max-txn-ops 128) with room for
// the keys, the comparisons and the framing.
const (
	// MaxTxnBytes bounds the values one transaction writes.
	MaxTxnBytes = 1 << 20
	// MaxTxnOps bounds the operations (puts and deletes) of one
	// transaction.
	MaxTxnOps = 100
)

// ErrChunkName is returned for a chunk name that is not a plain name.
var ErrChunkName = errors.New("etcdstore: bad chunk name")

func checkChunkName(name string) error {
	if name == "" || len(name) > 200 || strings.ContainsFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	}) {
		return fmt.Errorf("%w %q", ErrChunkName, name)
	}
	return nil
}

func (s *Store) chunkKey(name string) string { return s.c.prefix + chunkDir + name }

// PutChunks stores chunks (name → blob) if s's revision is still prev,
// in transactions of at most MaxTxnBytes and MaxTxnOps; else
// store.ErrConflict. A chunk that exists is overwritten. It is how a head
// too large to be written with its new chunks in one transaction gets
// them stored first; the head written after them references them.
func (s *Store) PutChunks(ctx context.Context, prev store.Revision, chunks map[string][]byte) error {
	cond, ok := cmpRev(s.key, prev)
	if !ok {
		return store.ErrConflict
	}
	names := sortedNames(chunks)
	for len(names) > 0 {
		var ops []clientv3.Op
		size := 0
		for len(names) > 0 && len(ops) < MaxTxnOps && (len(ops) == 0 || size+len(chunks[names[0]]) <= MaxTxnBytes) {
			n := names[0]
			if err := checkChunkName(n); err != nil {
				return err
			}
			if len(chunks[n]) > MaxTxnBytes {
				return fmt.Errorf("etcdstore: chunk %s of %d bytes exceeds %d", n, len(chunks[n]), MaxTxnBytes)
			}
			ops = append(ops, clientv3.OpPut(s.chunkKey(n), string(chunks[n])))
			size += len(chunks[n])
			names = names[1:]
		}
		resp, err := s.c.cli.Txn(ctx).If(cond).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("etcdstore: storing chunks: %w", err)
		}
		if !resp.Succeeded {
			return store.ErrConflict
		}
	}
	return nil
}

// SaveHead is SavePair that also stores puts and deletes the chunks named
// in deletes, all in the one transaction (at most MaxTxnOps puts and
// deletes, MaxTxnBytes in all).
func (s *Store) SaveHead(ctx context.Context, blob []byte, prev store.Revision, other store.Store, otherBlob []byte, otherPrev store.Revision, puts map[string][]byte, deletes []string) (store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("etcdstore: save: %w", err)
	}
	o, err := s.sibling(other)
	if err != nil {
		return "", err
	}
	if len(puts)+len(deletes)+2 > MaxTxnOps {
		return "", fmt.Errorf("etcdstore: save: %d chunk puts and deletes exceed %d operations", len(puts)+len(deletes), MaxTxnOps-2)
	}
	size := len(blob) + len(otherBlob)
	ops := []clientv3.Op{clientv3.OpPut(s.key, string(blob)), clientv3.OpPut(o.key, string(otherBlob))}
	for _, n := range sortedNames(puts) {
		if err := checkChunkName(n); err != nil {
			return "", err
		}
		size += len(puts[n])
		ops = append(ops, clientv3.OpPut(s.chunkKey(n), string(puts[n])))
	}
	for _, n := range deletes {
		if err := checkChunkName(n); err != nil {
			return "", err
		}
		if _, ok := puts[n]; ok {
			return "", fmt.Errorf("etcdstore: save: chunk %s is both written and deleted", n)
		}
		ops = append(ops, clientv3.OpDelete(s.chunkKey(n)))
	}
	if size > MaxTxnBytes {
		return "", fmt.Errorf("etcdstore: save: %d bytes exceed %d", size, MaxTxnBytes)
	}
	c1, ok1 := cmpRev(s.key, prev)
	c2, ok2 := cmpRev(o.key, otherPrev)
	if !ok1 || !ok2 {
		return "", store.ErrConflict
	}
	resp, err := s.c.cli.Txn(ctx).If(c1, c2).Then(ops...).Commit()
	if err != nil {
		return "", fmt.Errorf("etcdstore: save %s and %s: %w", s.key, o.key, err)
	}
	if !resp.Succeeded {
		return "", store.ErrConflict
	}
	return rev(resp.Header.Revision), nil
}

// LoadChunks returns the chunks named (name → blob) as etcd held them at
// revision at (the revision of the head that references them), so that a
// chunk deleted since by a newer head is still found; when etcd has
// compacted that revision, as it holds them now. A name that is not stored
// is absent from the map; but when the revision was compacted, a name is
// not stored now and the head has changed since, the error wraps
// ErrHistoryGone (a newer head may have deleted it: the caller's head is
// outdated).
func (s *Store) LoadChunks(ctx context.Context, at store.Revision, names []string) (map[string][]byte, error) {
	n, ok := parseRev(at)
	if !ok {
		return nil, fmt.Errorf("etcdstore: chunks at revision %q: not a revision of this store", at)
	}
	out := make(map[string][]byte, len(names))
	for batch := range slices.Chunk(names, MaxTxnOps) {
		ops := make([]clientv3.Op, 0, len(batch))
		for _, name := range batch {
			if err := checkChunkName(name); err != nil {
				return nil, err
			}
			ops = append(ops, clientv3.OpGet(s.chunkKey(name), clientv3.WithRev(n)))
		}
		resp, err := s.c.cli.Txn(ctx).Then(ops...).Commit()
		compacted := errors.Is(err, rpctypes.ErrCompacted)
		if compacted {
			// Read as stored now, with the head's revision in the same
			// read.
			for i := range ops {
				ops[i] = clientv3.OpGet(s.chunkKey(batch[i]))
			}
			ops = append(ops, clientv3.OpGet(s.key, clientv3.WithKeysOnly()))
			resp, err = s.c.cli.Txn(ctx).Then(ops...).Commit()
		}
		if err != nil {
			return nil, fmt.Errorf("etcdstore: loading chunks: %w", err)
		}
		headMoved := false
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().GetKvs() {
				if string(kv.Key) == s.key {
					headMoved = kv.ModRevision != n
					continue
				}
				out[strings.TrimPrefix(string(kv.Key), s.c.prefix+chunkDir)] = append([]byte{}, kv.Value...)
			}
		}
		if !compacted || !headMoved {
			continue // a chunk missing under the head that names it is missing
		}
		// A newer head has replaced the caller's since, and may have
		// deleted chunks it no longer names: a chunk missing now is no
		// sign of damage. The caller's head is outdated; it must read the
		// head again.
		for _, name := range batch {
			if _, ok := out[name]; !ok {
				return nil, fmt.Errorf("%w: chunk %s of the head at revision %d is gone, and the head has changed since (read the head again)", ErrHistoryGone, name, n)
			}
		}
	}
	return out, nil
}

// ListChunks returns the names of the stored chunks that start with
// prefix (keys only).
func (s *Store) ListChunks(ctx context.Context, prefix string) ([]string, error) {
	dir := s.c.prefix + chunkDir
	resp, err := s.c.cli.Get(ctx, dir+prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("etcdstore: listing chunks: %w", err)
	}
	out := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, strings.TrimPrefix(string(kv.Key), dir))
	}
	return out, nil
}

func sortedNames(m map[string][]byte) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// TxnLimits returns MaxTxnBytes and MaxTxnOps.
func (s *Store) TxnLimits() (bytes, ops int) { return MaxTxnBytes, MaxTxnOps }

// Copies counts the copies of the blob that MoveAside and CopyAside made
// (<key>.<suffix>…).
func (s *Store) Copies(ctx context.Context) (int, error) {
	resp, err := s.c.cli.Get(ctx, s.key+".", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("etcdstore: counting copies of %s: %w", s.key, err)
	}
	return int(resp.Count), nil
}
