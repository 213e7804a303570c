package client_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/http"
	"strings"
	"testing"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/attest"
)

// quoteHandler answers GET /api/v2/quote with the fake's chain and a quote
// built by mkQuote from the nonce it received (nil: simulation).
func quoteHandler(f *fake, chain string, mkQuote func(nonce []byte) []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		nonce, err := base64.URLEncoding.DecodeString(r.URL.Query().Get("nonce"))
		if err != nil {
			reply(w, http.StatusBadRequest, "fail", nil, "invalid query: bad nonce format: "+err.Error())
			return
		}
		var q []byte
		if mkQuote != nil {
			q = mkQuote(nonce)
		}
		reply(w, http.StatusOK, "success", v2.QuoteResponse{Cert: chain, Quote: q}, "")
	}
}

// fakeQuote is a stand-in quote: a marker followed by the report data.
func fakeQuote(rootDER, nonce []byte) []byte {
	rd := client.ReportData(rootDER, nonce)
	return append([]byte("QUOTE:"), rd[:]...)
}

// quoteChecker is a QuoteVerifier for fakeQuote.
var quoteChecker = client.QuoteVerifierFunc(func(_ context.Context, quote []byte, rd [client.ReportDataSize]byte) error {
	if !bytes.HasPrefix(quote, []byte("QUOTE:")) {
		return errors.New("not a quote")
	}
	if !bytes.Equal(quote[6:], rd[:]) {
		return errors.New("report data mismatch")
	}
	return nil
})

func TestReportDataMatchesServer(t *testing.T) {
	for _, nonce := range [][]byte{nil, {}, []byte("nonce"), bytes.Repeat([]byte{7}, 32)} {
		der := []byte("root certificate DER")
		if client.ReportData(der, nonce) != attest.ReportData(der, nonce) {
			t.Fatalf("client and server report data differ for nonce %x", nonce)
		}
	}
	rd := client.ReportData([]byte("x"), []byte("y"))
	sum := sha256.Sum256([]byte("xy"))
	if !bytes.Equal(rd[:32], sum[:]) || !bytes.Equal(rd[32:], make([]byte, 32)) {
		t.Fatalf("report data layout %x", rd)
	}
}

func TestVerifyCoordinatorSimulation(t *testing.T) {
	f := newFake(t)
	f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.inter, f.root), nil))
	ctx := context.Background()

	_, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{Verifier: quoteChecker})
	if !errors.Is(err, client.ErrVerification) || !errors.Is(err, client.ErrNoQuote) {
		t.Fatalf("simulation without insecure: %v, want ErrVerification and ErrNoQuote", err)
	}
	att, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if !att.Root.Equal(f.root) || !att.Intermediate.Equal(f.inter) || att.QuoteVerified || att.Quote != nil {
		t.Fatalf("attestation %+v", att)
	}
	if len(att.Nonce) != client.NonceSize {
		t.Fatalf("nonce of %d bytes", len(att.Nonce))
	}
	if got := f.last().Query["nonce"]; len(got) != 1 || got[0] != base64.URLEncoding.EncodeToString(att.Nonce) {
		t.Fatalf("nonce sent %q", got)
	}
	// The returned root pins later requests.
	f.handle("GET "+v2.PathStatus, success(v2.StatusResponse{Code: 2, Status: 2}))
	c, err := client.New(f.endpoint(), client.WithRootCertificate(att.Root))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	// Two calls use two different nonces.
	att2, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(att.Nonce, att2.Nonce) {
		t.Fatal("nonce reused")
	}
}

// TestVerifyCoordinatorVerifierExcludesInsecure: a man in the middle with a
// root of its own answers quote null (as a Coordinator in simulation mode
// does). A caller that has a Verifier and also sets InsecureSkipVerify
// ("verify if there is a quote") would accept the stranger's root; the
// combination is refused before any request, and with the Verifier alone the
// missing quote fails verification.
func TestVerifyCoordinatorVerifierExcludesInsecure(t *testing.T) {
	mitm := newFake(t) // its own root, served as its TLS certificate
	mitm.handle("GET "+v2.PathQuote, quoteHandler(mitm, certPEM(mitm.inter, mitm.root), nil))
	ctx := context.Background()

	att, err := client.VerifyCoordinator(ctx, mitm.endpoint(), client.VerifyOptions{Verifier: quoteChecker, InsecureSkipVerify: true})
	if err == nil {
		t.Fatalf("Verifier with InsecureSkipVerify accepted the man in the middle's root %v", att.Root.Subject)
	}
	if !errors.Is(err, client.ErrExclusiveOptions) {
		t.Fatalf("got %v, want ErrExclusiveOptions", err)
	}
	for _, name := range []string{"Verifier", "InsecureSkipVerify"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error does not name %s: %v", name, err)
		}
	}
	if n := mitm.total(); n != 0 {
		t.Fatalf("the refused combination sent %d requests", n)
	}
	// The Verifier alone refuses the answer without a quote.
	if _, err := client.VerifyCoordinator(ctx, mitm.endpoint(), client.VerifyOptions{Verifier: quoteChecker}); !errors.Is(err, client.ErrNoQuote) || !errors.Is(err, client.ErrVerification) {
		t.Fatalf("Verifier alone: %v, want ErrNoQuote and ErrVerification", err)
	}
}

