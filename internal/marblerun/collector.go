package marblerun

import (
	"bytes"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/internal/recovery"
)

// Share is one accepted recovery secret.
type Share struct {
	Secret    []byte // the plain share (or, for a single key, the data key)
	Signature []byte // PKCS #1 v1.5 over SHA-256(Secret); nil if unsigned
	Signed    bool   // uploaded with a signature (v2); false for v1
	// Key names the recovery key the signature verified under; "" when
	// the keys were not known at upload (checked after decryption).
	Key string
}

// CollectorOptions describe what is known about the state besides its
// recovery data.
type CollectorOptions struct {
	// Keys are the recovery public keys by name. A state still in
	// MarbleRun's format holds them only inside its encrypted manifest:
	// then nil, and signatures are checked by the caller once the state
	// decrypts. A migrated state keeps them in its clear header, and each
	// upload's signature is checked when it arrives (docs/design/decisions.md#d6).
	Keys map[string]*rsa.PublicKey
	// Threshold is the number of Shamir shares a recovery needs; 0 when
	// unknown (a state in MarbleRun's format): the shares are then
	// combined and tried from the second one on.
	Threshold int
	// Opens reports whether a data key decrypts the sealed state.
	Opens func(key []byte) bool
	// TTL bounds a round's life from its first accepted share (≤ 0:
	// forever); Now defaults to time.Now.
	TTL time.Duration
	Now func() time.Time
}

// Collector gathers the recovery secrets of a state whose recovery data is
// MarbleRun's: null (the secret is the data key itself), or a set of share
// hashes that does not say which recovery key holds which share (XOR shares
// of 32 bytes, all needed; Shamir shares of 33 bytes, a threshold of them
// needed). Each upload is checked when it arrives: its length, that its
// hash is one of the state's (or, for a single key, that it decrypts the
// state), that it was not accepted before and, when the keys are known,
// its signature. A rejected upload leaves the round as it was. Safe for
// concurrent use.
type Collector struct {
	hashes map[[sha256.Size]byte]bool // nil: single key
	opts   CollectorOptions

	mu      sync.Mutex
	started time.Time
	shares  []Share
}

// NewCollector returns a Collector for a state with MarbleRun's share
// hashes (nil: a single recovery key).
func NewCollector(shareHashes []string, opts CollectorOptions) *Collector {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Collector{opts: opts}
	if shareHashes != nil {
		c.hashes = make(map[[sha256.Size]byte]bool, len(shareHashes))
		for _, h := range shareHashes {
			var d [sha256.Size]byte
			if b, err := hex.DecodeString(h); err == nil && len(b) == sha256.Size {
				copy(d[:], b)
				c.hashes[d] = true
			}
		}
	}
	return c
}

// Add offers one plain secret. It returns the number of shares still
// needed and, when that reaches 0, the data key and the shares that made
// it (the round then starts over). With unknown keys the caller must check
// the shares' signatures against the decrypted state's recovery keys.
// Errors wrap recovery.ErrInvalidSecret, ErrUnknownSecret, ErrReusedSecret
// or ErrBadSignature.
func (c *Collector) Add(secret, signature []byte, signed bool) (remaining int, key []byte, shares []Share, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	if c.opts.TTL > 0 && len(c.shares) > 0 && !now.Before(c.started.Add(c.opts.TTL)) {
		c.reset()
	}
	share := Share{Secret: bytes.Clone(secret), Signature: bytes.Clone(signature), Signed: signed}
	digest := sha256.Sum256(secret)

	if c.hashes == nil { // single key: the secret is the data key
		if len(secret) != 32 && len(secret) != 16 {
			return 1, nil, nil, fmt.Errorf("%w: got %d bytes, expected the 32-byte data key", recovery.ErrInvalidSecret, len(secret))
		}
		if signed && c.opts.Keys != nil {
			if share.Key, err = c.verify(digest[:], signature); err != nil {
				return 1, nil, nil, err
			}
		}
		if c.opts.Opens != nil && !c.opts.Opens(secret) {
			return 1, nil, nil, fmt.Errorf("%w: it does not decrypt the sealed state", recovery.ErrUnknownSecret)
		}
		return 0, bytes.Clone(secret), []Share{share}, nil
	}

	switch {
	case len(secret) != 32 && len(secret) != 33:
		return c.remaining(), nil, nil, fmt.Errorf("%w: got %d bytes, expected a 32-byte share or a 33-byte threshold share", recovery.ErrInvalidSecret, len(secret))
	case len(c.shares) > 0 && len(c.shares[0].Secret) != len(secret):
		return c.remaining(), nil, nil, fmt.Errorf("%w: recovery secrets must match in length: got %d bytes, the round's first has %d", recovery.ErrInvalidSecret, len(secret), len(c.shares[0].Secret))
	case !c.hashes[digest]:
		return c.remaining(), nil, nil, recovery.ErrUnknownSecret
	}
	for _, s := range c.shares {
		if bytes.Equal(s.Secret, secret) {
			return c.remaining(), nil, nil, recovery.ErrReusedSecret
		}
	}
	if signed && c.opts.Keys != nil {
		if share.Key, err = c.verify(digest[:], signature); err != nil {
			return c.remaining(), nil, nil, err
		}
	}
	if len(c.shares) == 0 {
		c.started = now
	}
	c.shares = append(c.shares, share)
	if r := c.remaining(); r > 0 && (len(secret) == 32 || c.opts.Threshold > 0 || len(c.shares) < 2) {
		return r, nil, nil, nil
	}
	if len(secret) == 32 {
		key = recovery.CombineXOR(c.secrets())
	} else if key, err = recovery.CombineShamir(c.secrets()); err != nil {
		c.reset()
		return c.remaining(), nil, nil, fmt.Errorf("%w: %v", recovery.ErrInvalidSecret, err)
	}
	if c.opts.Opens != nil && !c.opts.Opens(key) {
		if len(secret) == 33 && c.opts.Threshold == 0 && len(c.shares) < len(c.hashes) {
			return 1, nil, nil, nil // the threshold is not reached yet
		}
		c.reset()
		return c.remaining(), nil, nil, fmt.Errorf("%w: the combined shares do not decrypt the sealed state; upload them again", recovery.ErrUnknownSecret)
	}
	shares = c.shares
	c.shares, c.started = nil, time.Time{}
	return 0, key, shares, nil
}

