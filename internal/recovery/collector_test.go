package recovery

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fixture is a generated sealed-state recovery setup with the plain shares
// decrypted and signed, as the key owners would upload them.
type fixture struct {
	pub    Public
	dek    []byte
	names  []string          // recovery key names, sorted
	shares map[string][]byte // plain share per key
	sigs   map[string][]byte // valid signature per key
}

func newFixture(t testing.TB, keys int, threshold uint) *fixture {
	t.Helper()
	priv := testKeys(t)
	dek, secrets, pub, err := Generate(rand.Reader, publicKeys(t, keys), threshold)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{pub: pub, dek: dek, shares: map[string][]byte{}, sigs: map[string][]byte{}}
	for name, ct := range secrets {
		f.names = append(f.names, name)
		f.shares[name] = decryptOAEP(t, priv[name], ct)
		f.sigs[name] = sign(t, priv[name], f.shares[name])
	}
	slices.Sort(f.names)
	return f
}

// sign signs msg the way MarbleRun's CLI does: PKCS #1 v1.5 over SHA-256.
func sign(t testing.TB, priv *rsa.PrivateKey, msg []byte) []byte {
	t.Helper()
	h := sha256.Sum256(msg)
	sig, err := rsa.SignPKCS1v15(nil, priv, crypto.SHA256, h[:])
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// add uploads the named key's share with its valid signature.
func (f *fixture) add(c *Collector, name string) (int, []byte, error) {
	return c.Add(f.shares[name], f.sigs[name])
}

var collectorModes = []struct {
	name      string
	keys      int
	threshold uint
	mode      Mode
	need      int
}{
	{"single", 1, 0, ModeSingle, 1},
	{"xor of 2", 2, 0, ModeXOR, 2},
	{"xor of 3", 3, 3, ModeXOR, 3},
	{"shamir 2 of 3", 3, 2, ModeShamir, 2},
	{"shamir 3 of 4", 4, 3, ModeShamir, 3},
}

func TestCollectorComplete(t *testing.T) {
	for _, m := range collectorModes {
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t, m.keys, m.threshold)
			if f.pub.Mode != m.mode {
				t.Fatalf("mode %q, want %q", f.pub.Mode, m.mode)
			}
			c := NewCollector(f.pub, time.Hour, nil)
			// Every ordered selection of need distinct keys completes the round.
			var rounds int
			for _, order := range orderings(f.names, m.need) {
				rounds++
				if r := c.Remaining(); r != m.need {
					t.Fatalf("round %d starts with remaining %d, want %d", rounds, r, m.need)
				}
				for i, name := range order {
					remaining, key, err := f.add(c, name)
					if err != nil {
						t.Fatalf("order %v, share %s: %v", order, name, err)
					}
					if want := m.need - i - 1; remaining != want {
						t.Fatalf("order %v, share %s: remaining %d, want %d", order, name, remaining, want)
					}
					if last := remaining == 0; last != (key != nil) {
						t.Fatalf("order %v: remaining %d with key %x", order, remaining, key)
					}
					if key != nil && !bytes.Equal(key, f.dek) {
						t.Fatalf("order %v: key %x, want the DEK %x", order, key, f.dek)
					}
					if remaining > 0 && c.Remaining() != remaining {
						t.Fatalf("Remaining() = %d, Add said %d", c.Remaining(), remaining)
					}
				}
			}
			if r := c.Remaining(); r != m.need {
				t.Fatalf("after completion remaining %d, want a fresh %d", r, m.need)
			}
		})
	}
}

// orderings returns every ordered selection of k distinct names.
func orderings(names []string, k int) [][]string {
	if k == 0 {
		return [][]string{nil}
	}
	var out [][]string
	for i, n := range names {
		rest := slices.Delete(slices.Clone(names), i, i+1)
		for _, tail := range orderings(rest, k-1) {
			out = append(out, append([]string{n}, tail...))
		}
	}
	return out
}

