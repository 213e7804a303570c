package marble

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// CommonName is the subject common name of the Marble's self-signed
// certificate (MarbleRun's value).
const CommonName = "MarbleRun Marble"

// certValidity is how long the self-signed certificate is valid; it is used
// for one activation only. certBackdate allows for clocks behind the
// Marble's.
const (
	certValidity = 30 * 24 * time.Hour
	certBackdate = time.Hour
)

// sans are the subject alternative names of the certificate and the CSR.
type sans struct {
	dns []string
	ips []net.IP
}

// newSANs splits names into DNS names and IP addresses and adds the
// loopback addresses 127.0.0.1 and ::1.
func newSANs(names []string) (sans, error) {
	var s sans
	for _, n := range names {
		if n == "" {
			return sans{}, errors.New("marble: empty DNS name")
		}
		if ip := net.ParseIP(n); ip != nil {
			s.addIP(ip)
		} else {
			s.dns = append(s.dns, n)
		}
	}
	s.addIP(net.IPv4(127, 0, 0, 1))
	s.addIP(net.IPv6loopback)
	return s, nil
}

// addIP adds ip unless it is there already.
func (s *sans) addIP(ip net.IP) {
	for _, have := range s.ips {
		if have.Equal(ip) {
			return
		}
	}
	s.ips = append(s.ips, ip)
}

// selfSignedCert makes the Marble's TLS client certificate, the one the
// quote covers.
func selfSignedCert(key *ecdsa.PrivateKey, s sans, now time.Time) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("marble: certificate serial number: %w", err)
	}
	notBefore := now.Add(-certBackdate).UTC().Truncate(time.Second)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: CommonName},
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(certValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              s.dns,
		IPAddresses:           s.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("marble: creating the certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("marble: parsing the certificate: %w", err)
	}
	return cert, nil
}

// certificateRequest makes the CSR (DER) for the Marble certificate the
// Coordinator issues: same key, same SANs, empty subject (the Coordinator
// sets the common name to the UUID).
func certificateRequest(key *ecdsa.PrivateKey, s sans) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		DNSNames:    s.dns,
		IPAddresses: s.ips,
	}, key)
	if err != nil {
		return nil, fmt.Errorf("marble: creating the CSR: %w", err)
	}
	return der, nil
}
