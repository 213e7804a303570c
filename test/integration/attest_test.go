package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

// signQuoteManifest enables the sign-quote endpoint (gate compared
// case-insensitively).
const signQuoteManifest = `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}},"Config":{"FeatureGates":["signQuoteEndpoint"]}}`

// sgxPlatform is a synthetic SGX machine (dcaptest) with its collateral in a
// file in the Phala JSON shape and its root certificate in a PEM file: what
// the Coordinator is configured with to verify its quotes.
type sgxPlatform struct {
	pki            *dcaptest.PKI
	pl             *dcaptest.Platform
	enclave        dcaptest.Enclave
	collateralFile string
	rootFile       string
}

// collateralWindow is valid now: the coordinator verifies at its own clock.
func collateralWindow() (from, until time.Time) {
	now := time.Now()
	return now.Add(-24 * time.Hour), now.Add(30 * 24 * time.Hour)
}

// newSGXPlatform creates a platform whose platform TCB level has status
// (with advisories), with collateral valid now.
func newSGXPlatform(t *testing.T, status string, advisories []string) *sgxPlatform {
	t.Helper()
	from, until := collateralWindow()
	return newSGXPlatformAt(t, status, advisories, from, until)
}

// newSGXPlatformAt is newSGXPlatform with collateral valid from from until
// until.
func newSGXPlatformAt(t *testing.T, status string, advisories []string, from, until time.Time) *sgxPlatform {
	t.Helper()
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	col := pl.Collateral(t, dcaptest.CollateralOptions{
		IssueDate: from, NextUpdate: until,
		TCBLevels: []dcaptest.TCBLevel{{CompSVN: pl.Ext.CompSVN, PCESVN: pl.Ext.PCESVN, Status: status, Advisories: advisories}},
	})
	dir := t.TempDir()
	s := &sgxPlatform{pki: p, pl: pl,
		collateralFile: filepath.Join(dir, "collateral.json"), rootFile: filepath.Join(dir, "sgx-root.pem"),
		enclave: dcaptest.Enclave{ISVProdID: 7, ISVSVN: 4}}
	copy(s.enclave.MRENCLAVE[:], "integration coordinator enclave")
	copy(s.enclave.MRSIGNER[:], "integration coordinator signer")
	if err := os.WriteFile(s.collateralFile, dcaptest.QVLJSON(t, col), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.rootFile, dcaptest.PEM(p.Root), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// env configures a coordinator to verify quotes of this platform.
func (s *sgxPlatform) env() []string {
	return []string{"QUARRY_COLLATERAL_FILE=" + s.collateralFile, "QUARRY_SGX_ROOT_CA=" + s.rootFile}
}

// quote returns a raw v3 quote of the platform's fake QE over rd.
func (s *sgxPlatform) quote(t testing.TB, rd [64]byte) []byte {
	e := s.enclave
	e.ReportData = rd
	return s.pl.Quote(t, dcaptest.QuoteOptions{Enclave: e})
}

// signQuoteData is the data of a sign-quote answer.
type signQuoteData struct {
	Signature             []byte `json:"signature"`
	VerificationSignature []byte `json:"verificationSignature"`
	TCBStatus             string `json:"tcbStatus"`
	SGXQuote              string `json:"sgxQuote"` // fail data
}

func postSignQuote(t *testing.T, c *coordinator, hc *http.Client, body any) (response, signQuoteData) {
	t.Helper()
	r := do(t, hc, http.MethodPost, c.url("/api/v2/sign-quote"), body)
	var d signQuoteData
	if len(r.Data) > 0 && string(r.Data) != "null" {
		decode(t, r, &d)
	}
	return r, d
}

// checkQuoteSignature verifies a sign-quote signature with the root
// certificate from /api/v2/quote: SHA-256(base64std(quote) ‖ tcbStatus).
func checkQuoteSignature(t *testing.T, c *coordinator, hc *http.Client, quote []byte, d signQuoteData) {
	t.Helper()
	if len(d.Signature) == 0 || !bytes.Equal(d.Signature, d.VerificationSignature) {
		t.Fatalf("signature %x and verificationSignature %x must be equal and set (docs/design/decisions.md#d3)", d.Signature, d.VerificationSignature)
	}
	root := fetchRoot(t, c, hc)
	sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(quote) + d.TCBStatus))
	if !ecdsa.VerifyASN1(root.PublicKey.(*ecdsa.PublicKey), sum[:], d.Signature) {
		t.Fatal("the sign-quote signature does not verify with the root certificate")
	}
	if err := client.VerifyQuoteSignature(root, quote, d.TCBStatus, d.Signature); err != nil {
		t.Fatalf("SDK: %v", err)
	}
}

