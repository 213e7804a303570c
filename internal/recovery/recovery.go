// Package recovery makes the recovery secrets that let the owners of a
// manifest's RecoveryKeys restore a sealed state whose data key (DEK) is lost,
// and collects their uploads during a recovery.
//
// Generate creates the DEK and one RSA-OAEP-encrypted secret per recovery
// key, with MarbleRun's cryptography (single key, XOR of all shares, or
// Shamir shares over GF(2^8)), so that MarbleRun's CLI and SDK can decrypt,
// sign and upload them. It also returns Public, the recovery data stored in
// clear beside the sealed state, from which a Collector checks each upload
// (its share hash, length and signature) as it arrives and combines the key
// once enough shares are in.
package recovery

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"slices"
)

// DEKSize is the size of the data key and of every single or XOR share.
const DEKSize = 32

// shamirShareSize is the size of a Shamir share: y[0..31] ‖ x.
const shamirShareSize = DEKSize + 1

var (
	// ErrNotPublicKey: the recovery key is not a PEM "PUBLIC KEY" block
	// holding a PKIX public key. The text matches MarbleRun's.
	ErrNotPublicKey = errors.New("given PEM data is not a public key")
	// ErrUnsupportedKeyType: the recovery key is not an RSA key. The text
	// matches MarbleRun's.
	ErrUnsupportedKeyType = errors.New("unsupported type of public key")
	// ErrInvalidThreshold: the recovery threshold does not fit the number of
	// recovery keys.
	ErrInvalidThreshold = errors.New("invalid recovery threshold")
	// ErrInvalidPublic: the public recovery data is inconsistent.
	ErrInvalidPublic = errors.New("invalid public recovery data")
	// ErrNotRecoverable: the sealed state has no recovery keys.
	ErrNotRecoverable = errors.New("the sealed state has no recovery keys and cannot be recovered")
	// ErrInvalidSecret: the uploaded secret has the wrong length for the
	// recovery mode.
	ErrInvalidSecret = errors.New("invalid recovery secret")
	// ErrUnknownSecret: the uploaded secret is none of this state's shares.
	ErrUnknownSecret = errors.New("the secret is not a recovery secret of this sealed state")
	// ErrBadSignature: the upload's signature does not verify; errors.As
	// with *SignatureError names the recovery key.
	ErrBadSignature = errors.New("the signature of the recovery secret does not verify")
	// ErrReusedSecret: the secret was already accepted in this round.
	ErrReusedSecret = errors.New("the recovery secret was already uploaded in this recovery round")
	// ErrUndecryptable: the secret does not decrypt with the ephemeral key.
	ErrUndecryptable = errors.New("the recovery secret does not decrypt with the ephemeral key")
)

// SignatureError reports an upload whose signature does not verify with the
// public key of the recovery key the secret belongs to. It wraps
// ErrBadSignature.
type SignatureError struct {
	Key string // name of the recovery key in the manifest
}

func (e *SignatureError) Error() string {
	return fmt.Sprintf("the signature of the recovery secret does not verify with recovery key %q", e.Key)
}

// Unwrap returns ErrBadSignature.
func (e *SignatureError) Unwrap() error { return ErrBadSignature }

// Mode says how the DEK is shared among the recovery keys.
type Mode string

const (
	// ModeNone: no recovery keys; the DEK is never revealed.
	ModeNone Mode = "none"
	// ModeSingle: one recovery key; its secret is the DEK.
	ModeSingle Mode = "single"
	// ModeXOR: every recovery key holds a 32-byte share; the DEK is the XOR
	// of all of them.
	ModeXOR Mode = "xor"
	// ModeShamir: every recovery key holds a 33-byte Shamir share; any
	// Threshold of them recombine to the DEK.
	ModeShamir Mode = "shamir"
)

// Public is the recovery data kept in clear (but authenticated) beside the
// sealed state. It holds nothing secret. Its JSON form is persisted.
type Public struct {
	Mode Mode `json:"mode"`
	// Threshold is the number of shares a recovery needs: 0 (none), 1
	// (single), N (XOR) or the manifest's threshold (Shamir).
	Threshold int `json:"threshold"`
	// Keys maps each recovery key's name to its public data.
	Keys map[string]Recipient `json:"keys,omitempty"`
}

// Recipient is the public data of one recovery key.
type Recipient struct {
	PublicKey []byte `json:"publicKey"` // PKIX DER
	ShareHash string `json:"shareHash"` // lowercase hex SHA-256 of the plain share
}

