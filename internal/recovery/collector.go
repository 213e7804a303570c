package recovery

import (
	"bytes"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// Collector gathers the plain shares of one recovery round. Each upload is
// checked when it arrives (length, share hash, signature, reuse); a rejected
// upload leaves the round as it was. Once enough shares are in, Add returns
// the combined key and a new round begins.
//
// Shares are kept only in memory. A round expires ttl after its first
// accepted share; it then starts over silently. A Collector is safe for
// concurrent use: its methods are serialised by a mutex.
type Collector struct {
	now       func() time.Time
	ttl       time.Duration
	mode      Mode
	need      int
	shareSize int
	keys      map[[sha256.Size]byte]recipientKey // by share hash
	err       error                              // set when no upload can succeed

	mu       sync.Mutex
	started  time.Time         // when the round's first share was accepted
	accepted map[string][]byte // recovery key name → plain share
}

// NewCollector returns a Collector for the sealed state whose public recovery
// data is pub. A ttl ≤ 0 means rounds never expire; now defaults to
// time.Now. If pub has no recovery keys, Add returns ErrNotRecoverable; if
// pub is inconsistent (see Public.Validate), Add returns that error.
func NewCollector(pub Public, ttl time.Duration, now func() time.Time) *Collector {
	if now == nil {
		now = time.Now
	}
	c := &Collector{
		now:       now,
		ttl:       ttl,
		mode:      pub.Mode,
		need:      pub.Threshold,
		shareSize: shareSize(pub.Mode),
		accepted:  make(map[string][]byte),
	}
	c.keys, c.err = pub.index()
	if c.err == nil && pub.Mode == ModeNone {
		c.err = ErrNotRecoverable
	}
	return c
}

// Add offers one plain share (32 bytes, or 33 in ModeShamir) and its
// signature: RSA PKCS #1 v1.5 over SHA-256(secret) by the recovery key the
// share was encrypted to. It returns the number of shares still needed. When
// that reaches 0 it also returns the combined key and resets the round. The
// caller test-decrypts the sealed state with the key; if that fails it calls
// Reset, which also discards anything uploaded in the meantime.
//
// Errors, with remaining unchanged: ErrNotRecoverable, ErrInvalidPublic,
// ErrInvalidSecret (wrong length), ErrUnknownSecret (not a share of this
// state), *SignatureError wrapping ErrBadSignature, ErrReusedSecret (already
// accepted in this round).
func (c *Collector) Add(secret, signature []byte) (remaining int, key []byte, err error) {
	return c.add(secret, signature, true)
}

// AddUnsigned is Add without the signature check, for the unprefixed API
// whose recover request carries no signature (docs/design/decisions.md#d11): the share must
// still be one of this state's shares (its hash is in the public data), so
// only a holder of a decrypted share can make progress.
func (c *Collector) AddUnsigned(secret []byte) (remaining int, key []byte, err error) {
	return c.add(secret, nil, false)
}

func (c *Collector) add(secret, signature []byte, checkSignature bool) (remaining int, key []byte, err error) {
	if c.err != nil {
		return 0, nil, c.err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	c.expire(now)

	if len(secret) != c.shareSize {
		return c.remaining(), nil, fmt.Errorf("%w: got %d bytes, expected %d", ErrInvalidSecret, len(secret), c.shareSize)
	}
	digest := sha256.Sum256(secret)
	k, ok := c.keys[digest]
	if !ok {
		return c.remaining(), nil, ErrUnknownSecret
	}
	if checkSignature && rsa.VerifyPKCS1v15(k.pub, crypto.SHA256, digest[:], signature) != nil {
		return c.remaining(), nil, &SignatureError{Key: k.name}
	}
	if _, dup := c.accepted[k.name]; dup {
		return c.remaining(), nil, ErrReusedSecret
	}

	if len(c.accepted) == 0 {
		c.started = now
	}
	c.accepted[k.name] = bytes.Clone(secret)
	if r := c.remaining(); r > 0 {
		return r, nil, nil
	}
	defer c.reset()
	key, err = c.combine()
	if err != nil {
		return 0, nil, err
	}
	return 0, key, nil
}

// Remaining returns the number of shares the current round still needs; it
// is 0 when Add can never succeed (no recovery keys, inconsistent data).
func (c *Collector) Remaining() int {
	if c.err != nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(c.now())
	return c.remaining()
}

// Reset wipes the shares of the current round and starts a new one.
func (c *Collector) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reset()
}

// remaining returns the shares still needed. c.mu must be held.
func (c *Collector) remaining() int { return c.need - len(c.accepted) }

// expire resets the round if it is older than the ttl. c.mu must be held.
func (c *Collector) expire(now time.Time) {
	if c.ttl > 0 && len(c.accepted) > 0 && !now.Before(c.started.Add(c.ttl)) {
		c.reset()
	}
}

// reset wipes the accepted shares. c.mu must be held.
func (c *Collector) reset() {
	for name, s := range c.accepted {
		clear(s)
		delete(c.accepted, name)
	}
	c.started = time.Time{}
}

// combine returns the key from the accepted shares. c.mu must be held.
func (c *Collector) combine() ([]byte, error) {
	shares := make([][]byte, 0, len(c.accepted))
	for _, s := range c.accepted {
		shares = append(shares, s)
	}
	switch c.mode {
	case ModeSingle:
		return bytes.Clone(shares[0]), nil
	case ModeXOR:
		return xorCombine(shares), nil
	default: // ModeShamir; NewCollector admits no other mode here
		return shamirCombine(shares)
	}
}
