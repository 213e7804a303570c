package marble_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/manifest"
	"github.com/quarry-cc/quarry/marble"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// evil is what an impostor hands a Marble that accepts it.
var evil = &marblepb.Parameters{
	Env:  map[string][]byte{"LD_PRELOAD": []byte("/tmp/evil.so")},
	Argv: []string{"/bin/sh", "-c", "exfiltrate"},
}

// marbleCredentials returns what an activated Marble holds of a
// Coordinator with authority a: its leaf (issued by the Marble Root with
// the intermediate key) with its key, as MARBLE_PREDEFINED_* hand it out.
func marbleCredentials(t *testing.T, a *ca.Authority) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{"localhost"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := a.IssueMarbleCert(rand.Reader, csr, "6ba7b810-9dad-41d1-80b4-00c04fd430c8", "backend", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Cert, leaf.Key
}

// secretCredentials returns a certificate secret the Coordinator with
// authority a generates for def (as a user who may read it gets it).
func secretCredentials(t *testing.T, a *ca.Authority, def manifest.Secret) (*x509.Certificate, any) {
	t.Helper()
	s, err := secrets.GenerateCert(rand.Reader, "cert", def, secrets.Issuer{Cert: a.MarbleRoot, Key: a.IntermediateKey}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(s.Cert)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParsePKCS8PrivateKey(s.Private)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// chain is a TLS certificate of the given certificates, leaf first, with
// the leaf's key.
func chain(key any, certs ...*x509.Certificate) tls.Certificate {
	c := tls.Certificate{PrivateKey: key, Leaf: certs[0]}
	for _, x := range certs {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

// selfSigned makes a CA certificate with subject cn and a key of its own.
func selfSigned(t *testing.T, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

// TestPinnedMarbleRefusesImpostors: a Marble pinned to the Coordinator
// root refuses every server that holds only credentials the Coordinator
// hands out (a Marble's certificate and key, a certificate secret, a CA
// secret and a leaf of it) or forges, however it arranges them with the
// Coordinator's public certificates. No request reaches the impostor, and
// the error says so. Unpinned, the same Marble takes the impostor's
// parameters (the trust of MarbleRun's premain).
func TestPinnedMarbleRefusesImpostors(t *testing.T) {
	genuine := marbletest.New(t, answer(t, &marblepb.Parameters{}))
	a := genuine.CA
	mLeaf, mKey := marbleCredentials(t, a)
	sCert, sKey := secretCredentials(t, a, manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 256})
	caCert, caKey := secretCredentials(t, a, manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 384, Cert: x509.Certificate{IsCA: true}})
	if !caCert.IsCA {
		t.Fatal("the CA secret is not a CA")
	}
	// A leaf issued by the CA secret, claiming the Coordinator's names.
	subKey, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	subDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: ca.IntermediateCommonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, caCert, &subKey.PublicKey, caKey.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := x509.ParseCertificate(subDER)
	if err != nil {
		t.Fatal(err)
	}
	forged, forgedKey := selfSigned(t, ca.IntermediateCommonName)
	other, err := ca.New(rand.Reader, ca.Names{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		cert tls.Certificate
	}{
		{"a Marble's credentials", chain(mKey, mLeaf, a.Intermediate)},
		{"a Marble's credentials with the Coordinator's chain", chain(mKey, mLeaf, a.MarbleRoot, a.Intermediate, a.Root)},
		{"a certificate secret", chain(sKey, sCert, a.Intermediate, a.Root)},
		{"a CA certificate secret", chain(caKey, caCert, a.Intermediate, a.Root)},
		{"a CA secret after the root", chain(caKey, caCert, a.Root, caCert)},
		{"a leaf of a CA secret", chain(subKey, sub, caCert, a.Intermediate, a.Root)},
		{"a forged intermediate", chain(forgedKey, forged, a.Intermediate, a.Root)},
		{"another Coordinator", *other.MarbleTLSCertificate()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			impostor := marbletest.NewWithCertificate(t, tc.cert, answer(t, evil))
			opts := options(t, impostor)
			opts.Attempts = 1
			opts.CoordinatorRoot = a.Root
			p, err := marble.Activate(context.Background(), opts)
			if !errors.Is(err, marble.ErrNotCoordinator) || p != nil {
				t.Fatalf("err = %v, want ErrNotCoordinator", err)
			}
			if !strings.Contains(err.Error(), "not certified by the pinned Coordinator root") {
				t.Errorf("err = %v, want it to say why", err)
			}
			var ce *marble.CoordinatorError
			if errors.As(err, &ce) {
				t.Errorf("err = %v: an impostor's certificate is no answer of the Coordinator", err)
			}
			if n := len(impostor.Requests()); n != 0 {
				t.Errorf("%d requests reached the impostor", n)
			}

			// By fingerprint too.
			opts.CoordinatorRoot = nil
			sum := sha256.Sum256(a.Root.Raw)
			opts.CoordinatorRootSHA256 = sum[:]
			if _, err := marble.Activate(context.Background(), opts); !errors.Is(err, marble.ErrNotCoordinator) {
				t.Fatalf("fingerprint pin: err = %v, want ErrNotCoordinator", err)
			}

			// Unpinned, the impostor's word is taken.
			opts.CoordinatorRootSHA256 = nil
			p, err = marble.Activate(context.Background(), opts)
			if err != nil || !slices.Equal(p.Argv, evil.Argv) || len(p.FileRoots) != 0 {
				t.Fatalf("unpinned: %+v, %v; want the impostor's parameters and no file roots", p, err)
			}
		})
	}
}

// TestPinnedMarbleAcceptsTheCoordinator: the pin (the root, or its
// SHA-256 in any usual notation) accepts the Coordinator, also after its
// intermediate and Marble Root were renewed (a package update) and when it
// presents its root itself; a pinned activation may write absolute paths.
func TestPinnedMarbleAcceptsTheCoordinator(t *testing.T) {
	coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
	a := coord.CA
	sum := sha256.Sum256(a.Root.Raw)
	pairs := make([]string, len(sum))
	for i, b := range sum {
		pairs[i] = fmt.Sprintf("%02X", b)
	}
	// As openssl x509 -fingerprint -sha256 prints it.
	fp, err := marble.ParseFingerprint("  " + strings.Join(pairs, ":") + "\n")
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := a.Rotate(rand.Reader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	updated := marbletest.NewWithCertificate(t, *rotated.MarbleTLSCertificate(), answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
	rootItself := marbletest.NewWithCertificate(t, chain(a.RootKey, a.Root), answer(t, &marblepb.Parameters{Argv: []string{"app"}}))

	for _, tc := range []struct {
		name  string
		coord *marbletest.Coordinator
		root  *x509.Certificate
		sum   []byte
	}{
		{"root", coord, a.Root, nil},
		{"fingerprint", coord, nil, fp},
		{"root after an update", updated, a.Root, nil},
		{"fingerprint after an update", updated, nil, sum[:]},
		{"the root presented itself", rootItself, a.Root, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := options(t, tc.coord)
			opts.CoordinatorRoot, opts.CoordinatorRootSHA256 = tc.root, tc.sum
			p, err := marble.Activate(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Argv, []string{"app"}) || !slices.Equal(p.FileRoots, []string{"/"}) {
				t.Errorf("Argv %q, FileRoots %q; want app and / (pinned)", p.Argv, p.FileRoots)
			}
			if len(tc.coord.Requests()) == 0 {
				t.Error("no request reached the Coordinator")
			}
		})
	}
	t.Run("declared file roots", func(t *testing.T) {
		opts := options(t, coord)
		opts.CoordinatorRoot = a.Root
		opts.FileRoots = []string{"/srv/app"}
		p, err := marble.Activate(context.Background(), opts)
		if err != nil || !slices.Equal(p.FileRoots, opts.FileRoots) {
			t.Fatalf("FileRoots %v (%v), want the declared ones", p, err)
		}
	})
}

// TestPinRetriesThenGivesUp: a server that is not the pinned Coordinator
// (as a Coordinator in recovery mode, which presents a temporary root) is
// tried again like an unreachable one, and the last error names it.
func TestPinRetriesThenGivesUp(t *testing.T) {
	other, err := ca.New(rand.Reader, ca.Names{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pinned := marbletest.New(t, answer(t, &marblepb.Parameters{}))
	impostor := marbletest.NewWithCertificate(t, *other.MarbleTLSCertificate(), answer(t, evil))
	opts := options(t, impostor)
	opts.CoordinatorRoot = pinned.CA.Root
	opts.Attempts = 3
	opts.RetryDelay = time.Millisecond
	_, err = marble.Activate(context.Background(), opts)
	if !errors.Is(err, marble.ErrNotCoordinator) || !strings.Contains(err.Error(), "3 attempts") {
		t.Fatalf("err = %v, want ErrNotCoordinator after 3 attempts", err)
	}
}

// TestPinOptions: a Marble Root is no pin (RootCAs, the old option that
// pinned it, is refused too), nor is a certificate that is not a
// self-signed CA; both pins at once and a malformed fingerprint are
// refused. Nothing is sent for an invalid pin. A fingerprint that names
// the Marble Root the Coordinator presents ends at once.
func TestPinOptions(t *testing.T) {
	coord := marbletest.New(t, answer(t, &marblepb.Parameters{}))
	a := coord.CA
	pool := x509.NewCertPool()
	pool.AddCert(a.MarbleRoot)
	leaf, _ := marbleCredentials(t, a)
	sum := sha256.Sum256(a.Root.Raw)
	for _, tc := range []struct {
		name   string
		change func(*marble.Options)
		is     error
		want   string
	}{
		{"RootCAs", func(o *marble.Options) { o.RootCAs = pool }, marble.ErrMarbleRootPin, "RootCAs is no longer supported"},
		{"RootCAs with the root", func(o *marble.Options) { o.RootCAs = pool; o.CoordinatorRoot = a.Root }, marble.ErrMarbleRootPin, "RootCAs"},
		{"Marble Root", func(o *marble.Options) { o.CoordinatorRoot = a.MarbleRoot }, marble.ErrMarbleRootPin, "is a Marble Root"},
		{"a leaf", func(o *marble.Options) { o.CoordinatorRoot = leaf }, nil, "not a self-signed CA"},
		{"the intermediate", func(o *marble.Options) { o.CoordinatorRoot = a.Intermediate }, marble.ErrMarbleRootPin, "Marble Root"},
		{"both", func(o *marble.Options) { o.CoordinatorRoot = a.Root; o.CoordinatorRootSHA256 = sum[:] }, nil, "set one"},
		{"short fingerprint", func(o *marble.Options) { o.CoordinatorRootSHA256 = sum[:31] }, nil, "31 bytes"},
		{"relative file root", func(o *marble.Options) { o.FileRoots = []string{"data"} }, nil, "not an absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := options(t, coord)
			tc.change(&opts)
			_, err := marble.Activate(context.Background(), opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("err = %v, want one containing %q (matching %v)", err, tc.want, tc.is)
			}
		})
	}
	if n := len(coord.Requests()); n != 0 {
		t.Errorf("%d requests sent with invalid pins", n)
	}

	mr := sha256.Sum256(a.MarbleRoot.Raw)
	opts := options(t, coord)
	opts.CoordinatorRootSHA256 = mr[:]
	opts.RetryDelay = time.Hour // must not be waited for
	_, err := marble.Activate(context.Background(), opts)
	if !errors.Is(err, marble.ErrMarbleRootPin) || errors.Is(err, marble.ErrNotCoordinator) {
		t.Fatalf("err = %v, want ErrMarbleRootPin at once", err)
	}

	for _, s := range []string{"", "zz", strings.Repeat("ab", 31), strings.Repeat("ab", 33)} {
		if _, err := marble.ParseFingerprint(s); err == nil {
			t.Errorf("ParseFingerprint(%q) accepted", s)
		}
	}
}
