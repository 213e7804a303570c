package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a throwaway certificate authority for tests: its certificate lies
// in CertFile (PEM) and it issues server and client certificates into its
// directory.
type CA struct {
	// CertFile is the CA certificate (PEM).
	CertFile string

	name string
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA creates a CA called name whose files go to dir.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{name: name, dir: dir, cert: cert, key: key, CertFile: filepath.Join(dir, name+".pem")}
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Issue writes a certificate called name signed by the CA and its key,
// and returns the two PEM files. A server certificate is valid for
// 127.0.0.1, ::1 and localhost (and, as etcd's own gateway dials the
// server with it, also for client authentication); a client certificate
// is for client authentication only.
func (ca *CA) Issue(t testing.TB, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(ca.dir, ca.name+"-"+name+".pem")
	keyFile = filepath.Join(ca.dir, ca.name+"-"+name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

// TLSFiles are the PEM files a client of a TLS cluster (StartTLS) needs.
type TLSFiles struct {
	// CA signed the members' server certificates and is the only CA whose
	// client certificates they accept.
	CA *CA
	// CAFile is CA.CertFile.
	CAFile string
	// CertFile and KeyFile are a client certificate signed by CA and its
	// key.
	CertFile, KeyFile string
	// ServerCertFile and ServerKeyFile are the members' certificate and
	// key.
	ServerCertFile, ServerKeyFile string
}

func newTLSFiles(t testing.TB, dir string) *TLSFiles {
	t.Helper()
	ca := NewCA(t, dir, "etcd-ca")
	f := &TLSFiles{CA: ca, CAFile: ca.CertFile}
	f.ServerCertFile, f.ServerKeyFile = ca.Issue(t, "server", true)
	f.CertFile, f.KeyFile = ca.Issue(t, "client", false)
	return f
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
