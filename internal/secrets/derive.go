package secrets

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
	"errors"

	"github.com/quarry-cc/quarry/manifest"
)

// ErrNoRootSecret means a per-Marble key was to be derived without a root
// secret.
var ErrNoRootSecret = errors.New("no root secret to derive per-Marble secrets from")

// UUID is a Marble instance's activation UUID (RFC 9562 byte order).
type UUID [16]byte

// String returns the canonical lowercase form,
// xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
	return string(b[:])
}

// Binding identifies the Marble instance a per-Marble secret is derived for.
type Binding struct {
	UUID   UUID   // the instance's activation UUID
	Marble string // the Marble's name in the manifest
	// DisableSecretBinding is the Marble's manifest flag: derive with an
	// empty HKDF info instead of the Marble name (MarbleRun before 1.6.0).
	DisableSecretBinding bool
}

// DerivePerMarble derives the value of the per-Marble symmetric-key secret
// def named name for one Marble instance (docs/design/behaviour.md#secret-generation):
//
//	key = HKDF-SHA256(IKM = rootSecret, salt = b.UUID.String() + name,
//	                  info = b.Marble, or "" with DisableSecretBinding,
//	                  length = Size/8)
//
// The same inputs always give the same key, so the key survives restarts.
// Private and Public both hold the key.
func DerivePerMarble(rootSecret []byte, name string, def manifest.Secret, b Binding) (Secret, error) {
	if def.Type != manifest.SecretTypeSymmetric {
		return Secret{}, invalidf(name, "secret %s of type %s cannot be derived: only symmetric keys are", name, def.Type)
	}
	if err := checkSymmetricSize(name, def.Size, true); err != nil {
		return Secret{}, err
	}
	if len(rootSecret) == 0 {
		return Secret{}, failed(name, ErrNoRootSecret)
	}
	info := b.Marble
	if b.DisableSecretBinding {
		info = ""
	}
	key, err := hkdf.Key(sha256.New, rootSecret, []byte(b.UUID.String()+name), info, int(def.Size/8))
	if err != nil {
		return Secret{}, failed(name, err)
	}
	s := definition(def)
	s.Private, s.Public = key, key
	return s, nil
}
