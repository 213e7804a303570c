// Package logstoretest keeps the update log's segments in memory for
// tests: one memory store a segment, made on first use.
package logstoretest

import (
	"context"
	"sync"

	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// Segments are the segment stores by number. Get is the segments
// function of logstore.New (and of the core's Options.LogSegments).
type Segments struct {
	mu sync.Mutex
	m  map[uint64]store.Store
}

// New returns an empty set of segment stores.
func New() *Segments { return &Segments{m: map[uint64]store.Store{}} }

// Get returns the store of segment n, made empty on first use.
func (s *Segments) Get(n uint64) (store.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[n] == nil {
		s.m[n] = memstore.New()
	}
	return s.m[n], nil
}

// Set replaces the store of segment n (an empty one drops the segment; a
// failing one breaks it).
func (s *Segments) Set(n uint64, st store.Store) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[n] = st
}

// Stored counts the segments that hold a blob.
func (s *Segments) Stored() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.m {
		if _, _, err := st.Load(context.Background()); err == nil {
			n++
		}
	}
	return n
}
