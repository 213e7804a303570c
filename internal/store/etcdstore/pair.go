package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quarry-cc/quarry/internal/store"
)

// ErrOtherClient is returned by the pair operations when the other Store is
// not one of the same Client.
var ErrOtherClient = errors.New("etcdstore: the other store is not on the same etcd client")

func (s *Store) sibling(other store.Store) (*Store, error) {
	o, ok := other.(*Store)
	if !ok || o.c != s.c {
		return nil, ErrOtherClient
	}
	if o.key == s.key {
		return nil, errors.New("etcdstore: a pair needs two different keys")
	}
	return o, nil
}

// SavePair stores blob in s and otherBlob in other in one transaction, if
// s's revision is prev and other's is otherPrev (empty: absent); else
// store.ErrConflict and nothing changes. Both keys get the returned
// revision. Several Coordinator instances write their sealed state and key
// file this way, so that no reader ever sees one without the other. An
// error other than ErrConflict leaves the outcome unknown, as for Save.
func (s *Store) SavePair(ctx context.Context, blob []byte, prev store.Revision, other store.Store, otherBlob []byte, otherPrev store.Revision) (store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("etcdstore: save: %w", err)
	}
	o, err := s.sibling(other)
	if err != nil {
		return "", err
	}
	if len(blob)+len(otherBlob) > MaxBlobBytes {
		return "", fmt.Errorf("etcdstore: save: blobs of %d bytes exceed %d", len(blob)+len(otherBlob), MaxBlobBytes)
	}
	c1, ok1 := cmpRev(s.key, prev)
	c2, ok2 := cmpRev(o.key, otherPrev)
	if !ok1 || !ok2 {
		return "", store.ErrConflict
	}
	resp, err := s.c.cli.Txn(ctx).If(c1, c2).Then(
		clientv3.OpPut(s.key, string(blob)),
		clientv3.OpPut(o.key, string(otherBlob)),
	).Commit()
	if err != nil {
		return "", fmt.Errorf("etcdstore: save %s and %s: %w", s.key, o.key, err)
	}
	if !resp.Succeeded {
		return "", store.ErrConflict
	}
	return rev(resp.Header.Revision), nil
}

// LoadPair reads s and other at one etcd revision (a linearizable read):
// a nil blob and the empty revision for a key that is absent.
func (s *Store) LoadPair(ctx context.Context, other store.Store) (blob []byte, r store.Revision, otherBlob []byte, otherRev store.Revision, err error) {
	return s.loadPair(ctx, other, false)
}

// Revisions is LoadPair without the blobs: a cheap check whether anything
// changed.
func (s *Store) Revisions(ctx context.Context, other store.Store) (store.Revision, store.Revision, error) {
	_, r, _, or, err := s.loadPair(ctx, other, true)
	return r, or, err
}

func (s *Store) loadPair(ctx context.Context, other store.Store, keysOnly bool) ([]byte, store.Revision, []byte, store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", nil, "", fmt.Errorf("etcdstore: load: %w", err)
	}
	o, err := s.sibling(other)
	if err != nil {
		return nil, "", nil, "", err
	}
	var opts []clientv3.OpOption
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	resp, err := s.c.cli.Txn(ctx).Then(clientv3.OpGet(s.key, opts...), clientv3.OpGet(o.key, opts...)).Commit()
	if err != nil {
		return nil, "", nil, "", fmt.Errorf("etcdstore: load %s and %s: %w", s.key, o.key, err)
	}
	var blobs [2][]byte
	var revs [2]store.Revision
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue
		}
		blobs[i] = append([]byte{}, kvs[0].Value...)
		revs[i] = rev(kvs[0].ModRevision)
	}
	return blobs[0], revs[0], blobs[1], revs[1], nil
}

// Changes returns a channel that receives a value (coalesced, never
// blocking etcd) after each change of the key, and after the watch was
// interrupted and started again (a change may have been missed), until ctx
// ends.
func (s *Store) Changes(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	go func() {
		for ctx.Err() == nil {
			wctx := clientv3.WithRequireLeader(ctx)
			for resp := range s.c.cli.Watch(wctx, s.key) {
				if resp.Err() != nil {
					break
				}
				if len(resp.Events) > 0 {
					signal()
				}
			}
			if ctx.Err() != nil {
				return
			}
			signal() // the watch ended: something may have been missed
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}()
	return ch
}

// ErrHistoryGone is returned by FirstWriteAfter when etcd no longer holds
// the history asked for (it was compacted).
var ErrHistoryGone = errors.New("etcdstore: the history asked for was compacted")

// FirstWriteAfter returns the value written by the first change of s after
// revision after (a revision this store gave), from etcd's history: of
// several compare-and-swaps on the same revision, it is the one that
// landed, even when later writes replaced it. A deletion gives a nil value
// and no error. It returns store.ErrNotFound when s did not change since
// after, and ErrHistoryGone when etcd compacted that history.
func (s *Store) FirstWriteAfter(ctx context.Context, after store.Revision) ([]byte, error) {
	n, ok := parseRev(after)
	if !ok {
		return nil, fmt.Errorf("etcdstore: history after revision %q: not a revision of this store", after)
	}
	// A linearizable read first: if nothing changed since, the watch
	// below would wait for a future change.
	resp, err := s.c.cli.Get(ctx, s.key, clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("etcdstore: history of %s: %w", s.key, err)
	}
	if len(resp.Kvs) == 1 && resp.Kvs[0].ModRevision == n {
		return nil, store.ErrNotFound
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range s.c.cli.Watch(wctx, s.key, clientv3.WithRev(n+1)) {
		if wr.CompactRevision != 0 {
			return nil, fmt.Errorf("%w (etcd keeps revisions from %d on, asked after %d)", ErrHistoryGone, wr.CompactRevision, n)
		}
		if err := wr.Err(); err != nil {
			return nil, fmt.Errorf("etcdstore: history of %s: %w", s.key, err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil, nil
			}
			return append([]byte{}, ev.Kv.Value...), nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("etcdstore: history of %s: %w", s.key, err)
	}
	return nil, fmt.Errorf("etcdstore: history of %s: the watch ended", s.key)
}
