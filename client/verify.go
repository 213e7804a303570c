package client

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/internal/attest"
)

// ReportDataSize is the size of an SGX report's REPORTDATA field.
const ReportDataSize = attest.ReportDataSize

// NonceSize is the size of the random nonce VerifyCoordinator sends.
const NonceSize = 32

// ErrVerification is wrapped by every error that means the Coordinator (or
// something it signed) could not be verified: match it with errors.Is.
var ErrVerification = errors.New("verification failed")

// ErrNoQuote means the Coordinator sent no quote: it runs in simulation
// mode and cannot be attested. Only VerifyOptions.InsecureSkipVerify accepts
// it. It is wrapped together with ErrVerification.
var ErrNoQuote = errors.New("the Coordinator sent no quote (simulation mode); it cannot be attested")

// ErrNoQuoteVerifier means a quote was sent but no QuoteVerifier was given.
// It is wrapped together with ErrVerification.
var ErrNoQuoteVerifier = errors.New("the Coordinator sent a quote but no quote verifier is configured")

// QuoteVerifier checks an SGX quote: its signature chain up to the
// hardware vendor's root, the platform's TCB against the caller's policy, the
// enclave's identity, and that the quote's report data equals reportData.
// It returns nil only if all hold.
type QuoteVerifier interface {
	VerifyQuote(ctx context.Context, quote []byte, reportData [ReportDataSize]byte) error
}

// QuoteVerifierFunc adapts a function to QuoteVerifier.
type QuoteVerifierFunc func(ctx context.Context, quote []byte, reportData [ReportDataSize]byte) error

// VerifyQuote calls f.
func (f QuoteVerifierFunc) VerifyQuote(ctx context.Context, quote []byte, reportData [ReportDataSize]byte) error {
	return f(ctx, quote, reportData)
}

// ReportData returns the report data that binds a Coordinator quote to its
// root certificate: SHA-256(rootDER ‖ nonce) in the first 32 bytes, zeros
// after. The nonce may be empty.
func ReportData(rootDER, nonce []byte) [ReportDataSize]byte {
	return attest.ReportData(rootDER, nonce)
}

// VerifyOptions configure VerifyCoordinator.
type VerifyOptions struct {
	// Verifier checks the quote. Without one, a quote cannot be verified.
	Verifier QuoteVerifier
	// InsecureSkipVerify accepts a Coordinator that sends no quote
	// (simulation mode), or a quote when no Verifier is given, unverified.
	// The chain is still checked and the root is still bound to the TLS
	// connection, but anyone between the caller and the Coordinator can
	// answer with a root of its own. Use it only for simulation. It excludes
	// Verifier (ErrExclusiveOptions): with both, a man in the middle that
	// answers without a quote would be accepted unverified.
	InsecureSkipVerify bool
	// Nonce is sent with the quote request; nil means NonceSize fresh
	// random bytes.
	Nonce []byte
	// HTTPClient, if set, is used for the request; its transport must be
	// nil or an *http.Transport (a clone gets the TLS settings).
	HTTPClient *http.Client
}

// Attestation is the result of VerifyCoordinator.
type Attestation struct {
	// Root is the Coordinator's root certificate: pin it
	// (WithRootCertificate) for all later requests.
	Root *x509.Certificate
	// Intermediate is the Coordinator's current intermediate CA certificate.
	Intermediate *x509.Certificate
	// ChainPEM is the certificate chain as the Coordinator sent it.
	ChainPEM []byte
	// Quote is the quote over ReportData(Root.Raw, Nonce); nil in
	// simulation mode.
	Quote []byte
	// Nonce is the nonce the quote was requested with.
	Nonce []byte
	// QuoteVerified is true if Verifier accepted the quote; false only with
	// InsecureSkipVerify.
	QuoteVerified bool
}

// VerifyCoordinator establishes trust in the Coordinator at endpoint: it
// requests the quote with a fresh nonce, checks the certificate chain
// (intermediate signed by the self-signed root), checks that the TLS
// connection is served with that root, and has opts.Verifier check the quote
// against ReportData(root DER, nonce). A Coordinator without a quote is
// accepted only with opts.InsecureSkipVerify, which excludes opts.Verifier.
// Errors of the checks wrap ErrVerification.
func VerifyCoordinator(ctx context.Context, endpoint string, opts VerifyOptions) (*Attestation, error) {
	if opts.Verifier != nil && opts.InsecureSkipVerify {
		// A Coordinator in an enclave always sends a quote, so "verify it if
		// there is one" would let anyone who strips it (or answers with
		// quote null and a root of its own) through: the caller must
		// decide which kind of Coordinator it talks to.
		return nil, fmt.Errorf("client: %w: VerifyOptions.Verifier and VerifyOptions.InsecureSkipVerify: "+
			"with both, a man in the middle that answers without a quote would be accepted unverified; "+
			"give Verifier alone for a Coordinator in an enclave, or InsecureSkipVerify alone for one in simulation mode", ErrExclusiveOptions)
	}
	copts := []Option{WithInsecureSkipVerify()}
	if opts.HTTPClient != nil {
		copts = append(copts, WithHTTPClient(opts.HTTPClient))
	}
	c, err := New(endpoint, copts...)
	if err != nil {
		return nil, err
	}
	nonce := opts.Nonce
	if nonce == nil {
		nonce = make([]byte, NonceSize)
		if _, err := rand.Read(nonce); err != nil {
			return nil, fmt.Errorf("client: creating a nonce: %w", err)
		}
	}
	q, resp, err := c.quote(ctx, nonce)
	if err != nil {
		return nil, err
	}
	inter, root, err := ParseCertificateChain([]byte(q.Cert))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrVerification, err)
	}
	if resp.tls == nil || len(resp.tls.PeerCertificates) == 0 {
		return nil, fmt.Errorf("%w: no TLS certificate from the Coordinator", ErrVerification)
	}
	if !resp.tls.PeerCertificates[0].Equal(root) {
		return nil, fmt.Errorf("%w: the Coordinator's TLS certificate is not the root certificate of its chain", ErrVerification)
	}
	att := &Attestation{Root: root, Intermediate: inter, ChainPEM: []byte(q.Cert), Quote: q.Quote, Nonce: nonce}
	switch {
	case len(q.Quote) == 0:
		if !opts.InsecureSkipVerify {
			return nil, fmt.Errorf("%w: %w", ErrVerification, ErrNoQuote)
		}
	case opts.Verifier == nil:
		if !opts.InsecureSkipVerify {
			return nil, fmt.Errorf("%w: %w", ErrVerification, ErrNoQuoteVerifier)
		}
	default:
		if err := opts.Verifier.VerifyQuote(ctx, q.Quote, ReportData(root.Raw, nonce)); err != nil {
			return nil, fmt.Errorf("%w: the Coordinator's quote: %w", ErrVerification, err)
		}
		att.QuoteVerified = true
	}
	return att, nil
}