// Validate reports whether p is consistent: the mode fits the number of keys
// and the threshold, every public key is an RSA key, and every share hash is
// a distinct lowercase hex SHA-256. Errors wrap ErrInvalidPublic.
func (p Public) Validate() error {
	_, err := p.index()
	return err
}

// recipientKey is a recovery key as the Collector needs it.
type recipientKey struct {
	name string
	pub  *rsa.PublicKey
}

// index validates p and maps each share hash to its recovery key.
func (p Public) index() (map[[sha256.Size]byte]recipientKey, error) {
	n := len(p.Keys)
	var ok bool
	switch p.Mode {
	case ModeNone:
		ok = n == 0 && p.Threshold == 0
	case ModeSingle:
		ok = n == 1 && p.Threshold == 1
	case ModeXOR:
		ok = n >= 2 && p.Threshold == n
	case ModeShamir:
		ok = p.Threshold >= 2 && p.Threshold < n && n <= maxShamirShares
	default:
		return nil, fmt.Errorf("%w: unknown mode %q", ErrInvalidPublic, p.Mode)
	}
	if !ok {
		return nil, fmt.Errorf("%w: mode %q with threshold %d and %d keys", ErrInvalidPublic, p.Mode, p.Threshold, n)
	}
	idx := make(map[[sha256.Size]byte]recipientKey, n)
	for name, r := range p.Keys {
		k, err := x509.ParsePKIXPublicKey(r.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("%w: recovery key %q: %w", ErrInvalidPublic, name, err)
		}
		pub, isRSA := k.(*rsa.PublicKey)
		if !isRSA {
			return nil, fmt.Errorf("%w: recovery key %q: %w", ErrInvalidPublic, name, ErrUnsupportedKeyType)
		}
		var h [sha256.Size]byte
		d, err := hex.DecodeString(r.ShareHash)
		if err != nil || len(d) != len(h) || hex.EncodeToString(d) != r.ShareHash {
			return nil, fmt.Errorf("%w: recovery key %q: share hash is not lowercase hex SHA-256", ErrInvalidPublic, name)
		}
		copy(h[:], d)
		if other, dup := idx[h]; dup {
			return nil, fmt.Errorf("%w: recovery keys %q and %q have the same share hash", ErrInvalidPublic, other.name, name)
		}
		idx[h] = recipientKey{name: name, pub: pub}
	}
	return idx, nil
}

// shareSize returns the size of a plain share in mode m.
func shareSize(m Mode) int {
	if m == ModeShamir {
		return shamirShareSize
	}
	return DEKSize
}

// ParsePublicKeyPEM parses a recovery key from the manifest: a PEM "PUBLIC
// KEY" block (PKIX) holding an RSA key. Errors wrap ErrNotPublicKey or
// ErrUnsupportedKeyType. Data after the first PEM block is ignored, and the
// key size is not checked here (encryption refuses keys below 1024 bits).
func ParsePublicKeyPEM(pemText string) (*rsa.PublicKey, error) {
	block, _ := pem.Decode([]byte(pemText))
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, ErrNotPublicKey
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotPublicKey, err)
	}
	pub, ok := k.(*rsa.PublicKey)
	if !ok {
		return nil, ErrUnsupportedKeyType
	}
	return pub, nil
}

// selectMode returns the mode and the number of shares a recovery needs for
// n keys and the manifest's threshold (0 means all keys). Errors wrap
// ErrInvalidThreshold; their texts follow the manifest validation's.
func selectMode(n int, threshold uint) (Mode, int, error) {
	switch {
	case threshold == 1:
		return "", 0, fmt.Errorf("%w: if set, threshold must be at least 2", ErrInvalidThreshold)
	case threshold > uint(n):
		return "", 0, fmt.Errorf("%w: not enough recovery keys (%d) defined to meet the recovery threshold of %d",
			ErrInvalidThreshold, n, threshold)
	case n == 0:
		return ModeNone, 0, nil
	case n == 1:
		return ModeSingle, 1, nil
	case threshold == 0 || threshold == uint(n):
		return ModeXOR, n, nil
	case n > maxShamirShares:
		return "", 0, fmt.Errorf("%w: a threshold needs at most %d recovery keys, got %d",
			ErrInvalidThreshold, maxShamirShares, n)
	default:
		return ModeShamir, int(threshold), nil
	}
}

