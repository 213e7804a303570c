package ca

import "crypto/tls"

// MarbleTLSCertificate is the Marble API's server certificate: the Marble
// Root certificate alone (no chain) with the intermediate key it shares, as
// MarbleRun serves it (behaviour.md §11.1). Marbles connect without
// verifying it; what they receive in MARBLE_PREDEFINED_ROOT_CA is the same
// certificate.
//
// It is made on each call rather than kept like TLSCertificate: an
// Authority is immutable, so the result never changes, and building it
// costs a small allocation beside a handshake's P-384 signature.
func (a *Authority) MarbleTLSCertificate() *tls.Certificate {
	return &tls.Certificate{
		Certificate: [][]byte{a.MarbleRoot.Raw},
		PrivateKey:  a.IntermediateKey,
		Leaf:        a.MarbleRoot,
	}
}