// verify finds the recovery key, not yet used in this round, under which
// signature verifies.
func (c *Collector) verify(digest, signature []byte) (string, error) {
	used := map[string]bool{}
	for _, s := range c.shares {
		used[s.Key] = true
	}
	for name, k := range c.opts.Keys {
		if k != nil && rsa.VerifyPKCS1v15(k, crypto.SHA256, digest, signature) == nil {
			if used[name] {
				return "", fmt.Errorf("%w: recovery key %q already uploaded a share in this round", recovery.ErrReusedSecret, name)
			}
			return name, nil
		}
	}
	return "", fmt.Errorf("%w: it verifies under none of the manifest's recovery keys", recovery.ErrBadSignature)
}

// remaining is what the round still needs: all XOR shares, the known
// threshold, or (threshold unknown) at least one more. c.mu must be held.
func (c *Collector) remaining() int {
	if c.hashes == nil {
		return 1
	}
	shamir := c.opts.Threshold > 0 || len(c.shares) > 0 && len(c.shares[0].Secret) == 33
	switch {
	case !shamir:
		return len(c.hashes) - len(c.shares)
	case c.opts.Threshold > 0:
		return max(c.opts.Threshold-len(c.shares), 0)
	default:
		return 1
	}
}

func (c *Collector) secrets() [][]byte {
	out := make([][]byte, len(c.shares))
	for i, s := range c.shares {
		out[i] = s.Secret
	}
	return out
}

// Reset drops the round's shares.
func (c *Collector) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reset()
}

func (c *Collector) reset() {
	for _, s := range c.shares {
		clear(s.Secret)
	}
	c.shares, c.started = nil, time.Time{}
}

// CheckSignatures is MarbleRun's final check after the state decrypted
// (docs/design/behaviour.md#recovery-final-check): every signed share's signature verifies under
// a distinct recovery key of the state's manifest, and there are as many
// shares as needed (all keys, or the threshold). keys are the manifest's
// recovery keys by name; threshold its RecoveryThreshold. It returns the
// key names in share order. Unsigned shares (v1) are not checked.
func CheckSignatures(shares []Share, keys map[string]*rsa.PublicKey, threshold int) ([]string, error) {
	need := len(keys)
	if threshold > 0 && threshold < len(keys) {
		need = threshold
	}
	if len(keys) <= 1 {
		need = 1
	}
	if len(shares) != need {
		return nil, fmt.Errorf("recovery keys in manifest do not match the keys used for recovery: expected %d, got %d", need, len(shares))
	}
	used := map[string]bool{}
	names := make([]string, len(shares))
	for i, s := range shares {
		if !s.Signed {
			continue
		}
		digest := sha256.Sum256(s.Secret)
		found := ""
		for name, k := range keys {
			if !used[name] && k != nil && rsa.VerifyPKCS1v15(k, crypto.SHA256, digest[:], s.Signature) == nil {
				found = name
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("%w: share %d (SHA-256 %x…) verifies under none of the sealed manifest's unused recovery keys", recovery.ErrBadSignature, i+1, digest[:4])
		}
		used[found], names[i] = true, found
	}
	return names, nil
}