// fetchRoot returns the root certificate of GET /api/v2/quote (whatever the
// quote).
func fetchRoot(t *testing.T, c *coordinator, hc *http.Client) *x509.Certificate {
	t.Helper()
	r := do(t, hc, http.MethodGet, c.url("/api/v2/quote"), nil)
	expect(t, r, http.StatusOK, "success")
	var q quoteData
	decode(t, r, &q)
	_, root, err := client.ParseCertificateChain([]byte(q.Cert))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func TestSignQuoteDisabled(t *testing.T) {
	t.Parallel()
	s := newSGXPlatform(t, "UpToDate", nil)
	c := startCoordinator(t, "", s.env()...)
	hc := c.client(nil, nil)
	body := map[string][]byte{"sgxQuote": s.quote(t, [64]byte{1})}

	// No manifest: disabled.
	r, _ := postSignQuote(t, c, hc, body)
	expect(t, r, http.StatusForbidden, "fail")
	if r.Message != "SignQuoteEndpoint feature is not enabled in the manifest" {
		t.Fatalf("message %q", r.Message)
	}
	// A manifest without the gate: disabled.
	expect(t, setManifest(t, c, hc, []byte(`{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}}}`)), http.StatusOK, "success")
	r, _ = postSignQuote(t, c, hc, body)
	expect(t, r, http.StatusForbidden, "fail")
	if r.Message != "SignQuoteEndpoint feature is not enabled in the manifest" {
		t.Fatalf("message %q", r.Message)
	}
	// Only POST; v1 has no sign-quote.
	expect(t, do(t, hc, http.MethodGet, c.url("/api/v2/sign-quote"), nil), http.StatusMethodNotAllowed, "fail")
	if r := do(t, hc, http.MethodPost, c.url("/sign-quote"), body); r.HTTPStatus != http.StatusNotFound {
		t.Fatalf("v1 /sign-quote: HTTP %d", r.HTTPStatus)
	}
}

func TestSignQuoteNoCollateralSource(t *testing.T) {
	t.Parallel()
	s := newSGXPlatform(t, "UpToDate", nil)
	c := startCoordinator(t, "") // no collateral configured
	hc := c.client(nil, nil)
	expect(t, setManifest(t, c, hc, []byte(signQuoteManifest)), http.StatusOK, "success")
	r, _ := postSignQuote(t, c, hc, map[string][]byte{"sgxQuote": s.quote(t, [64]byte{})})
	expect(t, r, http.StatusForbidden, "fail")
	for _, want := range []string{"no collateral source", "--collateral-file", "QUARRY_COLLATERAL_FILE", "--pccs-url", "QUARRY_PCCS_URL"} {
		if !strings.Contains(r.Message, want) {
			t.Errorf("message %q does not mention %q", r.Message, want)
		}
	}
}

func TestSignQuote(t *testing.T) {
	t.Parallel()
	s := newSGXPlatform(t, "UpToDate", nil)
	c := startCoordinator(t, "", s.env()...)
	hc := c.client(nil, nil)
	expect(t, setManifest(t, c, hc, []byte(signQuoteManifest)), http.StatusOK, "success")

	raw := s.quote(t, [64]byte{'q'})
	for _, tc := range []struct {
		name  string
		quote []byte
	}{{"raw", raw}, {"OE-wrapped", sgxquote.Wrap(raw)}} {
		t.Run(tc.name, func(t *testing.T) {
			r, d := postSignQuote(t, c, hc, map[string][]byte{"sgxQuote": tc.quote})
			expect(t, r, http.StatusOK, "success")
			if d.TCBStatus != "UpToDate" {
				t.Fatalf("tcbStatus %q", d.TCBStatus)
			}
			// The signature covers the quote exactly as submitted.
			checkQuoteSignature(t, c, hc, tc.quote, d)
		})
	}

	t.Run("SDK", func(t *testing.T) {
		root := fetchRoot(t, c, hc)
		sdk, err := client.New(c.addr, client.WithRootCertificate(root))
		if err != nil {
			t.Fatal(err)
		}
		res, err := sdk.SignQuote(context.Background(), raw)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.VerifyQuoteSignature(root, raw, res.TCBStatus, res.VerificationSignature); err != nil || res.TCBStatus != "UpToDate" {
			t.Fatalf("SDK sign-quote: %v, status %q", err, res.TCBStatus)
		}
	})

	tampered := bytes.Clone(raw)
	tampered[112] ^= 1 // MRENCLAVE, signed by the attestation key
	other := newSGXPlatform(t, "UpToDate", nil)
	for _, tc := range []struct {
		name   string
		quote  []byte
		reason string
	}{
		{"tampered", tampered, "ISV enclave report signature: bad signature"},
		{"truncated", raw[:600], "parse quote: malformed input"},
		{"garbage", []byte("not a quote"), "parse quote"},
		{"another SGX root", other.quote(t, [64]byte{}), "untrusted root CA"},
		{"empty", nil, "the quote is empty"},
	} {
		t.Run("invalid "+tc.name, func(t *testing.T) {
			r, d := postSignQuote(t, c, hc, map[string][]byte{"sgxQuote": tc.quote})
			expect(t, r, http.StatusBadRequest, "fail")
			if r.Message != "quote verification failed" {
				t.Fatalf("message %q", r.Message)
			}
			if !strings.HasPrefix(d.SGXQuote, "quote verification failed: ") || !strings.Contains(d.SGXQuote, tc.reason) {
				t.Fatalf("data.sgxQuote %q, want the reason %q", d.SGXQuote, tc.reason)
			}
		})
	}

	t.Run("bad JSON", func(t *testing.T) {
		for _, body := range []string{`{"sgxQuote":`, `{"sgxQuote":"not base64!"}`, `[]`} {
			r, d := postSignQuote(t, c, hc, body)
			expect(t, r, http.StatusBadRequest, "fail")
			if d.SGXQuote != "failed to parse JSON data" {
				t.Fatalf("%s: data %s", body, r.Data)
			}
		}
	})
	t.Run("body too large", func(t *testing.T) {
		big := `{"sgxQuote":"` + strings.Repeat("A", 2<<20) + `"}`
		r, _ := postSignQuote(t, c, hc, big)
		expect(t, r, http.StatusRequestEntityTooLarge, "fail")
	})
	t.Run("concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q := raw
				if i%2 == 1 {
					q = sgxquote.Wrap(raw)
				}
				r := do(t, hc, http.MethodPost, c.url("/api/v2/sign-quote"), map[string][]byte{"sgxQuote": q})
				if r.HTTPStatus != http.StatusOK {
					t.Errorf("HTTP %d: %s", r.HTTPStatus, r.Raw)
				}
			}()
		}
		wg.Wait()
	})
}

