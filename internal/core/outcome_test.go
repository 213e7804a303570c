package core

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

// TestOutcomeOfSharedCommit: OutcomeOf tells from a failed shared commit's
// error whether the change was stored: nothing changed (the store holds
// the revision the write was based on), unknown (the store cannot be read
// back, or another instance wrote since and the store keeps no history).
// The file store's outcomes are tested through the Client API
// (rest.TestRequestDeadlineSaysWhatWasStored).
func TestOutcomeOfSharedCommit(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *lostShared
		want Outcome
	}{
		{"nothing changed", &lostShared{blob: []byte("old"), rev: "7"}, NotStored},
		{"cannot be read back", &lostShared{loadErr: errors.New("etcd away")}, OutcomeUnknown},
		{"another instance wrote, no history", &lostShared{blob: []byte("other"), rev: "9"}, OutcomeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &vault{data: tc.s, key: memstore.New(), log: slog.New(slog.DiscardHandler), storeTimeout: 50 * time.Millisecond}
			v.dataRev, v.keyRev = "7", "7"
			err := v.commitShared(context.Background(), tc.s, []byte("new"), []byte("key"), make([]byte, 32), "", nil)
			if err == nil || !errors.Is(err, ErrUnavailable) {
				t.Fatalf("err %v, want ErrUnavailable", err)
			}
			if got := OutcomeOf(err); got != tc.want {
				t.Fatalf("OutcomeOf(%v) = %d, want %d", err, got, tc.want)
			}
		})
	}
	if OutcomeOf(nil) != NotStored || OutcomeOf(ErrForbidden) != NotStored {
		t.Fatal("a refusal stored nothing")
	}
}
