package core

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// probeStore is a memstore whose loads and saves can be made to fail.
type probeStore struct {
	*memstore.Store
	failLoad, failSave atomic.Bool
}

var errProbeStore = errors.New("probe store failed")

func (s *probeStore) Load(ctx context.Context) ([]byte, store.Revision, error) {
	if s.failLoad.Load() {
		return nil, "", errProbeStore
	}
	return s.Store.Load(ctx)
}

func (s *probeStore) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	if s.failSave.Load() {
		return "", errProbeStore
	}
	return s.Store.Save(ctx, blob, prev)
}

func TestHooksAndStoreCheck(t *testing.T) {
	ctx := context.Background()
	data, key := &probeStore{Store: memstore.New()}, &probeStore{Store: memstore.New()}
	var mu sync.Mutex
	var commits []CommitResult
	c, err := New(ctx, Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{},
		OnCommit: func(r CommitResult) { mu.Lock(); commits = append(commits, r); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckStore(ctx); err != nil {
		t.Errorf("fresh store: %v", err)
	}
	if n := c.SealedStateSize(); n != 0 {
		t.Errorf("fresh: sealed size %d", n)
	}

	// A failed commit is reported and changes nothing.
	data.failSave.Store(true)
	if _, err := c.SetManifest(ctx, []byte(minimalManifest)); err == nil {
		t.Fatal("SetManifest stored on a failing store")
	}
	if len(commits) != 1 || commits[0].Err == nil || commits[0].SealedBytes == 0 {
		t.Fatalf("after a failed commit: %+v", commits)
	}
	if n := c.SealedStateSize(); n != 0 {
		t.Errorf("failed commit changed the sealed size to %d", n)
	}
	data.failSave.Store(false)

	if _, err := c.SetManifest(ctx, []byte(minimalManifest)); err != nil {
		t.Fatal(err)
	}
	stored := load(t, data.Store)
	if len(commits) != 2 || commits[1].Err != nil || commits[1].SealedBytes != len(stored) || commits[1].Duration <= 0 {
		t.Fatalf("after a commit: %+v (stored %d bytes)", commits, len(stored))
	}
	if n := c.SealedStateSize(); n != int64(len(stored)) {
		t.Errorf("sealed size %d, stored %d", n, len(stored))
	}
	if err := c.CheckStore(ctx); err != nil {
		t.Errorf("healthy store: %v", err)
	}

	// The store fails to read, or lost the state.
	for _, s := range []*probeStore{data, key} {
		s.failLoad.Store(true)
		if err := c.CheckStore(ctx); !errors.Is(err, ErrStoreUnavailable) || !errors.Is(err, errProbeStore) {
			t.Errorf("failing load: %v", err)
		}
		s.failLoad.Store(false)
	}
	if _, err := data.MoveAside(ctx, "lost"); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckStore(ctx); !errors.Is(err, ErrStoreUnavailable) {
		t.Errorf("lost state: %v", err)
	}

	// A restart reports the size of what it loaded.
	if _, err := data.Save(ctx, stored, ""); err != nil {
		t.Fatal(err)
	}
	c2, err := New(ctx, Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	if c2.Status() != StateAcceptingMarbles || c2.SealedStateSize() != int64(len(stored)) {
		t.Errorf("restart: state %d, sealed size %d, want 3, %d", c2.Status(), c2.SealedStateSize(), len(stored))
	}
}

func TestActivationHookNamesKnownTypes(t *testing.T) {
	ctx := context.Background()
	var got []ActivationAttempt
	s := newStores()
	c, err := New(ctx, Options{Data: s.data, Key: s.key, KeySealer: seal.SimulationKeySealer{},
		OnActivation: func(a ActivationAttempt) { got = append(got, a) }})
	if err != nil {
		t.Fatal(err)
	}
	// Before a manifest: refused, type unknown.
	c.Activate(ctx, ActivationRequest{MarbleType: "m", UUID: "u1"})
	if _, err := c.SetManifest(ctx, []byte(minimalManifest)); err != nil {
		t.Fatal(err)
	}
	c.Activate(ctx, ActivationRequest{MarbleType: "m", UUID: "u2"})     // no certificate
	c.Activate(ctx, ActivationRequest{MarbleType: "other", UUID: "u3"}) // no certificate either
	want := []ActivationAttempt{
		{MarbleType: "m", UUID: "u1", KnownType: false, Refused: RefusedState},
		{MarbleType: "m", UUID: "u2", KnownType: true, Refused: RefusedNoCertificate},
		{MarbleType: "other", UUID: "u3", KnownType: false, Refused: RefusedNoCertificate},
	}
	if len(got) != len(want) {
		t.Fatalf("hook calls %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("call %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