// TestSignQuoteStatuses: a TCB status other than UpToDate is signed with that
// status; expired collateral is a verification failure, never signed.
func TestSignQuoteStatuses(t *testing.T) {
	t.Parallel()
	from, until := collateralWindow()
	for _, tc := range []struct {
		name       string
		status     string
		from, till time.Time
		httpStatus int
		reason     string
	}{
		{"SWHardeningNeeded", "SWHardeningNeeded", from, until, http.StatusOK, ""},
		{"OutOfDate", "OutOfDate", from, until, http.StatusOK, ""},
		{"ConfigurationAndSWHardeningNeeded", "ConfigurationAndSWHardeningNeeded", from, until, http.StatusOK, ""},
		{"expired collateral", "UpToDate", from.Add(-60 * 24 * time.Hour), from, http.StatusBadRequest, "collateral expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSGXPlatformAt(t, tc.status, []string{"INTEL-SA-00615"}, tc.from, tc.till)
			c := startCoordinator(t, "", s.env()...)
			hc := c.client(nil, nil)
			expect(t, setManifest(t, c, hc, []byte(signQuoteManifest)), http.StatusOK, "success")
			q := s.quote(t, [64]byte{'s'})
			r, d := postSignQuote(t, c, hc, map[string][]byte{"sgxQuote": q})
			if tc.httpStatus != http.StatusOK {
				expect(t, r, tc.httpStatus, "fail")
				if !strings.Contains(d.SGXQuote, tc.reason) || len(d.Signature) > 0 {
					t.Fatalf("data %s, want the reason %q and no signature", r.Data, tc.reason)
				}
				return
			}
			expect(t, r, http.StatusOK, "success")
			if d.TCBStatus != tc.status {
				t.Fatalf("tcbStatus %q, want %q", d.TCBStatus, tc.status)
			}
			checkQuoteSignature(t, c, hc, q, d)
		})
	}
}