func TestVerifyCoordinatorQuote(t *testing.T) {
	f := newFake(t)
	ctx := context.Background()
	f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.inter, f.root), func(nonce []byte) []byte {
		return fakeQuote(f.root.Raw, nonce)
	}))
	att, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{Verifier: quoteChecker})
	if err != nil {
		t.Fatal(err)
	}
	if !att.QuoteVerified || !att.Root.Equal(f.root) {
		t.Fatalf("attestation %+v", att)
	}
	// A caller-chosen nonce is used.
	att, err = client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{Verifier: quoteChecker, Nonce: []byte("chosen")})
	if err != nil || string(att.Nonce) != "chosen" {
		t.Fatalf("chosen nonce: %v %q", err, att.Nonce)
	}
	// No verifier: refused unless insecure.
	_, err = client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{})
	if !errors.Is(err, client.ErrNoQuoteVerifier) || !errors.Is(err, client.ErrVerification) {
		t.Fatalf("no verifier: %v", err)
	}
	att, err = client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{InsecureSkipVerify: true})
	if err != nil || att.QuoteVerified || att.Quote == nil {
		t.Fatalf("insecure with a quote: %v %+v", err, att)
	}
	// The verifier's error is reported and wrapped.
	boom := errors.New("TCB revoked")
	_, err = client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{
		Verifier: client.QuoteVerifierFunc(func(context.Context, []byte, [64]byte) error { return boom }),
	})
	if !errors.Is(err, boom) || !errors.Is(err, client.ErrVerification) {
		t.Fatalf("verifier error: %v", err)
	}
	// A quote over another nonce (a replay) fails the report-data check.
	f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.inter, f.root), func([]byte) []byte {
		return fakeQuote(f.root.Raw, []byte("old nonce"))
	}))
	if _, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{Verifier: quoteChecker}); !errors.Is(err, client.ErrVerification) {
		t.Fatalf("replayed quote: %v", err)
	}
}

func TestVerifyCoordinatorChecksChain(t *testing.T) {
	f := newFake(t)
	other := newPKI(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		chain string
	}{
		{"intermediate of another root", certPEM(other.inter, f.root)},
		{"root only", certPEM(f.root)},
		{"three certificates", certPEM(f.inter, f.root, other.root)},
		{"no root", certPEM(f.inter, other.inter)},
		{"garbage", "not PEM"},
		// The chain is valid but its root is not the TLS certificate.
		{"another Coordinator's chain", certPEM(other.inter, other.root)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.handle("GET "+v2.PathQuote, quoteHandler(f, tc.chain, nil))
			_, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{InsecureSkipVerify: true})
			if !errors.Is(err, client.ErrVerification) {
				t.Fatalf("got %v, want ErrVerification", err)
			}
		})
	}
	// Root first, intermediate second is accepted too.
	f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.root, f.inter), nil))
	if _, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{InsecureSkipVerify: true}); err != nil {
		t.Fatal(err)
	}
	// Errors of the endpoint come back as *client.Error.
	f.handle("GET "+v2.PathQuote, failure(http.StatusInternalServerError, "broken", nil))
	if _, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{InsecureSkipVerify: true}); !errors.Is(err, client.ErrServer) {
		t.Fatalf("server error: %v", err)
	}
}

func TestVerifyCoordinatorServedByAnotherCertificate(t *testing.T) {
	p := newPKI(t)
	// The server presents the intermediate, not the root.
	f := newFakeWithTLSCert(t, p, &tls.Certificate{Certificate: [][]byte{p.inter.Raw}, PrivateKey: p.interKey})
	f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(p.inter, p.root), nil))
	_, err := client.VerifyCoordinator(context.Background(), f.endpoint(), client.VerifyOptions{InsecureSkipVerify: true})
	if !errors.Is(err, client.ErrVerification) {
		t.Fatalf("got %v, want ErrVerification", err)
	}
}

