package marble

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/google/uuid"
)

// The variables with the credentials the Coordinator issues to every
// activated Marble (docs/marbles.md).
const (
	// EnvMarbleRoot is the Marble Root certificate (PEM): every Marble
	// certificate of this Coordinator chains to it. It is renewed by every
	// package or full update, and stays the same through recovery.
	EnvMarbleRoot = "MARBLE_PREDEFINED_ROOT_CA"
	// EnvCertificateChain is the Marble's certificate followed by the
	// Coordinator's intermediate certificate (PEM).
	EnvCertificateChain = "MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN"
	// EnvPrivateKey is the key of the Marble's certificate (PKCS #8 PEM).
	EnvPrivateKey = "MARBLE_PREDEFINED_PRIVATE_KEY"
	// EnvCoordinatorRoot is the Coordinator root certificate (PEM): the
	// Client API's TLS certificate, the same through updates and
	// recovery.
	EnvCoordinatorRoot = "MARBLE_PREDEFINED_COORDINATOR_ROOT_CA"
	// EnvTTLSConfig is MarbleRun's configuration of its transparent TLS
	// (the manifest's TLS section). Nothing Quarry ships reads it
	// (docs/marbles.md).
	EnvTTLSConfig = "MARBLE_TTLS_CONFIG"
)

// OIDMarbleType is the X.509 extension of a Marble certificate that names
// its Marble type. Its value is the type's name as raw bytes (not a DER
// string), as MarbleRun encodes it.
var OIDMarbleType = asn1.ObjectIdentifier{1, 3, 9903, 2, 1}

// Errors of the credential helpers.
var (
	// ErrNoCredentials: a credential variable is missing or empty, e.g. in
	// a process that was not started by quarry-premain.
	ErrNoCredentials = errors.New("marble: no Marble credentials")
	// ErrNotMarbleCert: the certificate has no Marble type extension; it is
	// not a Marble certificate (a certificate secret, for example, chains
	// to the Marble Root too but has none).
	ErrNotMarbleCert = errors.New("marble: not a Marble certificate (no Marble type extension)")
	// ErrPeerType: the peer is a Marble of a type the configuration does
	// not allow.
	ErrPeerType = errors.New("marble: peer Marble type not allowed")
)

// Credentials are the TLS credentials the Coordinator issued to this
// Marble: its certificate and key, the Marble Root its peers' certificates
// chain to, and the Coordinator root that the Client API presents.
type Credentials struct {
	// Certificate is the Marble's certificate with the Coordinator's
	// intermediate, and its key; Leaf is set.
	Certificate tls.Certificate
	// MarbleRoot verifies other Marbles' certificates. A package or full
	// update renews it: Marbles activated before and after an update do
	// not verify each other (restart them all after an update).
	MarbleRoot *x509.Certificate
	// CoordinatorRoot is the Coordinator's TLS certificate for the Client
	// API (MonotonicCounter uses it as trust anchor).
	CoordinatorRoot *x509.Certificate
	// MarbleType and UUID are this Marble's, read from its certificate.
	MarbleType string
	UUID       string
}

// Credentials reads the credentials from the Parameters' Env (the
// MARBLE_PREDEFINED_* variables that every activation hands out).
func (p *Parameters) Credentials() (*Credentials, error) {
	return credentialsFrom(func(name string) []byte { return p.Env[name] })
}

// CredentialsFromEnv reads the credentials from this process's environment:
// in a program that quarry-premain started, or after (*Parameters).Apply.
// The error matches ErrNoCredentials if a variable is missing.
func CredentialsFromEnv() (*Credentials, error) {
	return credentialsFrom(func(name string) []byte { return []byte(os.Getenv(name)) })
}

func credentialsFrom(get func(string) []byte) (*Credentials, error) {
	for _, name := range []string{EnvMarbleRoot, EnvCertificateChain, EnvPrivateKey, EnvCoordinatorRoot} {
		if len(get(name)) == 0 {
			return nil, fmt.Errorf("%w: %s is not set (is this process an activated Marble?)", ErrNoCredentials, name)
		}
	}
	cert, err := tls.X509KeyPair(get(EnvCertificateChain), get(EnvPrivateKey))
	if err != nil {
		return nil, fmt.Errorf("marble: %s and %s: %w", EnvCertificateChain, EnvPrivateKey, err)
	}
	marbleRoot, err := parseOneCert(EnvMarbleRoot, get(EnvMarbleRoot))
	if err != nil {
		return nil, err
	}
	coordRoot, err := parseOneCert(EnvCoordinatorRoot, get(EnvCoordinatorRoot))
	if err != nil {
		return nil, err
	}
	typ, err := MarbleType(cert.Leaf)
	if err != nil {
		return nil, fmt.Errorf("marble: %s: %w", EnvCertificateChain, err)
	}
	id, err := MarbleUUID(cert.Leaf)
	if err != nil {
		return nil, fmt.Errorf("marble: %s: %w", EnvCertificateChain, err)
	}
	if err := cert.Leaf.CheckSignatureFrom(marbleRoot); err != nil {
		return nil, fmt.Errorf("marble: the certificate in %s was not issued under the Marble Root in %s: %w", EnvCertificateChain, EnvMarbleRoot, err)
	}
	return &Credentials{Certificate: cert, MarbleRoot: marbleRoot, CoordinatorRoot: coordRoot, MarbleType: typ, UUID: id}, nil
}

