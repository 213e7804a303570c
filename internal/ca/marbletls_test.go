package ca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMarbleTLSCertificate checks that the Marble API presents a serving
// certificate for a P-256 key (a CA of path length 0 signed by the root
// key), followed by the Marble Root, the intermediate and the root; the
// same value on every call; and a new one after a rotation.
func TestMarbleTLSCertificate(t *testing.T) {
	a := newAuthority(t)
	c := a.MarbleTLSCertificate()
	if len(c.Certificate) != 4 || !bytes.Equal(c.Certificate[1], a.MarbleRoot.Raw) ||
		!bytes.Equal(c.Certificate[2], a.Intermediate.Raw) || !bytes.Equal(c.Certificate[3], a.Root.Raw) {
		t.Fatal("the chain is not the serving certificate, the Marble Root, the intermediate and the root")
	}
	key, ok := c.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		t.Fatalf("the TLS key is %T, want an ECDSA P-256 key", c.PrivateKey)
	}
	if key.Equal(a.IntermediateKey) || key.Equal(a.RootKey) {
		t.Fatal("the TLS key is a CA key")
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if c.Leaf == nil || !c.Leaf.Equal(leaf) {
		t.Fatal("Leaf is not the first certificate")
	}
	if err := leaf.CheckSignatureFrom(a.Root); err != nil || !leaf.IsCA || leaf.MaxPathLen != 0 || !leaf.MaxPathLenZero || !key.PublicKey.Equal(leaf.PublicKey) {
		t.Fatalf("the serving certificate does not certify the TLS key under the root as a CA of path length 0: signature %v, CA %v, path length %d", err, leaf.IsCA, leaf.MaxPathLen)
	}
	if leaf.CheckSignatureFrom(a.Intermediate) == nil || leaf.CheckSignatureFrom(a.MarbleRoot) == nil {
		t.Fatal("the serving certificate verifies under the intermediate key")
	}
	if !slices.Equal(leaf.DNSNames, a.Intermediate.DNSNames) || len(leaf.IPAddresses) != len(a.Intermediate.IPAddresses) {
		t.Fatalf("names %v %v, want the intermediate's %v %v", leaf.DNSNames, leaf.IPAddresses, a.Intermediate.DNSNames, a.Intermediate.IPAddresses)
	}
	if a.MarbleTLSCertificate() != c {
		t.Fatal("a second call made another certificate (sessions would not resume)")
	}
	// The pair must be one crypto/tls accepts.
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("certificate and key do not form a TLS key pair: %v", err)
	}
	// A restored Authority (a reload, another instance) makes its own.
	p, err := a.Persist()
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restore(p)
	if err != nil {
		t.Fatal(err)
	}
	if rc := r.MarbleTLSCertificate(); bytes.Equal(rc.Certificate[0], c.Certificate[0]) || !bytes.Equal(rc.Certificate[1], c.Certificate[1]) {
		t.Fatal("a restored Authority serves the same serving certificate, or another Marble Root")
	}
	b, err := a.Rotate(rand.Reader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(b.MarbleTLSCertificate().Certificate[0], c.Certificate[0]) ||
		bytes.Equal(b.MarbleTLSCertificate().Certificate[1], c.Certificate[1]) ||
		bytes.Equal(b.MarbleTLSCertificate().Certificate[2], c.Certificate[2]) {
		t.Fatal("the Marble API certificate did not change with the rotation")
	}
	if !bytes.Equal(b.MarbleTLSCertificate().Certificate[3], a.Root.Raw) {
		t.Fatal("the root in the chain changed with the rotation")
	}
	if !bytes.Equal(a.MarbleTLSCertificate().Certificate[0], c.Certificate[0]) {
		t.Fatal("the old authority's certificate changed")
	}
}

// TestMarbleServingCertificateError: when the serving key cannot be made
// (randomness fails), the error says so; MarbleTLSCertificate then serves
// the Marble Root with the intermediate key.
func TestMarbleServingCertificateError(t *testing.T) {
	a := newAuthority(t)
	if _, err := a.newMarbleServingCertificate(failingReader{}); err == nil || !strings.Contains(err.Error(), "Marble API") {
		t.Fatalf("err = %v, want one naming the Marble API key or certificate", err)
	}
	c := a.marbleRootTLSCertificate()
	if len(c.Certificate) != 3 || !bytes.Equal(c.Certificate[0], a.MarbleRoot.Raw) || c.PrivateKey != a.IntermediateKey {
		t.Fatal("the fallback is not the Marble Root with the intermediate key and its chain")
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("no randomness") }