func TestCollectorRejects(t *testing.T) {
	priv := testKeys(t)
	for _, m := range collectorModes {
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t, m.keys, m.threshold)
			other := newFixture(t, m.keys, m.threshold) // another sealed state, same keys
			size := shareSize(m.mode)
			first, next := f.names[0], f.names[len(f.names)-1]
			signer := "mallory" // a recovery key other than next's owner, if there is one
			if len(f.names) > 1 {
				signer = first
			}
			randomShare := make([]byte, size)
			rand.Read(randomShare)
			garbageSig := make([]byte, 256)
			rand.Read(garbageSig)
			wrongSize := DEKSize
			if size == DEKSize {
				wrongSize = shamirShareSize
			}

			type upload struct {
				name         string
				secret, sig  []byte
				wantErr      error
				wantSigOwner string // for ErrBadSignature
				wantMsg      string // substring
				needsPrior   bool   // only when a share is already accepted
			}
			cases := []upload{
				{name: "random share", secret: randomShare, sig: garbageSig, wantErr: ErrUnknownSecret,
					wantMsg: "the secret is not a recovery secret of this sealed state"},
				{name: "share of another state", secret: other.shares[next], sig: other.sigs[next], wantErr: ErrUnknownSecret},
				{name: "empty secret", secret: nil, sig: f.sigs[next], wantErr: ErrInvalidSecret,
					wantMsg: fmt.Sprintf("got 0 bytes, expected %d", size)},
				{name: "16 bytes", secret: f.shares[next][:16], sig: f.sigs[next], wantErr: ErrInvalidSecret},
				{name: "one byte short", secret: f.shares[next][:size-1], sig: f.sigs[next], wantErr: ErrInvalidSecret},
				{name: "one byte long", secret: append(slices.Clone(f.shares[next]), 0), sig: f.sigs[next], wantErr: ErrInvalidSecret,
					wantMsg: fmt.Sprintf("got %d bytes, expected %d", size+1, size)},
				{name: "other mode's length", secret: make([]byte, wrongSize), sig: f.sigs[next], wantErr: ErrInvalidSecret},
				{name: "long garbage", secret: bytes.Repeat([]byte{0xA5}, 512), sig: garbageSig, wantErr: ErrInvalidSecret},
				{name: "garbage signature", secret: f.shares[next], sig: garbageSig, wantErr: ErrBadSignature, wantSigOwner: next},
				{name: "empty signature", secret: f.shares[next], sig: nil, wantErr: ErrBadSignature, wantSigOwner: next},
				{name: "signature over another message", secret: f.shares[next], sig: sign(t, priv[next], []byte("another message")), wantErr: ErrBadSignature, wantSigOwner: next},
				{name: "signature by another recovery key", secret: f.shares[next], sig: sign(t, priv[signer], f.shares[next]),
					wantErr: ErrBadSignature, wantSigOwner: next, wantMsg: fmt.Sprintf("recovery key %q", next)},
				{name: "signature by an outsider", secret: f.shares[next], sig: sign(t, priv["mallory"], f.shares[next]),
					wantErr: ErrBadSignature, wantSigOwner: next},
				{name: "reused share", secret: f.shares[first], sig: f.sigs[first], wantErr: ErrReusedSecret, needsPrior: true},
				{name: "reused share, bad signature", secret: f.shares[first], sig: garbageSig,
					wantErr: ErrBadSignature, wantSigOwner: first, needsPrior: true},
			}

			for _, prior := range []bool{false, true} {
				if prior && m.need == 1 {
					continue // a single share completes the round at once
				}
				for _, tc := range cases {
					if tc.needsPrior && !prior {
						continue
					}
					t.Run(fmt.Sprintf("%s/prior=%v", tc.name, prior), func(t *testing.T) {
						c := NewCollector(f.pub, time.Hour, nil)
						want := m.need
						if prior {
							if r, _, err := f.add(c, first); err != nil || r != m.need-1 {
								t.Fatalf("first share: %d, %v", r, err)
							}
							want--
						}
						remaining, key, err := c.Add(tc.secret, tc.sig)
						if !errors.Is(err, tc.wantErr) {
							t.Fatalf("Add = %v, want %v", err, tc.wantErr)
						}
						if remaining != want || key != nil || c.Remaining() != want {
							t.Fatalf("after a rejected upload: remaining %d (Remaining() %d), key %x; want %d, none",
								remaining, c.Remaining(), key, want)
						}
						if tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
							t.Fatalf("message %q does not contain %q", err, tc.wantMsg)
						}
						var se *SignatureError
						if errors.As(err, &se) != (tc.wantSigOwner != "") || (se != nil && se.Key != tc.wantSigOwner) {
							t.Fatalf("SignatureError %+v, want key %q", se, tc.wantSigOwner)
						}
						// The round goes on and completes with the right shares.
						var got []byte
						for _, name := range f.names {
							if prior && name == first {
								continue
							}
							if _, got, err = f.add(c, name); err != nil {
								t.Fatalf("share %s after the rejection: %v", name, err)
							}
							if got != nil {
								break
							}
						}
						if !bytes.Equal(got, f.dek) {
							t.Fatalf("round ended with key %x, want the DEK", got)
						}
					})
				}
			}
		})
	}
}

