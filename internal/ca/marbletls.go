package ca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"sync"
)

// MarbleAPICommonName is the subject common name of the Marble API's
// serving certificate.
const MarbleAPICommonName = "Quarry Coordinator - Marble API"

// marbleTLS holds an Authority's Marble API certificate, made on first use.
type marbleTLS struct {
	once sync.Once
	cert *tls.Certificate
}

// MarbleTLSCertificate is the Marble API's server certificate
// (docs/trust.md): a serving certificate for an ECDSA P-256 key made for
// this Authority in this process, signed by the root key, followed by the
// Marble Root, the intermediate and the root.
//
// MarbleRun's Marbles connect without verifying the server's certificate.
// A Marble that pins the Coordinator root checks that the handshake's key
// is certified, by a CA certificate in the chain, under the root key: the
// serving certificate is such a certificate (a CA that can certify no
// other, path length 0, whose key never leaves this process), and so was
// the intermediate that earlier Coordinators presented with the
// intermediate key. The root key signs no other certificates than the
// root itself, the intermediates (New, Rotate) and these serving
// certificates, and every key a Marble or a user may hold (Marble
// certificates, certificate secrets) is certified by the intermediate
// key, never by the root key, so no such holder can present this proof.
//
// A P-256 key makes a Marble's handshake cheaper at both ends than the
// P-384 intermediate key: the Coordinator's signature and the Marble's
// check of it. The certificate is made once per Authority (an Authority
// is immutable) and the same value is returned after that, so TLS
// sessions resume under it (internal/server/tlscert). If it cannot be
// made, the Marble Root with the intermediate key is served instead, as
// before.
func (a *Authority) MarbleTLSCertificate() *tls.Certificate {
	m := a.marbleTLS
	if m == nil { // an Authority not made by New, Rotate or Restore
		return a.marbleRootTLSCertificate()
	}
	m.once.Do(func() {
		c, err := a.newMarbleServingCertificate(rand.Reader)
		if err != nil {
			c = a.marbleRootTLSCertificate()
		}
		m.cert = c
	})
	return m.cert
}

// marbleRootTLSCertificate is the Marble Root with the intermediate key it
// shares, followed by the intermediate and the root (what the Marble API
// served before it had a serving certificate of its own).
func (a *Authority) marbleRootTLSCertificate() *tls.Certificate {
	return &tls.Certificate{
		Certificate: [][]byte{a.MarbleRoot.Raw, a.Intermediate.Raw, a.Root.Raw},
		PrivateKey:  a.IntermediateKey,
		Leaf:        a.MarbleRoot,
	}
}

// newMarbleServingCertificate makes the serving certificate: a new P-256
// key, certified by the root key as a CA of path length 0 with the
// intermediate's names and validity.
func (a *Authority) newMarbleServingCertificate(rand io.Reader) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand)
	if err != nil {
		return nil, fmt.Errorf("generating the Marble API key: %w", err)
	}
	tmpl, err := template(rand, MarbleAPICommonName, Names{DNS: a.Intermediate.DNSNames, IPs: a.Intermediate.IPAddresses}, a.Intermediate.NotBefore)
	if err != nil {
		return nil, fmt.Errorf("the Marble API certificate: %w", err)
	}
	tmpl.NotAfter = a.Intermediate.NotAfter
	tmpl.MaxPathLenZero = true
	leaf, err := create(rand, tmpl, a.Root, &key.PublicKey, a.RootKey)
	if err != nil {
		return nil, fmt.Errorf("creating the Marble API certificate: %w", err)
	}
	return &tls.Certificate{
		Certificate: [][]byte{leaf.Raw, a.MarbleRoot.Raw, a.Intermediate.Raw, a.Root.Raw},
		PrivateKey:  key,
		Leaf:        leaf,
	}, nil
}
