package testpki_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/testpki"
)

// TestChainVerifies: a leaf issued by an intermediate issued by a root
// verifies against the root for its names and usage, and not for others.
func TestChainVerifies(t *testing.T) {
	root := testpki.NewCA(t, "root")
	inter := root.Issue(t, "intermediate", testpki.CA(), testpki.P384())
	leaf := inter.Issue(t, "server", testpki.Loopback(), testpki.ServerAuth())
	if !root.Cert.IsCA || !inter.Cert.IsCA || leaf.Cert.IsCA {
		t.Fatalf("IsCA: root %v, intermediate %v, leaf %v", root.Cert.IsCA, inter.Cert.IsCA, leaf.Cert.IsCA)
	}
	if tc := leaf.TLS(); len(tc.Certificate) != 3 || tc.Leaf != leaf.Cert {
		t.Fatalf("TLS chain of %d certificates, want leaf, intermediate, root", len(tc.Certificate))
	}
	inters := x509.NewCertPool()
	inters.AddCert(inter.Cert)
	for _, name := range []string{"localhost", "127.0.0.1", "::1"} {
		if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: root.Pool(), Intermediates: inters, DNSName: name,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: root.Pool(), Intermediates: inters, DNSName: "example.com"}); err == nil {
		t.Error("verified for a name it does not hold")
	}
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: root.Pool(), Intermediates: inters,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("verified for client authentication, which it does not have")
	}
	other := testpki.NewCA(t, "root")
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: other.Pool(), Intermediates: inters}); err == nil {
		t.Error("verified against another root of the same name")
	}
}

func TestOptions(t *testing.T) {
	nb, na := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	oid := asn1.ObjectIdentifier{1, 2, 3, 4}
	c := testpki.SelfSigned(t, "alice", testpki.Valid(nb, na), testpki.Serial(42), testpki.ClientAuth(),
		testpki.DNS("a.example"), testpki.IP(net.IPv4(10, 0, 0, 1)), testpki.Usage(x509.KeyUsageDigitalSignature),
		testpki.Extension(pkix.Extension{Id: oid, Value: []byte{5, 0}}),
		testpki.Template(func(c *x509.Certificate) { c.Subject.Organization = []string{"Org"}; c.SerialNumber.SetInt64(43) }))
	x := c.Cert
	if x.Subject.CommonName != "alice" || !x.NotBefore.Equal(nb) || !x.NotAfter.Equal(na) || x.SerialNumber.Int64() != 43 ||
		!slices.Equal(x.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) || !slices.Equal(x.DNSNames, []string{"a.example"}) ||
		len(x.IPAddresses) != 1 || x.KeyUsage != x509.KeyUsageDigitalSignature || !slices.Equal(x.Subject.Organization, []string{"Org"}) {
		t.Fatalf("certificate %+v does not have the options", x)
	}
	found := false
	for _, e := range x.Extensions {
		found = found || e.Id.Equal(oid)
	}
	if !found {
		t.Error("extension missing")
	}
	if err := x.CheckSignatureFrom(x); err == nil {
		t.Error("a self-signed certificate that is no CA checks as its own issuer")
	}
	if b, _ := pem.Decode(c.CertPEM()); b == nil || b.Type != "CERTIFICATE" || !slices.Equal(b.Bytes, c.DER()) {
		t.Error("CertPEM is not the certificate")
	}
	b, _ := pem.Decode(c.KeyPEM(t))
	if k, err := x509.ParsePKCS8PrivateKey(b.Bytes); err != nil || !k.(*ecdsa.PrivateKey).Equal(c.Key) {
		t.Errorf("KeyPEM: %v", err)
	}
}

func TestKeys(t *testing.T) {
	if k := testpki.SelfSigned(t, "").ECDSA(t); k.Curve != elliptic.P256() {
		t.Errorf("default key on %s, want P-256", k.Curve.Params().Name)
	}
	if k := testpki.SelfSigned(t, "", testpki.P384()).ECDSA(t); k.Curve != elliptic.P384() {
		t.Errorf("P384 key on %s", k.Curve.Params().Name)
	}
	if _, ok := testpki.SelfSigned(t, "", testpki.Ed25519()).Key.(ed25519.PrivateKey); !ok {
		t.Error("Ed25519 gave another key")
	}
	if k, ok := testpki.SelfSigned(t, "", testpki.RSA2048()).Key.(*rsa.PrivateKey); !ok || k.N.BitLen() != 2048 {
		t.Error("RSA2048 gave another key")
	}
	given := testpki.SelfSigned(t, "").Key
	if c := testpki.SelfSigned(t, "", testpki.Key(given)); c.Key != given || !c.Cert.PublicKey.(*ecdsa.PublicKey).Equal(given.Public()) {
		t.Error("Key did not use the given key")
	}
}

// TestFailures: a failure reaches the TB (or panics without one).
func TestFailures(t *testing.T) {
	var f fakeTB
	func() {
		defer func() { recover() }()
		testpki.SelfSigned(t, "").ECDSA(&f)
		testpki.SelfSigned(t, "", testpki.Ed25519()).ECDSA(&f)
	}()
	if f.calls != 1 {
		t.Errorf("%d failures reported, want 1 (the Ed25519 key)", f.calls)
	}
	defer func() {
		if recover() == nil {
			t.Error("a nil TB did not panic")
		}
	}()
	testpki.SelfSigned(nil, "", testpki.Valid(time.Now(), time.Now()), testpki.Template(func(c *x509.Certificate) { c.SerialNumber.SetInt64(-1) }))
}

type fakeTB struct{ calls int }

func (f *fakeTB) Fatalf(string, ...any) { f.calls++; panic("fatal") }