func TestCollectorNotRecoverable(t *testing.T) {
	f := newFixture(t, 0, 0)
	c := NewCollector(f.pub, time.Hour, nil)
	if r, key, err := c.Add(make([]byte, DEKSize), nil); !errors.Is(err, ErrNotRecoverable) || r != 0 || key != nil {
		t.Fatalf("Add = %d, %x, %v; want ErrNotRecoverable", r, key, err)
	}
	if r := c.Remaining(); r != 0 {
		t.Fatalf("Remaining = %d, want 0", r)
	}
	c.Reset() // harmless
}

func TestCollectorInvalidPublic(t *testing.T) {
	f := newFixture(t, 3, 2)
	for _, tc := range []struct {
		name string
		edit func(p *Public)
	}{
		{"unknown mode", func(p *Public) { p.Mode = "magic" }},
		{"threshold 0", func(p *Public) { p.Threshold = 0 }},
		{"threshold above keys", func(p *Public) { p.Threshold = 4 }},
		{"xor with wrong threshold", func(p *Public) { p.Mode = ModeXOR }},
		{"bad share hash", func(p *Public) {
			r := p.Keys["alice"]
			r.ShareHash = "nope"
			p.Keys["alice"] = r
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := f.pub
			pub.Keys = make(map[string]Recipient)
			for k, v := range f.pub.Keys {
				pub.Keys[k] = v
			}
			tc.edit(&pub)
			c := NewCollector(pub, time.Hour, nil)
			if r, key, err := f.add(c, "bob"); !errors.Is(err, ErrInvalidPublic) || r != 0 || key != nil {
				t.Fatalf("Add = %d, %x, %v; want ErrInvalidPublic", r, key, err)
			}
			if r := c.Remaining(); r != 0 {
				t.Fatalf("Remaining = %d, want 0", r)
			}
		})
	}
}

