package seal

import "fmt"

// KeySealer protects the data key at rest: SealKey returns the bytes to
// store in a key file entry, UnsealKey recovers the data key from them.
// mode is the manifest's SealMode ("" = ProductKey, UniqueKey); a sealer
// records it in what it returns, so that UnsealKey needs no mode.
// binding is what the entry is bound to (see EncodeKeyFile): the SHA-256
// of the sealed blob it opens, or the key ID of the data key (KeyID; every
// blob sealed under it names it), nil for a legacy entry; a sealer that
// can authenticate additional data binds the sealed key to it, so that a
// key only opens for what it was sealed for. An error from UnsealKey means the state cannot
// be opened here (the Coordinator then enters recovery mode; it does not
// delete anything).
type KeySealer interface {
	SealKey(dek, binding []byte, mode string) ([]byte, error)
	UnsealKey(sealed, binding []byte) ([]byte, error)
}

// KeyProtection is implemented by a KeySealer that says whether it protects
// the data key from whoever can read and write the stores (the host's disk,
// etcd). Ask it through ProtectsKey.
type KeyProtection interface {
	// ProtectsKey reports whether only this sealer (an enclave) can make
	// and open what it stores: then nothing the stores hold in clear may
	// decide the data key or the state (docs/threat-model.md).
	ProtectsKey() bool
}

// ProtectsKey reports whether s protects the data key. A sealer that does
// not implement KeyProtection is taken to protect it, so that the stricter
// rules of an enclave Coordinator apply unless a sealer says otherwise.
func ProtectsKey(s KeySealer) bool {
	if p, ok := s.(KeyProtection); ok {
		return p.ProtectsKey()
	}
	return true
}

// SimulationKeySealer is the KeySealer without an enclave: the sealed key IS
// the raw 32-byte data key, as MarbleRun's no-enclave sealed_key file, and
// the binding is not authenticated (the blob's own AES-GCM tag still fails
// under a wrong key). In simulation the key file is therefore unprotected:
// anyone who can read it can decrypt the state.
type SimulationKeySealer struct{}

var _ KeySealer = SimulationKeySealer{}

// ProtectsKey is false: the key file holds the data key in clear.
func (SimulationKeySealer) ProtectsKey() bool { return false }

// SealKey returns a copy of dek, which must be KeySize bytes (else ErrKeySize).
func (SimulationKeySealer) SealKey(dek, _ []byte, _ string) ([]byte, error) {
	if len(dek) != KeySize {
		return nil, fmt.Errorf("%w: got %d bytes", ErrKeySize, len(dek))
	}
	return append([]byte{}, dek...), nil
}

// UnsealKey returns a copy of sealed, which must be KeySize bytes; any other
// length (an empty or damaged key) gives ErrKeySize.
func (SimulationKeySealer) UnsealKey(sealed, _ []byte) ([]byte, error) {
	if len(sealed) != KeySize {
		return nil, fmt.Errorf("%w: sealed key has %d bytes", ErrKeySize, len(sealed))
	}
	return append([]byte{}, sealed...), nil
}

// ModeReporter is implemented by a KeySealer that can tell the seal mode a
// key it sealed is sealed in. Ask it through SealedIn.
type ModeReporter interface {
	// SealedIn reports whether sealed, which UnsealKey opened, is sealed
	// as SealKey seals a key in mode.
	SealedIn(sealed []byte, mode string) bool
}

// SealedIn reports whether sealed, which s unsealed, is sealed as
// s.SealKey seals in mode: a key file entry that already is needs no
// sealing again. False when s cannot tell.
func SealedIn(s KeySealer, sealed []byte, mode string) bool {
	if r, ok := s.(ModeReporter); ok {
		return r.SealedIn(sealed, mode)
	}
	return false
}

// SealedIn is true: the simulation sealer seals the same way in every mode.
func (SimulationKeySealer) SealedIn([]byte, string) bool { return true }
