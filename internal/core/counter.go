package core

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/google/uuid"

	"github.com/quarry-cc/quarry/manifest"
)

// msgCounterDisabled is the refusal when the manifest does not enable the
// MonotonicCounter feature.
const msgCounterDisabled = manifest.FeatureMonotonicCounter + " feature is not enabled in the manifest"

// errUnauthorizedMarble classes a Marble authentication failure.
func errUnauthorizedMarble(err error) error {
	return classify(ErrUnauthenticated, fmt.Errorf("unauthorized marble: %w", err))
}

// MarbleIdentity is an authenticated Marble instance.
type MarbleIdentity struct {
	MarbleType string
	UUID       uuid.UUID
}

// AuthenticateMarble identifies a Marble by the leaf of its TLS client
// chain only (decision D14): the leaf must verify against the current
// Marble Root (certificates issued before an update that renewed it are
// refused), carry the marble-type extension, and have a UUID as its common
// name. Any failure is ErrUnauthenticated.
func (c *Core) AuthenticateMarble(peer []*x509.Certificate) (MarbleIdentity, error) {
	s := c.snap.Load()
	if len(peer) == 0 || peer[0] == nil {
		return MarbleIdentity{}, errUnauthorizedMarble(errors.New("no client certificate"))
	}
	typ, cn, err := s.ca.VerifyMarbleCert(peer[0], c.opts.Now())
	if err != nil {
		return MarbleIdentity{}, errUnauthorizedMarble(err)
	}
	id, err := uuid.Parse(cn)
	if err != nil {
		return MarbleIdentity{}, errUnauthorizedMarble(fmt.Errorf("common name %q is not a UUID: %w", cn, err))
	}
	return MarbleIdentity{MarbleType: typ, UUID: id}, nil
}

// counterKey is MarbleRun's key of a monotonic counter:
// base64(type):base64(uuid bytes):base64(name), standard encoding.
func counterKey(id MarbleIdentity, name string) string {
	enc := base64.StdEncoding.EncodeToString
	return enc([]byte(id.MarbleType)) + ":" + enc(id.UUID[:]) + ":" + enc([]byte(name))
}

// Limits of monotonic counters: every counter lives in the sealed state,
// which every commit writes (docs/ha.md, "Limits").
const (
	// DefaultMaxCountersPerMarble is Options.MaxCountersPerMarble's
	// default: how many counters one Marble instance may create.
	DefaultMaxCountersPerMarble = 1000
	// MaxCounterNameBytes bounds a counter's name.
	MaxCounterNameBytes = 1024
)

// marbleCounters counts the counters of the Marble instance id.
func marbleCounters(counters map[string]uint64, id MarbleIdentity) int {
	prefix := counterKey(id, "")
	n := 0
	for k := range counters {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// setMonotonicCounterOnce raises the Marble's counter name to value if value is
// larger and returns the previous value (0 for a new counter); a counter
// never decreases. The change is sealed before it returns. It needs state
// 3, the MonotonicCounter feature (else ErrForbidden) and a Marble
// certificate (see AuthenticateMarble).
func (c *Core) setMonotonicCounterOnce(ctx context.Context, peer []*x509.Certificate, name string, value uint64) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap.Load()
	if err := require(s.state, opCounter); err != nil {
		return 0, err
	}
	if !s.manifest.FeatureEnabled(manifest.FeatureMonotonicCounter) {
		return 0, classify(ErrForbidden, errors.New(msgCounterDisabled))
	}
	id, err := c.AuthenticateMarble(peer)
	if err != nil {
		return 0, err
	}
	if len(name) > MaxCounterNameBytes {
		return 0, classify(ErrInvalidRequest, fmt.Errorf("the counter name has %d bytes; a monotonic counter's name has at most %d", len(name), MaxCounterNameBytes))
	}
	key := counterKey(id, name)
	prev, exists := s.persisted.MonotonicCounters[key]
	if value <= prev {
		return prev, nil
	}
	if !exists {
		if n := marbleCounters(s.persisted.MonotonicCounters, id); n >= c.opts.MaxCountersPerMarble {
			return 0, classify(ErrTooLarge, fmt.Errorf("this Marble already has %d monotonic counters, the most one Marble may have (%d); raise an existing counter instead of creating new ones; nothing was changed", n, c.opts.MaxCountersPerMarble))
		}
	}
	st := *s.persisted
	st.MonotonicCounters = maps.Clone(st.MonotonicCounters)
	if st.MonotonicCounters == nil {
		st.MonotonicCounters = map[string]uint64{}
	}
	st.MonotonicCounters[key] = value
	st.Log = st.Log.counted() // recorded as a count (logstore.go)
	if err := c.persist(ctx, s, &st); !stored(err) {
		return 0, err
	} else if err != nil {
		return prev, err
	}
	return prev, nil
}
