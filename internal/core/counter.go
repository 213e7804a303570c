package core

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/quarry-cc/quarry/internal/vault"

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
// chain only (intermediates a client sends prove nothing): the leaf must verify against the current
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
	return counterPrefix(id) + base64.StdEncoding.EncodeToString([]byte(name))
}

// counterPrefix is the part of counterKey that names the Marble: its
// counters are the keys with this prefix.
func counterPrefix(id MarbleIdentity) string {
	enc := base64.StdEncoding.EncodeToString
	return enc([]byte(id.MarbleType)) + ":" + enc(id.UUID[:]) + ":"
}

// Default limits of the monotonic counters. Counters are never deleted and
// every one is kept in the sealed state, which is sealed and stored whole
// at each change, so they bound what Marbles can add to it: with these
// defaults the counters take at most about 0.5 MiB of the state (a counter
// costs about its name's length × 4/3 + 80 bytes there).
const (
	// DefaultMaxCountersPerMarble bounds the counters of one Marble (one
	// Marble type and UUID).
	DefaultMaxCountersPerMarble = 64
	// DefaultMaxCounterName bounds a new counter's name, in bytes.
	DefaultMaxCounterName = 128
	// DefaultMaxCounters bounds the counters of all Marbles together.
	DefaultMaxCounters = 2048
)

// CounterLimits bound the monotonic counters Marbles may create. They apply
// to new counters only: a counter that exists (created before a limit was
// lowered, or migrated from MarbleRun) can always be raised. Zero fields
// mean no limit.
type CounterLimits struct {
	// MaxPerMarble is the most counters one Marble (one Marble type and
	// UUID, as counters are keyed) may have.
	MaxPerMarble int
	// MaxNameBytes is the longest name of a new counter, in bytes.
	MaxNameBytes int
	// MaxTotal is the most counters of all Marbles together.
	MaxTotal int
}

// DefaultCounterLimits returns the default limits.
func DefaultCounterLimits() CounterLimits {
	return CounterLimits{MaxPerMarble: DefaultMaxCountersPerMarble, MaxNameBytes: DefaultMaxCounterName, MaxTotal: DefaultMaxCounters}
}

// checkNew refuses a new counter name of the Marble id when it would break
// a limit, given the counters that exist. The message names the limit and
// the setting that raises it.
func (l CounterLimits) checkNew(counters map[string]uint64, id MarbleIdentity, name string) error {
	if l.MaxNameBytes > 0 && len(name) > l.MaxNameBytes {
		return classify(ErrInvalidRequest, fmt.Errorf(
			"the counter name is %d bytes; new monotonic counters may have names of at most %d bytes (--max-counter-name, QUARRY_MAX_COUNTER_NAME)",
			len(name), l.MaxNameBytes))
	}
	if l.MaxTotal > 0 && len(counters) >= l.MaxTotal {
		return classify(ErrForbidden, fmt.Errorf(
			"the Coordinator holds %d monotonic counters, the most it keeps (--max-counters, QUARRY_MAX_COUNTERS); existing counters can still be raised, and counters are never deleted",
			len(counters)))
	}
	if l.MaxPerMarble > 0 && len(counters) >= l.MaxPerMarble {
		prefix, n := counterPrefix(id), 0
		for k := range counters {
			if strings.HasPrefix(k, prefix) {
				n++
			}
		}
		if n >= l.MaxPerMarble {
			return classify(ErrForbidden, fmt.Errorf(
				"this Marble (type %q, UUID %s) has %d monotonic counters, the most one Marble may have (--max-counters-per-marble, QUARRY_MAX_COUNTERS_PER_MARBLE); its existing counters can still be raised, and counters are never deleted",
				id.MarbleType, id.UUID, n))
		}
	}
	return nil
}

// trySetMonotonicCounter raises the Marble's counter name to value if value is
// larger and returns the previous value (0 for a new counter); a counter
// never decreases. The change is sealed before it returns. It needs state
// 3, the MonotonicCounter feature (else ErrForbidden) and a Marble
// certificate (see AuthenticateMarble); a new counter must fit the
// CounterLimits (else ErrInvalidRequest for its name, ErrForbidden for
// the number of counters).
func (c *Core) trySetMonotonicCounter(ctx context.Context, peer []*x509.Certificate, name string, value uint64) (uint64, error) {
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
	key := counterKey(id, name)
	prev, exists := s.persisted.MonotonicCounters[key]
	if value <= prev {
		return prev, nil
	}
	if !exists {
		if err := c.opts.CounterLimits.checkNew(s.persisted.MonotonicCounters, id, name); err != nil {
			return 0, err
		}
	}
	st := *s.persisted
	st.MonotonicCounters = maps.Clone(st.MonotonicCounters)
	if st.MonotonicCounters == nil {
		st.MonotonicCounters = map[string]uint64{}
	}
	st.MonotonicCounters[key] = value
	st.Log = st.Log.Counted() // recorded as a count (internal/logstore)
	if err := c.persist(ctx, s, &st); !vault.Stored(err) {
		return 0, err
	} else if err != nil {
		return prev, err
	}
	return prev, nil
}

// SetMonotonicCounter: see trySetMonotonicCounter.
func (c *Core) SetMonotonicCounter(ctx context.Context, peer []*x509.Certificate, name string, value uint64) (uint64, error) {
	return retry(c, ctx, func() (uint64, error) { return c.trySetMonotonicCounter(ctx, peer, name, value) })
}
