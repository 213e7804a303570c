package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	cryptorand "crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Seal modes a KeySealer understands (the manifest's Config.SealMode; ""
// means ProductKey).
const (
	ModeProductKey = "ProductKey"
	ModeUniqueKey  = "UniqueKey"
)

// Gramine's sealing-key pseudo-files, relative to its attestation
// directory (/dev/attestation): 16-byte SGX sealing keys bound to the
// enclave's signer (MRSIGNER) or to the enclave itself (MRENCLAVE).
const (
	GramineMRSignerKey  = "keys/_sgx_mrsigner"
	GramineMREnclaveKey = "keys/_sgx_mrenclave"
)

// Errors of the Gramine key sealer that callers branch on.
var (
	// ErrSealedElsewhere: the sealed key does not open with this enclave's
	// sealing key: another enclave (MRENCLAVE, for UniqueKey) or another
	// signer (MRSIGNER, for ProductKey) sealed it, or it belongs to
	// another sealed_data (the binding differs).
	ErrSealedElsewhere = errors.New("seal: the data key was sealed by another enclave, or for another sealed_data")
	// ErrOtherSealer: the sealed key was made by another sealer (the
	// simulation sealer, say) and is never opened by this one.
	ErrOtherSealer = errors.New("seal: the data key was sealed another way")
)

// gramineMagic starts a data key sealed by GramineKeySealer:
//
//	magic "QRYGSK" (6 bytes) ‖ version (1 byte, 1) ‖ mode length M (1 byte) ‖
//	mode (M bytes) ‖ nonce (12 bytes) ‖ AES-256-GCM(data key) ‖ tag (16)
//
// The wrapping key is HKDF-SHA256(IKM = the 16-byte SGX sealing key of the
// mode, salt = none, info = gramineLabel + mode), 32 bytes. The additional
// data is everything before the nonce followed by the binding (the SHA-256
// of the sealed_data the key opens), so neither the mode nor the binding
// can be changed without the sealing key.
const (
	gramineMagic   = "QRYGSK"
	gramineVersion = 1
	gramineLabel   = "quarry sealed_key v1 "
)

// GramineKeySealer seals the data key with the SGX sealing keys that
// Gramine exposes inside the enclave (Dir is its attestation directory,
// normally /dev/attestation; tests point it at a fake).
type GramineKeySealer struct {
	Dir string
	// Rand is the nonce source; nil means crypto/rand.
	Rand io.Reader
}

var _ KeySealer = GramineKeySealer{}

// ProtectsKey is true: only an enclave with the same sealing key opens or
// makes a sealed key.
func (GramineKeySealer) ProtectsKey() bool { return true }

// SealKey wraps dek under the sealing key of mode (ProductKey: MRSIGNER,
// UniqueKey: MRENCLAVE; "" is ProductKey), bound to binding.
func (g GramineKeySealer) SealKey(dek, binding []byte, mode string) ([]byte, error) {
	if len(dek) != KeySize {
		return nil, fmt.Errorf("%w: got %d bytes", ErrKeySize, len(dek))
	}
	mode = CanonicalMode(mode)
	aead, err := g.aead(mode)
	if err != nil {
		return nil, err
	}
	hdr := append([]byte(gramineMagic), gramineVersion, byte(len(mode)))
	hdr = append(hdr, mode...)
	nonce := make([]byte, aead.NonceSize())
	r := g.Rand
	if r == nil {
		r = cryptorand.Reader
	}
	if _, err := io.ReadFull(r, nonce); err != nil {
		return nil, fmt.Errorf("seal: read nonce: %w", err)
	}
	out := append(append([]byte{}, hdr...), nonce...)
	return aead.Seal(out, nonce, dek, additional(hdr, binding)), nil
}

