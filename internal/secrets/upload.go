package secrets

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"

	"github.com/quarry-cc/quarry/manifest"
)

// Upload is the value a user sends for one user-defined secret, already
// decoded from base64. Both API vocabularies map onto it: v1 Key, Cert,
// Private and v2 key, cert, private, public. An empty field counts as
// absent.
type Upload struct {
	Key     []byte // a symmetric key, or the data of a plain secret
	Cert    []byte // a DER X.509 certificate
	Private []byte // the certificate's PKCS#8 private key
	Public  []byte // the certificate's PKIX public key
}

// ApplyUpload checks u against the stored secret current named name and
// returns the new stored secret (docs/design/decisions.md#d4, docs/design/behaviour.md#user-defined-secrets). Every
// error names the secret and wraps ErrInvalid.
//
// Rules:
//   - current must be user-defined ("secret <n> is not writeable").
//   - An upload is either Key alone, or Cert with Private and/or Public;
//     never both groups.
//   - symmetric-key: Key only, exactly Size/8 bytes. Stored as Private =
//     Public = Key.
//   - plain: Key only, any length; an empty or absent Key stores empty data
//     (a value, unlike a never-uploaded secret). Stored as Private = Public
//     = Key.
//   - cert-ecdsa, cert-rsa, cert-ed25519: Cert is required and must parse;
//     its public key must be of the secret's type; a non-zero Size must
//     equal the curve size (ECDSA) or modulus size (RSA); Size 0 accepts any
//     size (a user-defined definition need not state one), and Ed25519
//     ignores Size. A given Private must be a PKCS#8 key whose public
//     half is the certificate's key; a given Public must be a PKIX key equal
//     to the certificate's key. Stored: Cert, Private as given (nil when not
//     given) and Public = PKIX of the certificate's key.
//
// Only PKCS#8 private keys are accepted (not PKCS#1 or SEC1) because the
// stored Private is rendered as a "PRIVATE KEY" PEM block, which means
// PKCS#8, and a generated secret's Private is PKCS#8 too.
func ApplyUpload(name string, current Secret, u Upload) (Secret, error) {
	if !current.UserDefined {
		return Secret{}, invalidf(name, "secret %s is not writeable", name)
	}
	hasKey := len(u.Key) > 0
	hasCertGroup := len(u.Cert) > 0 || len(u.Private) > 0 || len(u.Public) > 0
	if hasKey && hasCertGroup {
		return Secret{}, invalidf(name, "secret %s: give either a key alone, or a certificate with its private and/or public key, not both", name)
	}

	next := current
	next.Cert, next.Private, next.Public = nil, nil, nil
	switch current.Type {
	case manifest.SecretTypeSymmetric:
		if hasCertGroup {
			return Secret{}, invalidf(name, "secret %s is set to be of type symmetric-key but specified values for a certificate", name)
		}
		if current.Size == 0 || current.Size%8 != 0 {
			return Secret{}, invalidf(name, "invalid secret size: %s", name)
		}
		if uint(len(u.Key)) != current.Size/8 {
			return Secret{}, invalidf(name, "declared size and actual size don't match: %s (the key must be %d bytes, got %d)", name, current.Size/8, len(u.Key))
		}
		key := clone(u.Key)
		next.Private, next.Public = key, key
		return next, nil

	case manifest.SecretTypePlain:
		if hasCertGroup {
			return Secret{}, invalidf(name, "secret %s is set to be of type plain but specified values for a certificate", name)
		}
		data := clone(u.Key)
		if data == nil {
			data = []byte{}
		}
		next.Private, next.Public = data, data
		return next, nil

	case manifest.SecretTypeCertECDSA, manifest.SecretTypeCertRSA, manifest.SecretTypeCertED25519:
		if hasKey {
			return Secret{}, invalidf(name, "secret %s is set to be of type %s but specified values for a symmetric-key", name, current.Type)
		}
		return applyCert(name, next, u)
	}
	return Secret{}, invalidf(name, "unknown type: %s for secret: %s", current.Type, name)
}

// applyCert checks and stores a certificate upload for a cert-* secret.
func applyCert(name string, next Secret, u Upload) (Secret, error) {
	if len(u.Cert) == 0 {
		return Secret{}, invalidf(name, "secret %s of type %s: a certificate is required", name, next.Type)
	}
	cert, err := x509.ParseCertificate(u.Cert)
	if err != nil {
		return Secret{}, invalidCause(name, err, "secret %s: the certificate is not a valid DER X.509 certificate", name)
	}
	if err := checkCertKey(name, next, cert.PublicKey); err != nil {
		return Secret{}, err
	}
	certKey := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }) // checkCertKey ensured a known type

	if len(u.Private) > 0 {
		priv, err := x509.ParsePKCS8PrivateKey(u.Private)
		if err != nil {
			return Secret{}, invalidCause(name, err, "secret %s: the private key is not a valid PKCS#8 private key", name)
		}
		signer, ok := priv.(crypto.Signer)
		if !ok || !certKey.Equal(signer.Public()) {
			return Secret{}, invalidf(name, "secret %s: the private key does not belong to the certificate's public key", name)
		}
	}
	if len(u.Public) > 0 {
		pub, err := x509.ParsePKIXPublicKey(u.Public)
		if err != nil {
			return Secret{}, invalidCause(name, err, "secret %s: the public key is not a valid PKIX public key", name)
		}
		if !certKey.Equal(pub) {
			return Secret{}, invalidf(name, "secret %s: the public key is not the certificate's public key", name)
		}
	}
	public, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
	if err != nil {
		return Secret{}, invalidCause(name, err, "secret %s: encoding the certificate's public key", name)
	}
	next.Cert = clone(cert.Raw)
	next.Private = clone(u.Private)
	next.Public = public
	return next, nil
}

// checkCertKey checks that a certificate's public key fits the secret's
// type and, where it applies and is declared, its size.
func checkCertKey(name string, s Secret, key any) error {
	switch k := key.(type) {
	case *ecdsa.PublicKey:
		if s.Type != manifest.SecretTypeCertECDSA {
			return keyTypeMismatch(name, s.Type, "an ECDSA")
		}
		if bits := uint(k.Curve.Params().BitSize); s.Size != 0 && bits != s.Size {
			return invalidf(name, "secret %s: the certificate's ECDSA key is on a %d-bit curve, but the secret's size is %d", name, bits, s.Size)
		}
	case *rsa.PublicKey:
		if s.Type != manifest.SecretTypeCertRSA {
			return keyTypeMismatch(name, s.Type, "an RSA")
		}
		if bits := uint(k.N.BitLen()); s.Size != 0 && bits != s.Size {
			return invalidf(name, "secret %s: the certificate's RSA key has %d bits, but the secret's size is %d", name, bits, s.Size)
		}
	case ed25519.PublicKey:
		if s.Type != manifest.SecretTypeCertED25519 {
			return keyTypeMismatch(name, s.Type, "an Ed25519")
		}
	default:
		return invalidf(name, "secret %s is of type %s, but the certificate has an unsupported %T public key", name, s.Type, key)
	}
	return nil
}

func keyTypeMismatch(name, typ, got string) error {
	return invalidf(name, "secret %s is of type %s, but the certificate has %s key", name, typ, got)
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