// parseOneCert parses the one CERTIFICATE PEM block of a variable.
func parseOneCert(name string, b []byte) (*x509.Certificate, error) {
	blk, rest := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("marble: %s does not hold one PEM certificate", name)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("marble: %s: %w", name, err)
	}
	return c, nil
}

// MarbleType returns the Marble type a Marble certificate names in its
// extension OIDMarbleType. It does not verify the certificate: use it on a
// peer's certificate that the TLS handshake verified (the configurations of
// ServerTLSConfig and ClientTLSConfig do), or see PeerMarbleType. The error
// matches ErrNotMarbleCert if the extension is missing.
func MarbleType(cert *x509.Certificate) (string, error) {
	if cert == nil {
		return "", ErrNotMarbleCert
	}
	for _, ext := range cert.Extensions {
		if ext.Id.Equal(OIDMarbleType) {
			if len(ext.Value) == 0 {
				return "", fmt.Errorf("%w: the extension is empty", ErrNotMarbleCert)
			}
			return string(ext.Value), nil
		}
	}
	return "", ErrNotMarbleCert
}

// MarbleUUID returns the UUID of a Marble certificate: its subject common
// name, in canonical form. Like MarbleType, it does not verify the
// certificate.
func MarbleUUID(cert *x509.Certificate) (string, error) {
	if cert == nil {
		return "", ErrNotMarbleCert
	}
	u, err := uuid.Parse(cert.Subject.CommonName)
	if err != nil {
		return "", fmt.Errorf("%w: the common name %q is not a UUID", ErrNotMarbleCert, cert.Subject.CommonName)
	}
	return u.String(), nil
}

// PeerMarbleType returns the Marble type of the peer of a connection that
// a ServerTLSConfig or ClientTLSConfig verified, e.g. an http.Request's
// TLS. It fails if the handshake verified no chain.
func PeerMarbleType(cs *tls.ConnectionState) (string, error) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", errors.New("marble: the connection has no verified peer certificate")
	}
	return MarbleType(cs.VerifiedChains[0][0])
}

// ServerTLSConfig returns a TLS configuration for a server that only
// Marbles of this Coordinator may call: it presents the Marble's
// certificate and requires a client certificate that chains to the Marble
// Root and carries a Marble type, one of types if any are given. A
// certificate secret that chains to the Marble Root is refused
// (ErrNotMarbleCert), as is a Marble of another type (ErrPeerType).
func (c *Credentials) ServerTLSConfig(types ...string) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(c.MarbleRoot)
	return &tls.Config{
		MinVersion:       tls.VersionTLS12,
		Certificates:     []tls.Certificate{c.Certificate},
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        pool,
		VerifyConnection: checkPeerType(slices.Clone(types)),
	}
}

// ClientTLSConfig returns a TLS configuration for calling another Marble:
// it presents the Marble's certificate as client certificate and accepts
// a server whose certificate chains to the Marble Root, names the host
// dialled (the server Marble's EDG_MARBLE_DNS_NAMES; 127.0.0.1 and ::1 are
// always in it) and carries a Marble type, one of types if any are given.
func (c *Credentials) ClientTLSConfig(types ...string) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(c.MarbleRoot)
	return &tls.Config{
		MinVersion:       tls.VersionTLS12,
		Certificates:     []tls.Certificate{c.Certificate},
		RootCAs:          pool,
		VerifyConnection: checkPeerType(slices.Clone(types)),
	}
}

// checkPeerType checks, after the chain was verified, that the peer's
// certificate is a Marble certificate of an allowed type.
func checkPeerType(types []string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		typ, err := PeerMarbleType(&cs)
		if err != nil {
			return err
		}
		if len(types) > 0 && !slices.Contains(types, typ) {
			return fmt.Errorf("%w: %q is not one of %q", ErrPeerType, typ, types)
		}
		return nil
	}
}
