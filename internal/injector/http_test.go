package injector_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/injector"
)

func writePair(t *testing.T, dir, cn string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{cn}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
}

func servedCN(t *testing.T, r *injector.CertReloader) string {
	t.Helper()
	c, err := r.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := x509.ParseCertificate(c.Certificate[0])
	return x.Subject.CommonName
}

// A renewed certificate (cert-manager rewrites the Secret's files) is
// served without a restart; a broken rewrite keeps the last good pair;
// missing files are an error at start.
func TestCertReloader(t *testing.T) {
	dir := t.TempDir()
	if _, err := injector.NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")); err == nil {
		t.Fatal("missing files accepted")
	}
	writePair(t, dir, "first")
	r, err := injector.NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	if cn := servedCN(t, r); cn != "first" {
		t.Fatalf("serves %s", cn)
	}
	writePair(t, dir, "second")
	deadline := time.Now().Add(5 * time.Second)
	for servedCN(t, r) != "second" {
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate is not served")
		}
		time.Sleep(100 * time.Millisecond)
	}
	os.WriteFile(filepath.Join(dir, "tls.key"), []byte("garbage and longer than before"), 0o600)
	time.Sleep(1100 * time.Millisecond)
	if cn := servedCN(t, r); cn != "second" {
		t.Fatalf("after a broken rewrite: %s", cn)
	}
}