// Generate creates a random 32-byte DEK and the recovery secrets for keys
// (recovery key name → RSA public key) and threshold (the manifest's
// RecoveryThreshold; 0 means all keys):
//
//   - no keys: no secrets; the DEK cannot be recovered (ModeNone);
//   - one key, threshold 0: the secret is the DEK (ModeSingle);
//   - N ≥ 2 keys, threshold 0 or N: N random 32-byte shares whose XOR is
//     the DEK (ModeXOR);
//   - N ≥ 2 keys, 2 ≤ threshold < N: 33-byte Shamir shares y[0..31] ‖ x of
//     the DEK, any threshold of which recombine to it (ModeShamir).
//
// Other thresholds (1, or more than N) return an error wrapping
// ErrInvalidThreshold. Each secret is its plain share encrypted with RSA-OAEP
// (SHA-256 for the hash and MGF1, empty label) to its key, which is what
// MarbleRun's CLI and SDK decrypt; secrets is never nil. pub holds the public
// recovery data for the sealed state. rand supplies all randomness
// (crypto/rand.Reader outside tests).
func Generate(rand io.Reader, keys map[string]*rsa.PublicKey, threshold uint) (dek []byte, secrets map[string][]byte, pub Public, err error) {
	mode, need, err := selectMode(len(keys), threshold)
	if err != nil {
		return nil, nil, Public{}, err
	}
	names := make([]string, 0, len(keys))
	for name, k := range keys {
		if k == nil {
			return nil, nil, Public{}, fmt.Errorf("recovery key %q is missing", name)
		}
		names = append(names, name)
	}
	slices.Sort(names) // a deterministic rand gives deterministic output

	var shares [][]byte // shares[i] belongs to names[i]
	switch mode {
	case ModeNone, ModeSingle:
		if dek, err = randomBytes(rand, DEKSize); err != nil {
			return nil, nil, Public{}, err
		}
		if mode == ModeSingle {
			shares = [][]byte{dek}
		}
	case ModeXOR:
		if shares, dek, err = xorShares(rand, len(names), DEKSize); err != nil {
			return nil, nil, Public{}, err
		}
	case ModeShamir:
		if dek, err = randomBytes(rand, DEKSize); err != nil {
			return nil, nil, Public{}, err
		}
		if shares, err = shamirSplit(rand, dek, len(names), need); err != nil {
			return nil, nil, Public{}, err
		}
	}
	if mode != ModeSingle { // a single share is the DEK itself
		defer func() {
			for _, s := range shares {
				clear(s)
			}
		}()
	}

	secrets = make(map[string][]byte, len(names))
	pub = Public{Mode: mode, Threshold: need}
	if len(names) > 0 {
		pub.Keys = make(map[string]Recipient, len(names))
	}
	for i, name := range names {
		der, err := x509.MarshalPKIXPublicKey(keys[name])
		if err != nil {
			return nil, nil, Public{}, fmt.Errorf("recovery key %q: %w", name, err)
		}
		ct, err := rsa.EncryptOAEP(sha256.New(), rand, keys[name], shares[i], nil)
		if err != nil {
			return nil, nil, Public{}, fmt.Errorf("encrypting the recovery secret for key %q: %w", name, err)
		}
		h := sha256.Sum256(shares[i])
		secrets[name] = ct
		pub.Keys[name] = Recipient{PublicKey: der, ShareHash: hex.EncodeToString(h[:])}
	}
	return dek, secrets, pub, nil
}

// IsPlainSecretLength reports whether n is the length of a plain recovery
// secret (16 for legacy keys, 32, or 33 for a Shamir share). An upload of any
// other length is taken to be encrypted with the ephemeral key.
func IsPlainSecretLength(n int) bool {
	return n == 16 || n == DEKSize || n == shamirShareSize
}

// DecryptWithEphemeral decrypts a recovery secret that a client encrypted to
// the ephemeral public key (RSA-OAEP, SHA-256 for the hash and MGF1, empty
// label). Errors wrap ErrUndecryptable. The result is not checked further;
// the Collector checks it.
func DecryptWithEphemeral(priv *rsa.PrivateKey, ciphertext []byte) ([]byte, error) {
	if priv == nil {
		return nil, fmt.Errorf("%w: no ephemeral key", ErrUndecryptable)
	}
	plain, err := priv.Decrypt(nil, ciphertext, &rsa.OAEPOptions{Hash: crypto.SHA256, MGFHash: crypto.SHA256})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUndecryptable, err)
	}
	return plain, nil
}