// UnsealKey opens a data key sealed by SealKey with the same binding, in
// the mode its header names. A key sealed another way (no Gramine header)
// is ErrOtherSealer; a key that does not open here is ErrSealedElsewhere.
func (g GramineKeySealer) UnsealKey(sealed, binding []byte) ([]byte, error) {
	if len(sealed) < len(gramineMagic)+2 || string(sealed[:len(gramineMagic)]) != gramineMagic {
		return nil, fmt.Errorf("%w: not sealed by the Gramine sealer (sealed without an enclave?)", ErrOtherSealer)
	}
	if v := sealed[len(gramineMagic)]; v != gramineVersion {
		return nil, fmt.Errorf("seal: Gramine sealed key version %d (this build reads %d)", v, gramineVersion)
	}
	m := int(sealed[len(gramineMagic)+1])
	hdrEnd := len(gramineMagic) + 2 + m
	if len(sealed) < hdrEnd {
		return nil, fmt.Errorf("%w: truncated Gramine sealed key", ErrKeySize)
	}
	mode := string(sealed[len(gramineMagic)+2 : hdrEnd])
	if mode != ModeProductKey && mode != ModeUniqueKey {
		return nil, fmt.Errorf("seal: Gramine sealed key names the unknown seal mode %q", mode)
	}
	aead, err := g.aead(mode)
	if err != nil {
		return nil, err
	}
	rest := sealed[hdrEnd:]
	if len(rest) < aead.NonceSize()+aead.Overhead() {
		return nil, fmt.Errorf("%w: truncated Gramine sealed key", ErrKeySize)
	}
	dek, err := aead.Open(nil, rest[:aead.NonceSize()], rest[aead.NonceSize():], additional(sealed[:hdrEnd], binding))
	if err != nil {
		return nil, fmt.Errorf("%w (seal mode %s: %s)", ErrSealedElsewhere, mode, modeMeaning(mode))
	}
	if len(dek) != KeySize {
		return nil, fmt.Errorf("%w: sealed key holds %d bytes", ErrKeySize, len(dek))
	}
	return dek, nil
}

// SealedIn reports whether sealed names mode (its header, authenticated
// when UnsealKey opened it) as its seal mode ("" is ProductKey).
func (GramineKeySealer) SealedIn(sealed []byte, mode string) bool {
	if len(sealed) < len(gramineMagic)+2 || string(sealed[:len(gramineMagic)]) != gramineMagic {
		return false
	}
	m := int(sealed[len(gramineMagic)+1])
	hdrEnd := len(gramineMagic) + 2 + m
	return len(sealed) >= hdrEnd && string(sealed[len(gramineMagic)+2:hdrEnd]) == CanonicalMode(mode)
}

// SealingKey reads the 16-byte SGX sealing key of mode from the Gramine
// directory.
func (g GramineKeySealer) SealingKey(mode string) ([]byte, error) {
	name := GramineMRSignerKey
	if CanonicalMode(mode) == ModeUniqueKey {
		name = GramineMREnclaveKey
	}
	path := filepath.Join(g.Dir, filepath.FromSlash(name))
	k, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("seal: reading Gramine's sealing key: %w", err)
	}
	if len(k) != 16 {
		return nil, fmt.Errorf("seal: Gramine's sealing key %s has %d bytes, want 16", path, len(k))
	}
	return k, nil
}

func (g GramineKeySealer) aead(mode string) (cipher.AEAD, error) {
	sk, err := g.SealingKey(mode)
	if err != nil {
		return nil, err
	}
	wrap, err := hkdf.Key(sha256.New, sk, nil, gramineLabel+mode, 32)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	block, err := aes.NewCipher(wrap)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return cipher.NewGCM(block)
}

func additional(hdr, binding []byte) []byte {
	return append(append([]byte{}, hdr...), binding...)
}

// CanonicalMode is the seal mode mode stands for: "" (the default) is
// ProductKey.
func CanonicalMode(mode string) string {
	if mode == "" {
		return ModeProductKey
	}
	return mode
}

func modeMeaning(mode string) string {
	if mode == ModeUniqueKey {
		return "sealed to another enclave (MRENCLAVE), or for another sealed_data"
	}
	return "sealed by an enclave of another signer (MRSIGNER), or for another sealed_data"
}