// TestSignQuoteSplice: the Coordinator's signature over base64(quote) ‖
// "ConfigurationAndSWHardeningNeeded" is, byte for byte, one over base64(quote
// ‖ 12 bytes) ‖ "SWHardeningNeeded" when the quote's length is a multiple of
// 3 ("ConfigurationAnd" is base64). A verifier that checks only the
// signature accepts the spliced pair; the SDK's VerifyQuoteSignature accepts
// the genuine answer and refuses the splice. Submitted itself, the spliced
// quote gets the answer for its declared part.
func TestSignQuoteSplice(t *testing.T) {
	t.Parallel()
	s := newSGXPlatform(t, "ConfigurationAndSWHardeningNeeded", []string{"INTEL-SA-00615"})
	c := startCoordinator(t, "", s.env()...)
	hc := c.client(nil, nil)
	expect(t, setManifest(t, c, hc, []byte(signQuoteManifest)), http.StatusOK, "success")
	// A genuine quote whose length is a multiple of 3 (the QE
	// authentication data's length is free).
	var q []byte
	for n := 32; len(q)%3 != 0 || q == nil; n++ {
		e := s.enclave
		e.ReportData = [64]byte{'s'}
		q = s.pl.Quote(t, dcaptest.QuoteOptions{Enclave: e, AuthData: make([]byte, n)})
	}
	r, d := postSignQuote(t, c, hc, map[string][]byte{"sgxQuote": q})
	expect(t, r, http.StatusOK, "success")
	if d.TCBStatus != "ConfigurationAndSWHardeningNeeded" {
		t.Fatalf("tcbStatus %q", d.TCBStatus)
	}
	checkQuoteSignature(t, c, hc, q, d)

	extra, err := base64.StdEncoding.DecodeString("ConfigurationAnd")
	if err != nil {
		t.Fatal(err)
	}
	spliced := append(bytes.Clone(q), extra...)
	const splicedStatus = "SWHardeningNeeded"
	root := fetchRoot(t, c, hc)
	sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(spliced) + splicedStatus))
	if !ecdsa.VerifyASN1(root.PublicKey.(*ecdsa.PublicKey), sum[:], d.Signature) {
		t.Fatal("the splice does not carry the signature over (it should: this is the pitfall)")
	}
	err = client.VerifyQuoteSignature(root, spliced, splicedStatus, d.Signature)
	if !errors.Is(err, client.ErrVerification) || !errors.Is(err, client.ErrQuoteInvalid) {
		t.Fatalf("the SDK with the spliced quote and status %s: %v, want ErrVerification and ErrQuoteInvalid", splicedStatus, err)
	}
	// The Coordinator verifies and signs only the declared quote, as Intel's
	// library ignores bytes after it: for the spliced quote it answers with
	// the status of q and a signature that verifies for q; the SDK refuses
	// that signature for the spliced quote, whatever the status.
	r, d2 := postSignQuote(t, c, hc, map[string][]byte{"sgxQuote": spliced})
	expect(t, r, http.StatusOK, "success")
	if d2.TCBStatus != "ConfigurationAndSWHardeningNeeded" {
		t.Fatalf("the spliced quote: tcbStatus %q, want the declared quote's", d2.TCBStatus)
	}
	checkQuoteSignature(t, c, hc, q, d2)
	for _, status := range []string{splicedStatus, d2.TCBStatus} {
		err := client.VerifyQuoteSignature(root, spliced, status, d2.Signature)
		if !errors.Is(err, client.ErrVerification) || !errors.Is(err, client.ErrQuoteInvalid) {
			t.Fatalf("the SDK with the Coordinator's answer for the spliced quote and status %s: %v, want ErrQuoteInvalid", status, err)
		}
	}
}

