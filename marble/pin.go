package marble

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Errors of a pinned activation (docs/trust.md).
var (
	// ErrNotCoordinator is a server at the Coordinator's address that did
	// not prove to be the pinned Coordinator: nothing was accepted from it.
	ErrNotCoordinator = errors.New("the server did not prove to be the pinned Coordinator")
	// ErrMarbleRootPin is a pin of a Marble Root. Every Marble certificate
	// and every certificate secret chains to the Marble Root, whose key
	// also signs the certificate secrets a user may read, and it changes
	// with every package update: it proves nobody to be the Coordinator.
	// Pin the Coordinator root instead (MARBLE_PREDEFINED_COORDINATOR_ROOT_CA).
	ErrMarbleRootPin = errors.New("a Marble Root cannot pin the Coordinator; pin the Coordinator root (MARBLE_PREDEFINED_COORDINATOR_ROOT_CA, the last certificate of GET /api/v2/quote) instead, see docs/trust.md")
)

// marbleRootCommonName is the subject common name of every Marble Root
// (and intermediate) a Quarry or MarbleRun Coordinator makes
// (docs/trust.md); a Coordinator root has "MarbleRun Coordinator".
const marbleRootCommonName = "MarbleRun Coordinator - Intermediate CA"

// pin is the Coordinator a pinned Marble accepts: its root certificate,
// or the SHA-256 of one (the certificate then comes with the server's
// chain).
type pin struct {
	root   *x509.Certificate
	sum    [32]byte
	hasSum bool
}

// newPin returns the pin of the options, nil for none.
func newPin(root *x509.Certificate, sum []byte) (*pin, error) {
	switch {
	case root != nil && sum != nil:
		return nil, errors.New("marble: both CoordinatorRoot and CoordinatorRootSHA256 are set; set one")
	case root != nil:
		if err := checkRoot(root); err != nil {
			return nil, fmt.Errorf("marble: Options.CoordinatorRoot: %w", err)
		}
		return &pin{root: root}, nil
	case sum != nil:
		if len(sum) != sha256.Size {
			return nil, fmt.Errorf("marble: Options.CoordinatorRootSHA256 has %d bytes; a SHA-256 fingerprint has 32", len(sum))
		}
		return &pin{sum: [32]byte(sum), hasSum: true}, nil
	}
	return nil, nil
}

// CheckCoordinatorRoot checks that c can pin the Coordinator
// (Options.CoordinatorRoot): a self-signed CA certificate that is not a
// Marble Root or intermediate (ErrMarbleRootPin).
func CheckCoordinatorRoot(c *x509.Certificate) error {
	return checkRoot(c)
}

// checkRoot implements CheckCoordinatorRoot.
func checkRoot(c *x509.Certificate) error {
	if c.Subject.CommonName == marbleRootCommonName {
		return fmt.Errorf("the certificate (CN %q) is a Marble Root or the Coordinator's intermediate: %w", c.Subject.CommonName, ErrMarbleRootPin)
	}
	if !c.IsCA || c.CheckSignatureFrom(c) != nil {
		return fmt.Errorf("the certificate (CN %q, issuer %q) is not a self-signed CA certificate; pin the Coordinator root (CN \"MarbleRun Coordinator\")", c.Subject.CommonName, c.Issuer.CommonName)
	}
	return nil
}

// verify checks the certificates a server presented, leaf first: the
// handshake proved that the server holds the leaf's key, and that key must
// be certified by a CA certificate in the chain that the pinned root signed
// (the Coordinator's intermediate: docs/trust.md), or be the root's own.
// Certificates of Marbles and certificate secrets are issued with the
// intermediate key, never the root key, so none of them passes.
//
// An error wrapping ErrMarbleRootPin means the fingerprint named a Marble
// Root; any other failure wraps ErrNotCoordinator.
func (p *pin) verify(chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return fmt.Errorf("%w: it presented no certificate", ErrNotCoordinator)
	}
	root := p.root
	if root == nil {
		for _, c := range chain {
			if sha256.Sum256(c.Raw) == p.sum {
				root = c
				break
			}
		}
		if root == nil {
			return fmt.Errorf("%w: none of its %s has the pinned SHA-256 fingerprint %s", ErrNotCoordinator, certificates(len(chain)), hex.EncodeToString(p.sum[:]))
		}
		if err := checkRoot(root); err != nil {
			return fmt.Errorf("the pinned fingerprint: %w", err)
		}
	}
	leaf := chain[0]
	for _, c := range chain {
		if c.IsCA && sameKey(c.PublicKey, leaf.PublicKey) && c.CheckSignatureFrom(root) == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: its TLS key (certificate %q issued by %q) is not certified by the pinned Coordinator root %q; Marble certificates and certificate secrets cannot prove to be the Coordinator",
		ErrNotCoordinator, leaf.Subject.String(), leaf.Issuer.String(), root.Subject.String())
}

func certificates(n int) string {
	if n == 1 {
		return "1 certificate"
	}
	return fmt.Sprintf("%d certificates", n)
}

// sameKey reports whether a and b are the same public key.
func sameKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && b != nil && k.Equal(b)
}

// ParseFingerprint parses a SHA-256 fingerprint written as 64 hex digits,
// optionally in pairs separated by colons (as `openssl x509 -fingerprint
// -sha256` prints it) or spaces, in either case.
func ParseFingerprint(s string) ([]byte, error) {
	h := strings.NewReplacer(":", "", " ", "").Replace(strings.TrimSpace(s))
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("%q is not a SHA-256 fingerprint (64 hex digits, pairs may be separated by colons)", s)
	}
	return b, nil
}
