package ca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"net"
	"testing"
	"time"
)

func newAuthority(t *testing.T) *Authority {
	t.Helper()
	a, err := New(rand.Reader, Names{DNS: []string{"coordinator.example"}, IPs: []net.IP{net.ParseIP("10.1.2.3")}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func checkSANs(t *testing.T, what string, c *x509.Certificate) {
	t.Helper()
	if len(c.DNSNames) != 1 || c.DNSNames[0] != "coordinator.example" {
		t.Errorf("%s DNS SANs = %v", what, c.DNSNames)
	}
	want := map[string]bool{"127.0.0.1": true, "::1": true, "10.1.2.3": true}
	if len(c.IPAddresses) != len(want) {
		t.Errorf("%s IP SANs = %v", what, c.IPAddresses)
	}
	for _, ip := range c.IPAddresses {
		if !want[ip.String()] {
			t.Errorf("%s has unexpected IP SAN %v", what, ip)
		}
	}
}

func TestNew(t *testing.T) {
	a := newAuthority(t)
	for name, c := range map[string]*x509.Certificate{"root": a.Root, "intermediate": a.Intermediate, "marble root": a.MarbleRoot} {
		pub, ok := c.PublicKey.(*ecdsa.PublicKey)
		if !ok || pub.Curve != elliptic.P384() {
			t.Errorf("%s key is not P-384", name)
		}
		if !c.IsCA || !c.BasicConstraintsValid || c.SignatureAlgorithm != x509.ECDSAWithSHA384 {
			t.Errorf("%s: IsCA=%v sigalg=%v", name, c.IsCA, c.SignatureAlgorithm)
		}
		if c.KeyUsage != x509.KeyUsageDigitalSignature|x509.KeyUsageCertSign {
			t.Errorf("%s key usage = %v", name, c.KeyUsage)
		}
		if c.NotAfter.Sub(c.NotBefore) < 290*365*24*time.Hour {
			t.Errorf("%s validity too short: %v..%v", name, c.NotBefore, c.NotAfter)
		}
		checkSANs(t, name, c)
	}
	if a.Root.Subject.CommonName != RootCommonName || a.Intermediate.Subject.CommonName != IntermediateCommonName ||
		a.MarbleRoot.Subject.CommonName != IntermediateCommonName {
		t.Error("wrong subject names")
	}
	if err := a.Intermediate.CheckSignatureFrom(a.Root); err != nil {
		t.Errorf("intermediate not signed by root: %v", err)
	}
	if err := a.MarbleRoot.CheckSignatureFrom(a.MarbleRoot); err != nil {
		t.Errorf("marble root not self-signed: %v", err)
	}
	if a.MarbleRoot.SerialNumber.Cmp(a.Intermediate.SerialNumber) == 0 {
		t.Error("marble root and intermediate share a serial")
	}
	if a.RootKey.PublicKey.Equal(a.IntermediateKey.Public()) {
		t.Error("root and intermediate share a key")
	}
}

func TestChainAndSignature(t *testing.T) {
	a := newAuthority(t)
	var certs []*x509.Certificate
	rest := a.ChainPEM()
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, c)
	}
	if len(certs) != 2 || !certs[0].Equal(a.Intermediate) || !certs[1].Equal(a.Root) {
		t.Fatal("chain is not intermediate then root")
	}
	sig, err := a.SignRoot(rand.Reader, []byte("manifest"))
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256([]byte("manifest"))
	if !ecdsa.VerifyASN1(a.Root.PublicKey.(*ecdsa.PublicKey), d[:], sig) {
		t.Fatal("signature does not verify with the root certificate")
	}
	if tc := a.TLSCertificate(); len(tc.Certificate) != 1 || !a.Root.Equal(tc.Leaf) {
		t.Fatal("TLS certificate is not the root")
	}
}

func TestRotateKeepsRootAndSANs(t *testing.T) {
	a := newAuthority(t)
	b, err := a.Rotate(rand.Reader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !b.Root.Equal(a.Root) {
		t.Fatal("root changed")
	}
	if b.Intermediate.Equal(a.Intermediate) || b.IntermediateKey.Equal(a.IntermediateKey) {
		t.Fatal("intermediate not rotated")
	}
	checkSANs(t, "rotated intermediate", b.Intermediate)
	checkSANs(t, "rotated marble root", b.MarbleRoot)
	if err := b.Intermediate.CheckSignatureFrom(b.Root); err != nil {
		t.Fatal(err)
	}
}

func TestPersistRestore(t *testing.T) {
	a := newAuthority(t)
	p, err := a.Persist()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Restore(p)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Root.Equal(a.Root) || !b.Intermediate.Equal(a.Intermediate) || !b.MarbleRoot.Equal(a.MarbleRoot) ||
		!b.RootKey.Equal(a.RootKey) || !b.IntermediateKey.Equal(a.IntermediateKey) {
		t.Fatal("restored authority differs")
	}
	other := newAuthority(t)
	op, _ := other.Persist()
	bad := p
	bad.RootKey = op.RootKey
	if _, err := Restore(bad); err == nil {
		t.Fatal("mismatched root key accepted")
	}
	bad = p
	bad.IntermediateCert = []byte("garbage")
	if _, err := Restore(bad); err == nil {
		t.Fatal("garbage certificate accepted")
	}
}