// TestGramineAttestation runs the coordinator with the Gramine issuer on a
// fake attestation directory whose files are pipes served by this test,
// acting as the quoting enclave: it reads the report data the coordinator
// writes and answers with a synthetic quote over exactly those bytes.
func TestGramineAttestation(t *testing.T) {
	t.Parallel()
	s := newSGXPlatform(t, "UpToDate", nil)
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte { return s.quote(t, rd) })
	c := startCoordinator(t, "", append(s.env(),
		"QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir)...)
	hc := c.client(nil, nil)
	verifier := &dcap.Verifier{Collateral: collateral.File{Path: s.collateralFile}, RootCA: s.pki.Root}

	// getQuote fetches the quote (with a nonce if given) and checks it: real
	// DCAP verification under the test root, OE-wrapped, bound to
	// SHA-256(root DER ‖ nonce).
	getQuote := func(t *testing.T, nonce []byte) []byte {
		path := "/api/v2/quote"
		if nonce != nil {
			path += "?nonce=" + base64.URLEncoding.EncodeToString(nonce)
		}
		r := do(t, hc, http.MethodGet, c.url(path), nil)
		expect(t, r, http.StatusOK, "success")
		var q struct {
			Cert  string `json:"cert"`
			Quote []byte `json:"quote"`
		}
		decode(t, r, &q)
		if !sgxquote.IsWrapped(q.Quote) {
			t.Fatalf("quote is not OE-wrapped: %d bytes", len(q.Quote))
		}
		_, root, err := client.ParseCertificateChain([]byte(q.Cert))
		if err != nil {
			t.Fatal(err)
		}
		res, err := verifier.Verify(context.Background(), q.Quote)
		if err != nil {
			t.Fatal(err)
		}
		want := sha256.Sum256(append(bytes.Clone(root.Raw), nonce...))
		rd := res.Report.ReportData()
		if !bytes.Equal(rd[:32], want[:]) || !bytes.Equal(rd[32:], make([]byte, 32)) {
			t.Fatalf("report data %x, want SHA-256(root DER ‖ nonce) %x and zeros", rd, want)
		}
		if res.Report.MRENCLAVE() != s.enclave.MRENCLAVE {
			t.Fatal("quote of another enclave")
		}
		return q.Quote
	}

	cached := getQuote(t, nil)
	if again := getQuote(t, nil); !bytes.Equal(cached, again) {
		t.Fatal("the quote without a nonce is not the cached one")
	}
	getQuote(t, []byte("a fresh nonce"))

	t.Run("concurrent nonces", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				getQuote(t, []byte{'n', byte(i)})
			}()
		}
		wg.Wait()
	})

	t.Run("client verifies the Coordinator", func(t *testing.T) {
		era := client.EraConfig{UniqueID: hex.EncodeToString(s.enclave.MRENCLAVE[:])}
		newVerifier := func(era client.EraConfig) *client.DCAPVerifier {
			v, err := client.NewDCAPVerifier(client.DCAPOptions{Expected: era, CollateralFile: s.collateralFile, RootCA: s.pki.Root})
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		att, err := client.VerifyCoordinator(context.Background(), c.addr, client.VerifyOptions{Verifier: newVerifier(era)})
		if err != nil {
			t.Fatal(err)
		}
		if !att.QuoteVerified {
			t.Fatal("quote not verified")
		}
		sdk, err := client.New(c.addr, client.WithRootCertificate(att.Root))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sdk.Status(context.Background()); err != nil {
			t.Fatal(err)
		}
		wrong := era
		wrong.UniqueID = strings.Repeat("ee", 32)
		if _, err := client.VerifyCoordinator(context.Background(), c.addr, client.VerifyOptions{Verifier: newVerifier(wrong)}); !errors.Is(err, client.ErrEnclaveMismatch) {
			t.Fatalf("wrong MRENCLAVE: %v", err)
		}
		strict := era
		strict.AcceptedTCBStatuses = []string{"UpToDate"}
		if _, err := client.VerifyCoordinator(context.Background(), c.addr, client.VerifyOptions{Verifier: newVerifier(strict)}); err != nil {
			t.Fatalf("UpToDate accepted: %v", err)
		}
	})

	t.Run("the Coordinator's own quote through sign-quote", func(t *testing.T) {
		expect(t, setManifest(t, c, hc, []byte(signQuoteManifest)), http.StatusOK, "success")
		q := getQuote(t, []byte("sign me"))
		r, d := postSignQuote(t, c, hc, map[string][]byte{"sgxQuote": q})
		expect(t, r, http.StatusOK, "success")
		if d.TCBStatus != "UpToDate" {
			t.Fatalf("tcbStatus %q", d.TCBStatus)
		}
		checkQuoteSignature(t, c, hc, q, d)
	})

	// Restart: the cached quote is issued again at start, for the same root.
	c.restart()
	getQuote(t, nil)

	if errs := dev.Errors(); len(errs) > 0 {
		t.Fatalf("the fake quoting enclave saw bad exchanges: %v", errs)
	}
	// Startup (twice), the repeated and nonce requests: every exchange the
	// device served was a full 64-byte report data write.
	if n := len(dev.Served()); n < 10 {
		t.Fatalf("device served %d quotes", n)
	}
}

