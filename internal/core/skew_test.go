package core

import (
	"context"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// skewClock is one instance's wall clock, moved by the test only.
type skewClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *skewClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *skewClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestClockSkewDoesNotBreakRecoveryRounds (clock skew between instances
// does not break recovery-round expiry): three instances on one
// etcd prefix, all in recovery mode, whose clocks differ by more than the
// recovery timeout (A on time, B three hours ahead, C three hours behind).
// A round lives in the memory of the instance that received its first share
// (docs/ha.md, "Recovery rounds are per instance") and expires on that
// instance's clock only: the skewed instances neither expire nor extend nor
// complete A's round, B's own round expires by B's clock, A's round expires
// exactly when A's clock passes the timeout, and when A completes a round
// every instance follows the recovered state.
func TestClockSkewDoesNotBreakRecoveryRounds(t *testing.T) {
	const ttl = time.Hour
	const skew = 3 * time.Hour // more than ttl each way
	e, plain, wantFP := brokenSharedState(t)

	t0 := time.Now()
	clockA := &skewClock{now: t0}
	clockB := &skewClock{now: t0.Add(skew)}
	clockC := &skewClock{now: t0.Add(-skew)}
	start := func(clock *skewClock) *Core {
		t.Helper()
		d, k := e.stores()
		c, err := New(t.Context(), Options{Data: d, Key: k, KeySealer: seal.SimulationKeySealer{},
			Now: clock.Now, RecoveryTimeout: ttl, EphemeralKeyBits: 1024})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status() != StateRecovery {
			t.Fatalf("an instance with a useless key file is in state %d, want recovery", c.Status())
		}
		// Each instance follows the others, as cmd/coordinator does.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); c.Follow(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return c
	}
	a, b := start(clockA), start(clockB)

	upload := func(c *Core, name string, want int) {
		t.Helper()
		k := e.w.rec[map[string]int{"r0": 0, "r1": 1}[name]]
		res, err := c.Recover(t.Context(), plain[name], signSecret(k, plain[name]))
		if err != nil || res.Remaining != want {
			t.Fatalf("uploading %s: %+v, %v; want %d remaining", name, res, err, want)
		}
	}
	accepted := func(c *Core, want int, what string) {
		t.Helper()
		got, need := c.RecoverySharesAccepted()
		if got != want || need != 2 {
			t.Fatalf("%s: %d of %d shares accepted, want %d of 2", what, got, need, want)
		}
	}

	// A round starts on A with its first share; it is A's alone.
	upload(a, "r0", 1)
	accepted(a, 1, "A after its first share")
	accepted(b, 0, "B after A's first share (rounds are per instance)")

	// An instance started now, three hours behind, changes nothing on A.
	c := start(clockC)
	accepted(c, 0, "C at start")
	mustSync(t, a)
	accepted(a, 1, "A after C started")

	// B receives the other share: its own round, which neither completes
	// nor touches A's; and B's clock, three hours ahead, does not expire A's.
	upload(b, "r1", 1)
	accepted(b, 1, "B after its own first share")
	accepted(a, 1, "A after B's upload")
	// C, three hours behind, gets A's share again: a round of its own too.
	upload(c, "r0", 1)
	accepted(a, 1, "A after C's upload")

	// B's round expires by B's clock only.
	clockB.advance(ttl)
	accepted(b, 0, "B once its clock passed the timeout")
	accepted(a, 1, "A after B's round expired")
	accepted(c, 1, "C after B's round expired")

	// A's round expires exactly when A's clock passes the timeout, whatever
	// the others' clocks say.
	clockA.advance(ttl - time.Nanosecond)
	mustSync(t, a)
	accepted(a, 1, "A one nanosecond before the timeout")
	// Still the same round: r0 is refused as reused.
	if _, err := a.Recover(t.Context(), plain["r0"], signSecret(e.w.rec[0], plain["r0"])); !errors.Is(err, recovery.ErrReusedSecret) {
		t.Fatalf("A offered r0 again one nanosecond before the timeout: %v, want ErrReusedSecret", err)
	}
	accepted(a, 1, "A after its share was offered again")
	clockA.advance(time.Nanosecond)
	accepted(a, 0, "A at the timeout by its own clock")
	accepted(c, 1, "C when A's round expired")

	// A completes a new round; every instance, skewed or not, follows.
	upload(a, "r1", 1)
	upload(a, "r0", 0)
	if a.Status() != StateAcceptingMarbles {
		t.Fatalf("A after its round completed: state %d", a.Status())
	}
	for _, inst := range []struct {
		name string
		c    *Core
	}{{"A", a}, {"B", b}, {"C", c}} {
		mustSync(t, inst.c)
		if inst.c.Status() != StateAcceptingMarbles {
			t.Fatalf("%s after A recovered: state %d, want %d", inst.name, inst.c.Status(), StateAcceptingMarbles)
		}
		if fp := mustFingerprint(t, inst.c); fp != wantFP {
			t.Fatalf("%s serves manifest %s, want %s", inst.name, fp, wantFP)
		}
		if got := e.secret(inst.c, "uploaded"); got != "before recovery" {
			t.Fatalf("%s reads %q after recovery", inst.name, got)
		}
		if got, need := inst.c.RecoverySharesAccepted(); got != 0 || need != 0 {
			t.Fatalf("%s still has a recovery round (%d of %d) after recovery", inst.name, got, need)
		}
	}
	// And the recovered state is written for all: a new instance opens it.
	if st := e.instance().Status(); st != StateAcceptingMarbles {
		t.Fatalf("a new instance after recovery: state %d", st)
	}
}

func mustFingerprint(t *testing.T, c *Core) string {
	t.Helper()
	m, err := c.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	return m.Fingerprint
}

// brokenSharedState makes a running state on an embedded etcd with two
// recovery keys (XOR: both shares needed) and a secret "uploaded", then
// replaces the key file with one no instance can open, as when every
// instance holding the key is gone: every instance started on it is in
// recovery mode. It returns the plain recovery secrets by name (r0, r1) and
// the manifest's fingerprint.
func brokenSharedState(t *testing.T) (*sharedEnv, map[string][]byte, string) {
	t.Helper()
	cluster := etcdtest.Start(t, 1)
	e := newSharedEnv(t, cluster)
	e.w.rec = rsaKeys(t, 2)

	// A running state with two recovery keys (XOR: both shares needed) and
	// a secret, set by an instance that then goes away.
	setup := e.instance()
	enc, err := setup.SetManifest(t.Context(), e.w.manifest(manifestOpts{recoveryKeys: []int{0, 1}}))
	if err != nil {
		t.Fatal(err)
	}
	plain := map[string][]byte{}
	for name, ct := range enc {
		var i int
		if _, err := fmt.Sscanf(name, "r%d", &i); err != nil {
			t.Fatalf("recovery key name %q", name)
		}
		if plain[name], err = rsa.DecryptOAEP(sha256.New(), nil, e.w.rec[i], ct, nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(plain) != 2 {
		t.Fatalf("%d recovery secrets, want 2", len(plain))
	}
	if err := e.upload(setup, "uploaded", "before recovery"); err != nil {
		t.Fatal(err)
	}
	wantFP := mustFingerprint(t, setup)

	// The key file becomes useless (all instances holding the key are gone):
	// the sealed state stays, every instance starts in recovery mode.
	data, key := e.stores()
	blob, drev, _, krev, err := data.LoadPair(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := data.SavePair(t.Context(), blob, drev, key, []byte("a key file no instance can open"), krev); err != nil {
		t.Fatal(err)
	}

	return e, plain, wantFP
}

// TestReloadInRecoveryKeepsTheRound: an instance in recovery mode that
// reloads the same unreadable state (it follows a shared store; e.g. after a
// failed read) keeps its round — the shares already accepted, and the
// temporary root certificate clients pinned — instead of silently starting
// over. A reload that finds another state does start over.
func TestReloadInRecoveryKeepsTheRound(t *testing.T) {
	e, plain, wantFP := brokenSharedState(t)
	d, k := e.stores()
	a, err := New(t.Context(), Options{Data: d, Key: k, KeySealer: seal.SimulationKeySealer{}, EphemeralKeyBits: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if a.Status() != StateRecovery {
		t.Fatalf("state %d, want recovery", a.Status())
	}
	if res, err := a.Recover(t.Context(), plain["r0"], signSecret(e.w.rec[0], plain["r0"])); err != nil || res.Remaining != 1 {
		t.Fatalf("first share: %+v, %v", res, err)
	}
	root := a.TLSCertificate().Leaf
	if err := a.refresh(t.Context()); err != nil { // a forced reload of the same blob
		t.Fatal(err)
	}
	if got, need := a.RecoverySharesAccepted(); got != 1 || need != 2 {
		t.Fatalf("after a reload of the same state: %d of %d shares, want 1 of 2", got, need)
	}
	if !a.TLSCertificate().Leaf.Equal(root) {
		t.Fatal("a reload of the same state replaced the temporary root certificate")
	}
	if res, err := a.Recover(t.Context(), plain["r1"], signSecret(e.w.rec[1], plain["r1"])); err != nil || res.Remaining != 0 {
		t.Fatalf("second share after the reload: %+v, %v", res, err)
	}
	if a.Status() != StateAcceptingMarbles || mustFingerprint(t, a) != wantFP {
		t.Fatalf("after recovery: state %d", a.Status())
	}
}
