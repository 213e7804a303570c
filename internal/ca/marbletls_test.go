package ca

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"
)

// TestMarbleTLSCertificate checks that the Marble API presents the Marble
// Root with the intermediate key (a pair TLS accepts), followed by the
// intermediate (a CA signed by the root that certifies the same key) and
// the root, and the renewed ones after a rotation.
func TestMarbleTLSCertificate(t *testing.T) {
	a := newAuthority(t)
	c := a.MarbleTLSCertificate()
	if len(c.Certificate) != 3 || !bytes.Equal(c.Certificate[0], a.MarbleRoot.Raw) || c.Leaf != a.MarbleRoot ||
		!bytes.Equal(c.Certificate[1], a.Intermediate.Raw) || !bytes.Equal(c.Certificate[2], a.Root.Raw) {
		t.Fatal("the chain is not the Marble Root, the intermediate and the root")
	}
	if c.PrivateKey != a.IntermediateKey {
		t.Fatal("the key is not the intermediate key")
	}
	inter, err := x509.ParseCertificate(c.Certificate[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := inter.CheckSignatureFrom(a.Root); err != nil || !inter.IsCA || !a.IntermediateKey.PublicKey.Equal(inter.PublicKey) {
		t.Fatalf("the second certificate does not certify the TLS key under the root: signature %v, CA %v", err, inter.IsCA)
	}
	// The pair must be one crypto/tls accepts.
	keyDER, err := x509.MarshalECPrivateKey(a.IntermediateKey)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("certificate and key do not form a TLS key pair: %v", err)
	}
	b, err := a.Rotate(rand.Reader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(b.MarbleTLSCertificate().Certificate[0], c.Certificate[0]) ||
		bytes.Equal(b.MarbleTLSCertificate().Certificate[1], c.Certificate[1]) {
		t.Fatal("the Marble API certificate did not change with the rotation")
	}
	if !bytes.Equal(b.MarbleTLSCertificate().Certificate[2], a.Root.Raw) {
		t.Fatal("the root in the chain changed with the rotation")
	}
	if !bytes.Equal(a.MarbleTLSCertificate().Certificate[0], c.Certificate[0]) {
		t.Fatal("the old authority's certificate changed")
	}
}