func TestCollectorExpiry(t *testing.T) {
	f := newFixture(t, 3, 0)
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := start
	const ttl = 10 * time.Minute
	c := NewCollector(f.pub, ttl, func() time.Time { return now })

	mustAdd := func(name string, want int) {
		t.Helper()
		r, _, err := f.add(c, name)
		if err != nil || r != want {
			t.Fatalf("add %s at +%v: %d, %v; want %d", name, now.Sub(start), r, err, want)
		}
	}
	mustAdd("alice", 2)
	now = start.Add(ttl - time.Nanosecond) // the ttl counts from the first share
	mustAdd("bob", 1)
	if r := c.Remaining(); r != 1 {
		t.Fatalf("Remaining just before expiry = %d, want 1", r)
	}
	now = start.Add(ttl)
	if r := c.Remaining(); r != 3 {
		t.Fatalf("Remaining at expiry = %d, want a fresh 3", r)
	}
	// The old shares are gone: alice is accepted again, not reused.
	mustAdd("alice", 2)
	// A new round started at start+ttl; it expires at start+2ttl even though
	// Add reports the count of the fresh round without an error.
	now = start.Add(2*ttl + time.Second)
	mustAdd("carol", 2)
	now = now.Add(ttl - time.Second)
	mustAdd("alice", 1)
	r, key, err := f.add(c, "bob")
	if err != nil || r != 0 || !bytes.Equal(key, f.dek) {
		t.Fatalf("completing: %d, %x, %v", r, key, err)
	}

	// Rejected uploads do not start the clock.
	c = NewCollector(f.pub, ttl, func() time.Time { return now })
	if _, _, err := c.Add(f.shares["alice"], nil); !errors.Is(err, ErrBadSignature) {
		t.Fatal(err)
	}
	now = now.Add(ttl / 2)
	mustAdd("alice", 2)
	now = now.Add(ttl - time.Second)
	mustAdd("bob", 1)

	// ttl ≤ 0: rounds never expire.
	c = NewCollector(f.pub, 0, func() time.Time { return now })
	mustAdd("alice", 2)
	now = now.Add(1000 * time.Hour)
	mustAdd("bob", 1)
}

func TestCollectorReset(t *testing.T) {
	for _, m := range collectorModes {
		if m.need < 2 {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t, m.keys, m.threshold)
			c := NewCollector(f.pub, time.Hour, nil)
			c.Reset() // on an empty round
			if _, _, err := f.add(c, f.names[0]); err != nil {
				t.Fatal(err)
			}
			c.Reset()
			if r := c.Remaining(); r != m.need {
				t.Fatalf("Remaining after Reset = %d, want %d", r, m.need)
			}
			// The share is accepted again, and the round completes normally.
			var key []byte
			for _, name := range f.names[:m.need] {
				var err error
				if _, key, err = f.add(c, name); err != nil {
					t.Fatalf("%s after Reset: %v", name, err)
				}
			}
			if !bytes.Equal(key, f.dek) {
				t.Fatalf("key %x, want the DEK", key)
			}
		})
	}
}

func TestCollectorDoesNotKeepCallerSlices(t *testing.T) {
	f := newFixture(t, 2, 0)
	c := NewCollector(f.pub, time.Hour, nil)
	share := slices.Clone(f.shares["alice"])
	if _, _, err := c.Add(share, f.sigs["alice"]); err != nil {
		t.Fatal(err)
	}
	clear(share) // the caller wipes its buffer
	_, key, err := f.add(c, "bob")
	if err != nil || !bytes.Equal(key, f.dek) {
		t.Fatalf("key %x, %v; want the DEK", key, err)
	}
}

