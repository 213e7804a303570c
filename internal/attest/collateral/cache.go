package collateral

import (
	"context"
	"sync"
	"time"
)

// Cache is a Provider that keeps what another Provider returned until the
// collateral's earliest nextUpdate (see Collateral.Validity), measured with
// the injected clock. Collateral that cannot be dated is returned but not
// kept. Concurrent misses for the same key may each fetch.
type Cache struct {
	src Provider
	now func() time.Time

	mu      sync.Mutex
	entries map[cacheKey]cacheEntry
}

type cacheKey struct {
	fmspc [6]byte
	ca    CA
	tdx   bool // TDX collateral (GetTDX)
}

type cacheEntry struct {
	c     *Collateral
	until time.Time
}

var _ Provider = (*Cache)(nil)

// NewCache returns a Cache in front of src. A nil now means time.Now.
func NewCache(src Provider, now func() time.Time) *Cache {
	if now == nil {
		now = time.Now
	}
	return &Cache{src: src, now: now, entries: make(map[cacheKey]cacheEntry)}
}

// Get returns cached collateral that is still before its nextUpdate, or
// fetches it from the source.
func (c *Cache) Get(ctx context.Context, fmspc [6]byte, ca CA) (*Collateral, error) {
	return c.get(ctx, cacheKey{fmspc: fmspc, ca: ca}, c.src.Get)
}

func (c *Cache) get(ctx context.Context, key cacheKey, fetch func(context.Context, [6]byte, CA) (*Collateral, error)) (*Collateral, error) {
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok && c.now().Before(e.until) {
		return e.c, nil
	}
	col, err := fetch(ctx, key.fmspc, key.ca)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, until, err := col.Validity(); err == nil {
		c.entries[key] = cacheEntry{col, until}
	} else {
		delete(c.entries, key)
	}
	return col, nil
}

// NextUpdate returns the earliest nextUpdate of the collateral held (TCB
// info, QE identity, CRLs; see Collateral.Validity), which may be past when
// that collateral has not been asked for since; false when nothing is held.
func (c *Cache) NextUpdate() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, e := range c.entries {
		if first.IsZero() || e.until.Before(first) {
			first = e.until
		}
	}
	return first, !first.IsZero()
}