func TestVerifyManifest(t *testing.T) {
	p := newPKI(t)
	raw := []byte(`{"Packages":{"a":{}}}`)
	sum := sha256.Sum256(raw)
	sig, err := ecdsa.SignASN1(rand.Reader, p.rootKey, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	good := &v2.ManifestGetResponse{Manifest: raw, ManifestFingerprint: client.ManifestFingerprint(raw), ManifestSignatureRootECDSA: sig}
	if err := client.VerifyManifest(p.root, good); err != nil {
		t.Fatal(err)
	}
	if client.ManifestFingerprint(raw) != strings.ToLower(client.ManifestFingerprint(raw)) || len(client.ManifestFingerprint(raw)) != 64 {
		t.Fatal("fingerprint is not lowercase hex SHA-256")
	}
	other := newPKI(t)
	for name, tc := range map[string]struct {
		root *x509.Certificate
		m    *v2.ManifestGetResponse
	}{
		"other root":           {other.root, good},
		"tampered manifest":    {p.root, &v2.ManifestGetResponse{Manifest: []byte(`{}`), ManifestFingerprint: client.ManifestFingerprint([]byte(`{}`)), ManifestSignatureRootECDSA: sig}},
		"fingerprint mismatch": {p.root, &v2.ManifestGetResponse{Manifest: raw, ManifestFingerprint: "00", ManifestSignatureRootECDSA: sig}},
		"garbage signature":    {p.root, &v2.ManifestGetResponse{Manifest: raw, ManifestFingerprint: client.ManifestFingerprint(raw), ManifestSignatureRootECDSA: []byte("x")}},
	} {
		if err := client.VerifyManifest(tc.root, tc.m); !errors.Is(err, client.ErrVerification) {
			t.Errorf("%s: %v, want ErrVerification", name, err)
		}
	}
}

func TestRecoveryCrypto(t *testing.T) {
	key := testRSAKey(t)
	secret := bytes.Repeat([]byte{0x42}, 32)
	// What the Coordinator does at manifest set.
	ct, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, &key.PublicKey, secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(key)
	for name, text := range map[string][]byte{
		"PKCS #8": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
		"PKCS #1": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"after a certificate": append([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
			pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})...),
	} {
		k, err := client.ParseRSAPrivateKeyPEM(text)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		plain, err := client.DecryptRecoverySecret(k, ct)
		if err != nil || !bytes.Equal(plain, secret) {
			t.Fatalf("%s: decrypt: %v", name, err)
		}
	}
	if !client.IsPlainRecoverySecret(secret) || client.IsPlainRecoverySecret(ct) {
		t.Fatal("IsPlainRecoverySecret")
	}
	for _, n := range []int{16, 32, 33} {
		if !client.IsPlainRecoverySecret(make([]byte, n)) {
			t.Fatalf("length %d not plain", n)
		}
	}
	// The signature MarbleRun's Coordinator checks.
	sig, err := client.SignRecoverySecret(key, secret)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(secret)
	if err := rsa.VerifyPKCS1v15(&key.PublicKey, crypto.SHA256, sum[:], sig); err != nil {
		t.Fatalf("signature: %v", err)
	}
	// Encryption to the ephemeral key: the Coordinator decrypts with OAEP.
	enc, err := client.EncryptRecoverySecret(&key.PublicKey, secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rsa.DecryptOAEP(sha256.New(), nil, key, enc, nil); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("ephemeral encryption: %v", err)
	}
	// Wrong key, wrong inputs.
	other, _ := rsa.GenerateKey(rand.Reader, 1024)
	if _, err := client.DecryptRecoverySecret(other, ct); err == nil {
		t.Fatal("decrypted with the wrong key")
	}
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: mustPKCS8(t, newPKI(t).rootKey)})
	for name, text := range map[string][]byte{
		"EC key":    ecPEM,
		"no PEM":    []byte("hello"),
		"encrypted": pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}),
		"bad PKCS1": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: []byte{1}}),
	} {
		if _, err := client.ParseRSAPrivateKeyPEM(text); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if _, err := client.SignRecoverySecret(newPKI(t).rootKey, secret); err == nil {
		t.Fatal("signed with an EC key")
	}
}

func mustPKCS8(t *testing.T, k any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
