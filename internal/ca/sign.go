package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"sync"
)

// CreateCertificate is x509.CreateCertificate without the check of the
// signature it has just made when priv is an *ecdsa.PrivateKey.
//
// x509.CreateCertificate verifies every signature its signer returns, to
// catch a misbehaving crypto.Signer (a hardware token, say). For a key
// held in memory by the standard library that check proves nothing, and
// verifying costs more than signing: with a P-384 key, about three times
// as much, most of a Marble activation's certificate or of a certificate
// secret. Here x509 writes the certificate with a stand-in signer (a P-256
// key of this process, whose signature it checks cheaply and which is
// then thrown away); the to-be-signed part it wrote does not depend on the
// signer's key, and it is signed again with priv. Other signers, and
// signature algorithms other than ECDSA, go to x509.CreateCertificate
// unchanged.
func CreateCertificate(rnd io.Reader, tmpl, parent *x509.Certificate, pub crypto.PublicKey, priv crypto.Signer) ([]byte, error) {
	key, ok := priv.(*ecdsa.PrivateKey)
	if !ok {
		return x509.CreateCertificate(rnd, tmpl, parent, pub, priv)
	}
	alg, hash, ok := ecdsaAlgorithm(tmpl.SignatureAlgorithm, key.Curve)
	if !ok {
		return x509.CreateCertificate(rnd, tmpl, parent, pub, priv)
	}
	if parent.PublicKey != nil && !key.PublicKey.Equal(parent.PublicKey) {
		return nil, errors.New("x509: provided PrivateKey doesn't match parent's PublicKey")
	}
	draft := *tmpl
	draft.SignatureAlgorithm = alg
	issuer := *parent
	issuer.PublicKey = nil // x509 compares it with the stand-in's
	standIn, err := standInKey()
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rnd, &draft, &issuer, pub, standIn)
	if err != nil {
		return nil, err
	}
	var cert struct {
		TBS       asn1.RawValue
		Algorithm asn1.RawValue
		Signature asn1.BitString
	}
	if rest, err := asn1.Unmarshal(der, &cert); err != nil || len(rest) != 0 {
		return nil, fmt.Errorf("x509: reading the certificate x509 wrote: %v", err)
	}
	h := hash.New()
	h.Write(cert.TBS.FullBytes)
	sig, err := ecdsa.SignASN1(rnd, key, h.Sum(nil))
	if err != nil {
		return nil, err
	}
	cert.Signature = asn1.BitString{Bytes: sig, BitLength: 8 * len(sig)}
	return asn1.Marshal(cert)
}

// ecdsaAlgorithm is the ECDSA signature algorithm x509 uses for requested
// (its default for curve when zero) and its hash; ok is false for any
// other algorithm.
func ecdsaAlgorithm(requested x509.SignatureAlgorithm, curve elliptic.Curve) (x509.SignatureAlgorithm, crypto.Hash, bool) {
	if requested == x509.UnknownSignatureAlgorithm {
		switch curve {
		case elliptic.P256():
			requested = x509.ECDSAWithSHA256
		case elliptic.P384():
			requested = x509.ECDSAWithSHA384
		case elliptic.P521():
			requested = x509.ECDSAWithSHA512
		default:
			return 0, 0, false
		}
	}
	switch requested {
	case x509.ECDSAWithSHA256:
		return requested, crypto.SHA256, true
	case x509.ECDSAWithSHA384:
		return requested, crypto.SHA384, true
	case x509.ECDSAWithSHA512:
		return requested, crypto.SHA512, true
	}
	return 0, 0, false
}

// standInKey is the stand-in signer of CreateCertificate, made once.
var standInKey = sync.OnceValues(func() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
})
