package vault

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
)

// ChunkStore is the capability of a shared store to keep a state as a
// head and chunks (statechunks.go; e.g. etcdstore.Store): chunks are written
// with the head that references them, or before it, and deleted only in
// the transaction of a head that no longer references them, so that
// every stored head finds its chunks (older heads at their own revision,
// from the store's history).
type ChunkStore interface {
	// PutChunks stores chunks if the head's revision is still prev.
	PutChunks(ctx context.Context, prev store.Revision, chunks map[string][]byte) error
	// SaveHead is SavePair that also stores puts and deletes deletes.
	SaveHead(ctx context.Context, blob []byte, prev store.Revision, other store.Store, otherBlob []byte, otherPrev store.Revision, puts map[string][]byte, deletes []string) (store.Revision, error)
	// LoadChunks returns the chunks named as stored at revision at (or
	// now, when that history is gone); missing names are absent.
	LoadChunks(ctx context.Context, at store.Revision, names []string) (map[string][]byte, error)
	// ListChunks returns the names of the stored chunks with prefix.
	ListChunks(ctx context.Context, prefix string) ([]string, error)
	// Copies counts the head's copies moved or copied aside (recovery).
	Copies(ctx context.Context) (int, error)
	// TxnLimits are the most bytes and operations of one transaction.
	TxnLimits() (bytes, ops int)
}

// CommittedNotifier is told the revision of each head this instance
// stored (etcdstore compacts the history behind it).
type CommittedNotifier interface {
	Committed(rev store.Revision)
}

// sweepInterval is how often a committing instance looks for chunks that
// no head references (left by a commit that stopped half-way).
const sweepInterval = 10 * time.Minute

// chunked is the vault's part for a state kept in chunks.
type chunked struct {
	// ckeys are the chunk keys of ckeysDEK.
	ckeys    *chunkKeys
	ckeysDEK []byte
	// cache holds the chunks of the state last opened or stored.
	cache *Layout
	// orphans are chunks that no stored head references, deleted with
	// the next commits (never one the committed head references).
	orphans []string
	swept   time.Time
}

func (v *Vault) chunkStore() ChunkStore {
	if v.shared() == nil {
		return nil
	}
	cs, _ := v.data.(ChunkStore)
	return cs
}

// keysFor returns the chunk keys of dek.
func (v *Vault) keysFor(dek []byte) *chunkKeys {
	if v.ckeys == nil || !bytes.Equal(v.ckeysDEK, dek) {
		v.ckeys, v.ckeysDEK = deriveChunkKeys(dek), bytes.Clone(dek)
	}
	return v.ckeys
}

// fetcher reads chunks of the head at revision at: from the cache when
// the state last opened or stored has them, else from the store.
func (v *Vault) fetcher(ctx context.Context, cs ChunkStore, k *chunkKeys, at store.Revision) chunkFetcher {
	return func(depth int, names []string) (map[string][]byte, error) {
		out := make(map[string][]byte, len(names))
		var missing []string
		for _, n := range names {
			if _, ok := out[n]; ok {
				continue
			}
			if c := v.cache; c != nil && c.keys.id == k.id {
				if p, ok := c.chunks[n]; ok {
					out[n] = p
					continue
				}
			}
			out[n] = nil
			missing = append(missing, n)
		}
		if len(missing) == 0 {
			return out, nil
		}
		blobs, err := cs.LoadChunks(ctx, at, missing)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSharedRead, err)
		}
		for _, n := range missing {
			b, ok := blobs[n]
			if !ok {
				return nil, fmt.Errorf("%w: chunk %s is not stored", ErrChunks, n)
			}
			if out[n], err = k.openChunk(depth, n, b); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
}

// Open decrypts blob, the stored sealed state, with dek; a head
// (etcd) is joined with its chunks, read at the head's revision. An error
// wraps ErrSharedRead when the store cannot be read, ErrChunks when a
// chunk is missing or damaged.
func (v *Vault) Open(ctx context.Context, dek, blob []byte) (hdr, plaintext []byte, layout *Layout, err error) {
	hdr, plaintext, err = seal.Open(dek, blob)
	if err != nil || !IsChunkedHead(plaintext) {
		return hdr, plaintext, nil, err
	}
	cs := v.chunkStore()
	if cs == nil {
		return nil, nil, nil, fmt.Errorf("%w: the state is kept in chunks, but this store keeps none", ErrChunks)
	}
	k := v.keysFor(dek)
	plaintext, layout, err = joinState(k, plaintext, v.fetcher(ctx, cs, k, v.dataRev))
	if err != nil {
		return nil, nil, nil, err
	}
	return hdr, plaintext, layout, nil
}

