package client

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// Recovery-secret cryptography (MarbleRun-compatible):
//
//   - the Coordinator encrypts each recovery secret to its RecoveryKeys
//     entry with RSA-OAEP, SHA-256 (also for MGF1), empty label;
//   - the owner decrypts it (DecryptRecoverySecret) and signs the plain
//     secret with RSA PKCS #1 v1.5 over SHA-256 (SignRecoverySecret);
//   - optionally the plain secret is encrypted to the Coordinator's
//     ephemeral key (EncryptRecoverySecret) so it does not travel in clear
//     inside the TLS connection; the signature stays over the plain secret.

// IsPlainRecoverySecret reports whether b has the length of a decrypted
// recovery secret: 16 (legacy), 32 (a data key or XOR share) or 33 bytes (a
// threshold share). Encrypted secrets are as long as the RSA modulus.
func IsPlainRecoverySecret(b []byte) bool {
	switch len(b) {
	case 16, 32, 33:
		return true
	}
	return false
}

// ParseRSAPrivateKeyPEM parses an RSA private key in PEM: PKCS #8 ("PRIVATE
// KEY") or PKCS #1 ("RSA PRIVATE KEY").
func ParseRSAPrivateKeyPEM(pemText []byte) (*rsa.PrivateKey, error) {
	rest := pemText
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("no PEM private key block found (want PRIVATE KEY or RSA PRIVATE KEY)")
		}
		switch b.Type {
		case "RSA PRIVATE KEY":
			k, err := x509.ParsePKCS1PrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing the PKCS #1 private key: %w", err)
			}
			return k, nil
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing the PKCS #8 private key: %w", err)
			}
			rk, ok := k.(*rsa.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("the private key is a %T, not RSA", k)
			}
			return rk, nil
		case "ENCRYPTED PRIVATE KEY":
			return nil, errors.New("the private key is encrypted; decrypt it first (e.g. openssl pkey)")
		}
	}
}

// DecryptRecoverySecret decrypts a recovery secret from a manifest set or
// update response with the matching recovery private key (RSA-OAEP with
// SHA-256). key is usually an *rsa.PrivateKey; any crypto.Decrypter that
// supports OAEP (an HSM key) works.
func DecryptRecoverySecret(key crypto.Decrypter, ciphertext []byte) ([]byte, error) {
	plain, err := key.Decrypt(rand.Reader, ciphertext, &rsa.OAEPOptions{Hash: crypto.SHA256})
	if err != nil {
		return nil, fmt.Errorf("decrypting the recovery secret (RSA-OAEP, SHA-256): %w", err)
	}
	return plain, nil
}

// SignRecoverySecret signs a plain recovery secret for upload: RSA PKCS #1
// v1.5 over SHA-256(secret), with the recovery private key that decrypted it.
func SignRecoverySecret(key crypto.Signer, secret []byte) ([]byte, error) {
	if _, ok := key.Public().(*rsa.PublicKey); !ok {
		return nil, fmt.Errorf("signing the recovery secret: the key is a %T, not RSA", key.Public())
	}
	sum := sha256.Sum256(secret)
	sig, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("signing the recovery secret: %w", err)
	}
	return sig, nil
}

// EncryptRecoverySecret encrypts a plain recovery secret to the
// Coordinator's ephemeral key (RecoveryPublicKey): RSA-OAEP with SHA-256 and
// an empty label.
func EncryptRecoverySecret(ephemeral *rsa.PublicKey, secret []byte) ([]byte, error) {
	ct, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, ephemeral, secret, nil)
	if err != nil {
		return nil, fmt.Errorf("encrypting the recovery secret to the ephemeral key: %w", err)
	}
	return ct, nil
}
