package core

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/secrets"
)

const uuidC = "8ba7b810-9dad-41d1-80b4-00c04fd430c8"

// counterMarbles activates Marbles of the activation manifest and returns
// their leaf certificates by "type/uuid".
func counterMarbles(t *testing.T, c *Core, ids ...[2]string) map[string][]*x509.Certificate {
	t.Helper()
	m := newMarbleClient(t)
	out := map[string][]*x509.Certificate{}
	for _, id := range ids {
		act, err := c.Activate(context.Background(), m.request(id[0], id[1], nil))
		if err != nil {
			t.Fatal(err)
		}
		out[id[0]+"/"+id[1]] = []*x509.Certificate{pemDecode(t, act.Env[EnvCertificateChain])}
	}
	return out
}

// TestMonotonicCounterLimits: a new counter is refused past each limit
// (the name's length: 400 class; the counters of one Marble, keyed by type
// and UUID, and of all Marbles: 403 class), with a message naming the
// limit and its setting; a refusal stores nothing; existing counters can
// still be raised.
func TestMonotonicCounterLimits(t *testing.T) {
	ctx := context.Background()
	admin := newFaultUser(t, "admin")
	s := newStores()
	lim := CounterLimits{MaxPerMarble: 3, MaxNameBytes: 8, MaxTotal: 6}
	c := newActivationCore(t, s, Options{CounterLimits: lim})
	if _, err := c.SetManifest(ctx, activationManifest(admin, "MonotonicCounter")); err != nil {
		t.Fatal(err)
	}
	if err := c.SetSecrets(ctx, []*x509.Certificate{admin.cert}, map[string]secrets.Upload{"token": {Key: []byte("t")}}); err != nil {
		t.Fatal(err)
	}
	ms := counterMarbles(t, c, [2]string{"frontend", uuidA}, [2]string{"frontend", uuidB}, [2]string{"backend", uuidA}, [2]string{"frontend", uuidC})
	a, b, aBackend, other := ms["frontend/"+uuidA], ms["frontend/"+uuidB], ms["backend/"+uuidA], ms["frontend/"+uuidC]

	set := func(peer []*x509.Certificate, name string, v uint64) (uint64, error) {
		return c.SetMonotonicCounter(ctx, peer, name, v)
	}
	mustSet := func(peer []*x509.Certificate, name string, v, want uint64) {
		t.Helper()
		if got, err := set(peer, name, v); err != nil || got != want {
			t.Fatalf("set %q to %d: %d, %v; want %d", name, v, got, err, want)
		}
	}
	// refused checks the class and message of a refusal, and that
	// nothing was stored.
	refused := func(peer []*x509.Certificate, name string, class error, words ...string) {
		t.Helper()
		before := bytes.Clone(load(t, s.data))
		_, err := set(peer, name, 1)
		if !errors.Is(err, class) {
			t.Fatalf("counter %q: %v, want %v", name, err, class)
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("counter %q: message %q does not say %q", name, err, w)
			}
		}
		if !bytes.Equal(before, load(t, s.data)) {
			t.Fatalf("counter %q: the refusal changed the sealed state", name)
		}
	}

	// The name: 8 bytes pass, 9 do not (bytes, not characters).
	mustSet(a, "12345678", 1, 0)
	refused(a, "123456789", ErrInvalidRequest, "9 bytes", "at most 8", "--max-counter-name", "QUARRY_MAX_COUNTER_NAME")
	refused(a, "äöüä5", ErrInvalidRequest, "9 bytes")

	// One Marble: 3 counters, the fourth is refused; the first three
	// can still be raised, and setting a new counter to 0 (creating
	// nothing) is not refused.
	mustSet(a, "b", 1, 0)
	mustSet(a, "c", 1, 0)
	refused(a, "d", ErrForbidden, "has 3 monotonic counters", `type "frontend"`, uuidA, "--max-counters-per-marble", "QUARRY_MAX_COUNTERS_PER_MARBLE")
	mustSet(a, "c", 5, 1)
	mustSet(a, "d", 0, 0)
	// Another UUID of the same type, and the same UUID with another
	// type, are other Marbles with their own counters.
	mustSet(b, "a", 1, 0)
	mustSet(b, "b", 1, 0)
	mustSet(aBackend, "a", 1, 0)
	// Six counters in all: the total refuses a seventh, also for a
	// Marble with none.
	refused(b, "c", ErrForbidden, "holds 6 monotonic counters", "--max-counters", "QUARRY_MAX_COUNTERS")
	refused(other, "a", ErrForbidden, "QUARRY_MAX_COUNTERS")
	mustSet(b, "b", 2, 1)

	// Lowered limits after a restart: existing counters, even with long
	// names or over the count, can still be raised; new ones cannot be
	// created.
	c = newActivationCore(t, s, Options{CounterLimits: CounterLimits{MaxPerMarble: 1, MaxNameBytes: 2, MaxTotal: 100}})
	mustSet(a, "12345678", 7, 1)
	mustSet(a, "c", 9, 5)
	refused(a, "e", ErrForbidden, "has 3 monotonic counters")
	refused(other, "abc", ErrInvalidRequest, "at most 2")
	if n := len(c.snap.Load().persisted.MonotonicCounters); n != 6 {
		t.Fatalf("%d counters stored, want 6", n)
	}

	// No limits (zero fields): as before.
	c = newActivationCore(t, s, Options{})
	mustSet(other, strings.Repeat("x", 1000), 1, 0)
}

// TestDefaultCounterLimitsBoundTheState: with the default limits, the
// counters of the most Marbles with the longest names add at most about
// 0.5 MiB to the sealed state (the figure docs/configuration.md gives).
func TestDefaultCounterLimitsBoundTheState(t *testing.T) {
	l := DefaultCounterLimits()
	if l.MaxPerMarble <= 0 || l.MaxNameBytes <= 0 || l.MaxTotal <= 0 || l.MaxPerMarble > l.MaxTotal {
		t.Fatalf("default limits %+v", l)
	}
	st := sealedstate.State{MonotonicCounters: map[string]uint64{}}
	empty, err := json.Marshal(&st)
	if err != nil {
		t.Fatal(err)
	}
	for i := range l.MaxTotal {
		var id MarbleIdentity
		id.MarbleType = strings.Repeat("t", 32)
		id.UUID[0], id.UUID[1] = byte(i), byte(i>>8)
		name := strings.Repeat("n", l.MaxNameBytes)
		st.MonotonicCounters[counterKey(id, name)] = ^uint64(0)
	}
	full, err := json.Marshal(&st)
	if err != nil {
		t.Fatal(err)
	}
	grown := len(full) - len(empty)
	t.Logf("%d counters with %d-byte names: %d bytes", l.MaxTotal, l.MaxNameBytes, grown)
	if grown > 600<<10 {
		t.Fatalf("the default limits let the counters take %d bytes of the state", grown)
	}
}