// Split returns what a commit of plaintext under dek stores as
// the sealed state: on a store that keeps chunks the head's plaintext and
// its chunks, else plaintext itself.
func (v *Vault) Split(dek, plaintext []byte) ([]byte, *Layout, error) {
	if v.chunkStore() == nil {
		return plaintext, nil, nil
	}
	return splitState(v.keysFor(dek), plaintext)
}

// saveShared stores blob (a head, when l is set) and keyFile in one
// compare-and-swap, with the chunks of l the stored head does not have:
// in the same transaction when they fit in one, else written first
// (guarded by the head's revision). The chunks the stored head referenced
// and the new one does not, and orphans found by a sweep, are deleted in
// the same transaction (as many as fit; the rest with the next commits).
func (v *Vault) saveShared(ctx context.Context, s SharedStore, blob, keyFile []byte, l *Layout) (store.Revision, error) {
	cs := v.chunkStore()
	if cs == nil || l == nil {
		wctx, cancel := context.WithTimeout(ctx, v.storeTimeout)
		defer cancel()
		return s.SavePair(wctx, blob, v.dataRev, v.key, keyFile, v.keyRev)
	}
	maxBytes, maxOps := cs.TxnLimits()
	fixed := len(blob) + len(keyFile)
	if fixed > maxBytes {
		return "", tooLarge(fmt.Errorf("the state's head and key file take %d bytes, more than the %d bytes one etcd request may carry here", fixed, maxBytes))
	}
	var base *Layout
	if v.disk != nil && v.disk.layout != nil && v.disk.layout.keys.id == l.keys.id {
		base = v.disk.layout
	}
	puts := map[string][]byte{}
	size := 0
	for name, plain := range l.chunks {
		if base != nil {
			if _, ok := base.chunks[name]; ok {
				continue
			}
		}
		b, err := l.keys.sealChunk(rand.Reader, name, plain)
		if err != nil {
			return "", fmt.Errorf("sealing a chunk of the state: %w", err)
		}
		puts[name], size = b, size+len(b)
	}
	v.sweep(ctx, cs, l)
	var deletes []string
	seen := map[string]bool{}
	drop := func(n string) {
		if _, live := l.chunks[n]; !live && !seen[n] {
			seen[n] = true
			deletes = append(deletes, n)
		}
	}
	if d := v.disk; d != nil && d.layout != nil {
		for n := range d.layout.chunks {
			drop(n)
		}
	}
	for _, n := range v.orphans {
		drop(n)
	}
	if len(puts)+2 > maxOps || size+fixed > maxBytes {
		// Too much for one transaction (a new state, a new data key, a
		// large change): the chunks first, then the head.
		batches := 1 + size/maxBytes + len(puts)/maxOps
		pctx, cancel := context.WithTimeout(ctx, time.Duration(batches)*v.storeTimeout)
		err := cs.PutChunks(pctx, v.dataRev, puts)
		cancel()
		if err != nil {
			// Whatever was written is referenced by no head.
			for n := range puts {
				v.orphans = append(v.orphans, n)
			}
			return "", err
		}
		puts = nil
	}
	n := min(max(maxOps-2-len(puts), 0), len(deletes))
	wctx, cancel := context.WithTimeout(ctx, v.storeTimeout)
	defer cancel()
	rev, err := cs.SaveHead(wctx, blob, v.dataRev, v.key, keyFile, v.keyRev, puts, deletes[:n])
	if err == nil {
		v.orphans = deletes[n:]
	}
	return rev, err
}

// sweep looks, at most every sweepInterval, for stored chunks that the
// head being committed (l) does not reference: of its data key, and of
// other data keys unless a head was copied aside (recovery keeps those
// copies, and their chunks, for the operator). They become orphans,
// deleted with this and the next commits. A failed look is tried at the
// next interval.
func (v *Vault) sweep(ctx context.Context, cs ChunkStore, l *Layout) {
	now := v.now()
	if !v.swept.IsZero() && now.Sub(v.swept) < sweepInterval {
		return
	}
	v.swept = now
	sctx, cancel := context.WithTimeout(ctx, v.storeTimeout)
	defer cancel()
	names, err := cs.ListChunks(sctx, "")
	if err != nil {
		return
	}
	copies, err := cs.Copies(sctx)
	if err != nil {
		return
	}
	known := map[string]bool{}
	for _, n := range v.orphans {
		known[n] = true
	}
	for _, n := range names {
		_, live := l.chunks[n]
		ours := strings.HasPrefix(n, l.keys.id+".")
		if !live && !known[n] && (ours || copies == 0) {
			v.orphans = append(v.orphans, n)
		}
	}
}

// committedChunks records that the head with layout l (nil: a single
// blob) is the stored state, at revision rev when known.
func (v *Vault) committedChunks(l *Layout, rev store.Revision) {
	if l != nil {
		v.cache = l
	}
	if n, ok := v.data.(CommittedNotifier); ok && rev != "" && l != nil {
		n.Committed(rev)
	}
}