// TestGramineAttestationRequiresDCAP: explicit gramine attestation refuses to
// start when Gramine's attestation type is not dcap; so does auto, which
// would run in simulation with the data key in clear inside the enclave
// (gramine_sealing_test.go), unless the insecure override is set: then
// it runs in simulation.
func TestGramineAttestationRequiresDCAP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "attestation_type"), []byte("epid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := runCoordinatorOnce(t, "QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+dir)
	if code == 0 || !strings.Contains(out, `attestation type is \"epid\"`) {
		t.Fatalf("exit %d, log:\n%s", code, out)
	}
	code, out = runCoordinatorOnce(t, "QUARRY_ATTESTATION=auto", "QUARRY_GRAMINE_ATTESTATION_DIR="+dir)
	if code != 1 || !strings.Contains(out, `attestation type is \"epid\", not dcap`) {
		t.Fatalf("auto with epid: exit %d, log:\n%s", code, out)
	}
	c := startCoordinator(t, "", "QUARRY_ATTESTATION=auto", "QUARRY_GRAMINE_ATTESTATION_DIR="+dir, "QUARRY_INSECURE_SIMULATED_SEALING=1")
	hc := c.client(nil, nil)
	getChain(t, c, hc) // quote null: simulation
}

// runCoordinatorOnce runs the binary until it exits (within 20 s) and
// returns its exit code and log.
func runCoordinatorOnce(t *testing.T, env ...string) (int, string) {
	t.Helper()
	return runCoordinatorBounded(t, 20*time.Second, env...)
}