func TestCollectorConcurrent(t *testing.T) {
	for _, m := range collectorModes {
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t, m.keys, m.threshold)
			c := NewCollector(f.pub, time.Hour, nil)
			for round := range 5 {
				// Every key owner uploads at once, each twice.
				type result struct {
					remaining int
					key       []byte
					err       error
				}
				results := make(chan result, 2*len(f.names))
				var wg sync.WaitGroup
				for _, name := range f.names {
					for range 2 {
						wg.Go(func() {
							r, key, err := f.add(c, name)
							results <- result{r, key, err}
						})
					}
				}
				wg.Wait()
				close(results)

				var keys, accepted int
				var seen []int
				for res := range results {
					switch {
					case res.err == nil:
						accepted++
						seen = append(seen, res.remaining)
						if res.key != nil {
							keys++
							if !bytes.Equal(res.key, f.dek) {
								t.Fatalf("round %d: wrong key", round)
							}
						}
					case errors.Is(res.err, ErrReusedSecret):
					default:
						t.Fatalf("round %d: %v", round, res.err)
					}
				}
				// Uploads beyond a completed round start the next one, so the
				// accepted uploads count down need-1..0 and then again.
				if keys < 1 || accepted < m.need {
					t.Fatalf("round %d: %d keys from %d accepted uploads", round, keys, accepted)
				}
				slices.Sort(seen)
				if seen[0] != 0 || seen[len(seen)-1] > m.need-1 {
					t.Fatalf("round %d: remaining values %v", round, seen)
				}
				if got, want := c.Remaining(), m.need-(accepted-keys*m.need); got != want {
					t.Fatalf("round %d: Remaining %d after %d accepted uploads and %d keys, want %d", round, got, accepted, keys, want)
				}
				c.Reset()
			}
		})
	}
}

func FuzzCollectorAdd(f *testing.F) {
	fx := newFixture(f, 3, 2)
	for _, name := range fx.names {
		f.Add(fx.shares[name], fx.sigs[name])
	}
	f.Add([]byte{}, []byte{})
	f.Add(make([]byte, DEKSize), make([]byte, 256))
	f.Add(make([]byte, shamirShareSize), fx.sigs["bob"])
	f.Add(fx.shares["alice"], fx.sigs["bob"])

	f.Fuzz(func(t *testing.T, secret, sig []byte) {
		// A round with alice's share already in: one more valid share
		// completes it.
		c := NewCollector(fx.pub, time.Hour, nil)
		if _, _, err := fx.add(c, "alice"); err != nil {
			t.Fatal(err)
		}
		remaining, key, err := c.Add(secret, sig)
		switch {
		case err == nil:
			if remaining != 0 || !bytes.Equal(key, fx.dek) {
				t.Fatalf("accepted upload: remaining %d, key %x", remaining, key)
			}
			if c.Remaining() != 2 {
				t.Fatalf("Remaining after completion %d", c.Remaining())
			}
		case errors.Is(err, ErrInvalidSecret), errors.Is(err, ErrUnknownSecret),
			errors.Is(err, ErrBadSignature), errors.Is(err, ErrReusedSecret):
			if remaining != 1 || key != nil || c.Remaining() != 1 {
				t.Fatalf("rejected upload (%v): remaining %d, key %x", err, remaining, key)
			}
			if errors.Is(err, ErrUnknownSecret) && len(secret) != shamirShareSize {
				t.Fatalf("length %d reported as unknown", len(secret))
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
		if err == nil || errors.Is(err, ErrReusedSecret) {
			// Only genuine shares with valid signatures get this far.
			var isShare bool
			for _, name := range fx.names {
				isShare = isShare || bytes.Equal(secret, fx.shares[name])
			}
			if !isShare {
				t.Fatalf("accepted or reused a non-share %x", secret)
			}
		}
	})
}

func TestAddUnsigned(t *testing.T) {
	f := newFixture(t, 2, 0)
	c := NewCollector(f.pub, 0, nil)
	if _, _, err := c.AddUnsigned(make([]byte, 32)); !errors.Is(err, ErrUnknownSecret) {
		t.Fatalf("unknown share: %v", err)
	}
	first, second := f.names[0], f.names[1]
	if r, _, err := c.AddUnsigned(f.shares[first]); err != nil || r != 1 {
		t.Fatalf("first share: %d, %v", r, err)
	}
	if _, _, err := c.AddUnsigned(f.shares[first]); !errors.Is(err, ErrReusedSecret) {
		t.Fatalf("reused share: %v", err)
	}
	r, key, err := c.AddUnsigned(f.shares[second])
	if err != nil || r != 0 || !bytes.Equal(key, f.dek) {
		t.Fatalf("second share: %d, %v", r, err)
	}
}
