package vault

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// lostShared is a shared store whose SavePair fails as if etcd's reply was
// lost; LoadPair then answers loadErr, or the blob at revision rev.
type lostShared struct {
	store.Store
	loadErr error
	blob    []byte
	rev     store.Revision
}

func (s *lostShared) SavePair(context.Context, []byte, store.Revision, store.Store, []byte, store.Revision) (store.Revision, error) {
	return "", errors.New("reply lost")
}

func (s *lostShared) LoadPair(context.Context, store.Store) ([]byte, store.Revision, []byte, store.Revision, error) {
	if s.loadErr != nil {
		return nil, "", nil, "", s.loadErr
	}
	return s.blob, s.rev, nil, s.rev, nil
}

func (s *lostShared) Revisions(context.Context, store.Store) (store.Revision, store.Revision, error) {
	return s.rev, s.rev, nil
}

// TestOutcomeOfSharedCommit: a failed shared commit's error tells whether
// the change was stored: nothing changed (the store holds the revision the
// write was based on), unknown (the store cannot be read back, or another
// instance wrote since and the store keeps no history). The file store's
// outcomes are tested through the Client API
// (rest.TestRequestDeadlineSaysWhatWasStored) and by crash_test.go.
func TestOutcomeOfSharedCommit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		s       *lostShared
		unknown bool
	}{
		{"nothing changed", &lostShared{blob: []byte("old"), rev: "7"}, false},
		{"cannot be read back", &lostShared{loadErr: errors.New("etcd away")}, true},
		{"another instance wrote, no history", &lostShared{blob: []byte("other"), rev: "9"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := New(Options{Data: tc.s, Key: memstore.New(), Log: slog.New(slog.DiscardHandler), StoreTimeout: 50 * time.Millisecond})
			v.dataRev, v.keyRev = "7", "7"
			err := v.commitShared(context.Background(), tc.s, []byte("new"), []byte("key"), make([]byte, 32), "", nil)
			if err == nil || !errors.Is(err, ErrUnavailable) {
				t.Fatalf("err %v, want ErrUnavailable", err)
			}
			if errors.Is(err, ErrUnconfirmed) || errors.Is(err, ErrOutcomeUnknown) != tc.unknown {
				t.Fatalf("err %v: unconfirmed %v, outcome unknown %v, want unknown %v", err,
					errors.Is(err, ErrUnconfirmed), errors.Is(err, ErrOutcomeUnknown), tc.unknown)
			}
			if Stored(err) {
				t.Fatalf("Stored(%v) after a write that did not land or may not have", err)
			}
		})
	}
}
