package ca

import "crypto/tls"

// MarbleTLSCertificate is the Marble API's server certificate: the Marble
// Root with the intermediate key it shares, as MarbleRun serves it
// (docs/trust.md), followed by the intermediate certificate and the
// root (docs/trust.md).
//
// The leaf is what MarbleRun's Marbles, which connect without verifying
// it, have always seen. The two certificates after it let a Marble that
// pins the Coordinator root check that the handshake's key is the
// Coordinator's: the intermediate, signed by the root key and a CA,
// certifies exactly that key. The root key signs no other certificate
// than the root itself and the intermediates (New, Rotate), and every key
// a Marble or a user may hold (Marble certificates, certificate secrets)
// is certified by the intermediate key, never by the root key, so no such
// holder can present this proof.
//
// It is made on each call rather than kept like TLSCertificate: an
// Authority is immutable, so the result never changes, and building it
// costs a small allocation beside a handshake's P-384 signature.
func (a *Authority) MarbleTLSCertificate() *tls.Certificate {
	return &tls.Certificate{
		Certificate: [][]byte{a.MarbleRoot.Raw, a.Intermediate.Raw, a.Root.Raw},
		PrivateKey:  a.IntermediateKey,
		Leaf:        a.MarbleRoot,
	}
}