// ParseCertificateChain parses the Coordinator's chain as GET /api/v2/quote
// returns it and checks it: exactly one self-signed CA root and one
// intermediate CA signed by it.
func ParseCertificateChain(pemText []byte) (intermediate, root *x509.Certificate, err error) {
	certs, err := parseCertificates(pemText)
	if err != nil {
		return nil, nil, fmt.Errorf("the Coordinator's certificate chain: %w", err)
	}
	if len(certs) != 2 {
		return nil, nil, fmt.Errorf("the Coordinator's certificate chain has %d certificates; want the intermediate and the root", len(certs))
	}
	for i, c := range certs {
		if c.IsCA && c.CheckSignatureFrom(c) == nil {
			root, intermediate = c, certs[1-i]
			break
		}
	}
	if root == nil {
		return nil, nil, errors.New("the Coordinator's certificate chain has no self-signed root CA certificate")
	}
	if !intermediate.IsCA {
		return nil, nil, errors.New("the Coordinator's intermediate certificate is not a CA certificate")
	}
	if err := intermediate.CheckSignatureFrom(root); err != nil {
		return nil, nil, fmt.Errorf("the Coordinator's intermediate certificate is not signed by its root: %w", err)
	}
	return intermediate, root, nil
}

// ManifestFingerprint returns the lowercase hex SHA-256 of the manifest
// bytes: the fingerprint the Coordinator reports.
func ManifestFingerprint(manifest []byte) string {
	sum := sha256.Sum256(manifest)
	return hex.EncodeToString(sum[:])
}

// VerifyManifestSignature checks the Coordinator's manifest signature: an
// ASN.1 ECDSA signature by the root key over SHA-256(manifest).
func VerifyManifestSignature(root *x509.Certificate, manifest, signature []byte) error {
	pub, ok := root.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("%w: the root certificate's key is a %T, not ECDSA", ErrVerification, root.PublicKey)
	}
	sum := sha256.Sum256(manifest)
	if !ecdsa.VerifyASN1(pub, sum[:], signature) {
		return fmt.Errorf("%w: the manifest signature does not verify with the root certificate", ErrVerification)
	}
	return nil
}

// VerifyManifest checks a GET /api/v2/manifest answer against the root: the
// fingerprint is the SHA-256 of the manifest bytes and the signature verifies.
func VerifyManifest(root *x509.Certificate, m *v2.ManifestGetResponse) error {
	if got := ManifestFingerprint(m.Manifest); !strings.EqualFold(got, m.ManifestFingerprint) {
		return fmt.Errorf("%w: the manifest's SHA-256 %s differs from the fingerprint %s the Coordinator reports", ErrVerification, got, m.ManifestFingerprint)
	}
	return VerifyManifestSignature(root, m.Manifest, m.ManifestSignatureRootECDSA)
}

// VerifyQuoteSignature checks a sign-quote result: an ASN.1 ECDSA signature by
// the root key over SHA-256(base64(quote) ‖ tcbStatus). Because that message
// has no separator, the quote must also be exactly one well-formed SGX
// (raw or Open Enclave-wrapped) or TDX quote and tcbStatus one of Intel's
// status names; otherwise a signature could be moved to a quote with bytes
// appended and another status (docs/attestation.md#sign-quote). The Coordinator
// signs only the declared quote: a quote submitted with bytes after its end
// is verified as DeclaredQuote returns it (zero padding after a TDX quote is
// taken either way). Errors wrap ErrVerification; a malformed quote also
// ErrQuoteInvalid.
func VerifyQuoteSignature(root *x509.Certificate, quote []byte, tcbStatus string, signature []byte) error {
	declared, err := checkSignedQuote(quote, tcbStatus)
	if err != nil {
		return err
	}
	pub, ok := root.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("%w: the root certificate's key is a %T, not ECDSA", ErrVerification, root.PublicKey)
	}
	// The declared quote (what the Coordinator signs), and a zero-padded
	// TDX quote as given (what it signed before): see checkSignedQuote.
	for _, q := range [][]byte{declared, quote} {
		sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(q) + tcbStatus))
		if ecdsa.VerifyASN1(pub, sum[:], signature) {
			return nil
		}
		if len(q) == len(quote) {
			break
		}
	}
	return fmt.Errorf("%w: the quote signature does not verify with the root certificate", ErrVerification)
}
