package core

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/seal"
)

const signQuoteManifest = `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}},"Config":{"FeatureGates":["signquoteendpoint"]}}`

// providerFunc adapts a function to collateral.Provider.
type providerFunc func() (*collateral.Collateral, error)

func (f providerFunc) Get(context.Context, [6]byte, collateral.CA) (*collateral.Collateral, error) {
	return f()
}

func newSignQuoteCore(t *testing.T, v QuoteVerifier, manifestJSON string) *Core {
	t.Helper()
	s := newStores()
	c, err := New(context.Background(), Options{Data: s.data, Key: s.key, KeySealer: seal.SimulationKeySealer{}, QuoteVerifier: v})
	if err != nil {
		t.Fatal(err)
	}
	if manifestJSON != "" {
		if _, err := c.SetManifest(context.Background(), []byte(manifestJSON)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func TestSignQuote(t *testing.T) {
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	now := func() time.Time { return p.Time }
	verifierFor := func(o dcaptest.CollateralOptions) *dcap.Verifier {
		return &dcap.Verifier{Collateral: collateral.Static{Collateral: pl.Collateral(t, o)}, RootCA: p.Root, Now: now}
	}
	upToDate := verifierFor(dcaptest.CollateralOptions{})
	quote := pl.Quote(t, dcaptest.QuoteOptions{})
	ctx := context.Background()

	t.Run("signed raw and wrapped", func(t *testing.T) {
		c := newSignQuoteCore(t, upToDate, signQuoteManifest)
		for _, q := range [][]byte{quote, sgxquote.Wrap(quote)} {
			res, err := c.SignQuote(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if res.TCBStatus != "UpToDate" {
				t.Fatalf("status %q", res.TCBStatus)
			}
			checkSignature(t, c, q, res)
		}
	})
	t.Run("only the declared quote is verified and signed", func(t *testing.T) {
		c := newSignQuoteCore(t, upToDate, signQuoteManifest)
		wrapped := sgxquote.Wrap(quote)
		for name, tc := range map[string]struct{ submitted, declared []byte }{
			"raw with bytes after it":                 {append(bytes.Clone(quote), "ConfigurationAnd"...), quote},
			"raw with zeros after it":                 {append(bytes.Clone(quote), make([]byte, 64)...), quote},
			"OE-wrapped with bytes after it":          {append(bytes.Clone(wrapped), 1, 2, 3), wrapped},
			"OE-wrapped, the OE length over the junk": {sgxquote.Wrap(append(bytes.Clone(quote), 9, 9)), wrapped},
		} {
			res, err := c.SignQuote(ctx, tc.submitted)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !bytes.Equal(res.Quote, tc.declared) {
				t.Fatalf("%s: signed %d bytes, want the declared %d", name, len(res.Quote), len(tc.declared))
			}
			checkSignature(t, c, tc.declared, res)
			pub := c.snap.Load().ca.Root.PublicKey.(*ecdsa.PublicKey)
			sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(tc.submitted) + res.TCBStatus))
			if ecdsa.VerifyASN1(pub, sum[:], res.Signature) {
				t.Fatalf("%s: the signature covers the bytes after the quote", name)
			}
		}
		// A tampered quote with bytes after it is still refused.
		if _, err := c.SignQuote(ctx, append(flip(quote, 200), 1)); err == nil {
			t.Fatal("a tampered quote with a byte after it was signed")
		}
	})
	t.Run("non-UpToDate status is signed", func(t *testing.T) {
		v := verifierFor(dcaptest.CollateralOptions{TCBLevels: []dcaptest.TCBLevel{{
			CompSVN: pl.Ext.CompSVN, PCESVN: pl.Ext.PCESVN, Status: "OutOfDate", Advisories: []string{"INTEL-SA-00001"},
		}}})
		c := newSignQuoteCore(t, v, signQuoteManifest)
		res, err := c.SignQuote(ctx, quote)
		if err != nil {
			t.Fatal(err)
		}
		if res.TCBStatus != "OutOfDate" {
			t.Fatalf("status %q", res.TCBStatus)
		}
		checkSignature(t, c, quote, res)
	})

	for _, tc := range []struct {
		name     string
		v        QuoteVerifier
		manifest string
		quote    []byte
		class    error
		verify   bool // a *QuoteVerificationError
		msg      string
	}{
		{"no manifest", upToDate, "", quote, ErrForbidden, false, "SignQuoteEndpoint feature is not enabled in the manifest"},
		{"feature off", upToDate, minimalManifest, quote, ErrForbidden, false, "SignQuoteEndpoint feature is not enabled in the manifest"},
		{"no collateral source", nil, signQuoteManifest, quote, ErrForbidden, false, "--collateral-file"},
		{"empty quote", upToDate, signQuoteManifest, nil, ErrInvalidRequest, true, "quote verification failed: the quote is empty"},
		{"tampered quote", upToDate, signQuoteManifest, flip(quote, 200), ErrInvalidRequest, true, "quote verification failed: dcap: ISV enclave report signature"},
		{"truncated quote", upToDate, signQuoteManifest, quote[:100], ErrInvalidRequest, true, "quote verification failed: dcap: parse quote"},
		{"expired collateral", verifierFor(dcaptest.CollateralOptions{IssueDate: p.Time.Add(-60 * 24 * time.Hour), NextUpdate: p.Time.Add(-24 * time.Hour)}),
			signQuoteManifest, quote, ErrInvalidRequest, true, "collateral expired"},
		{"wrong root", &dcap.Verifier{Collateral: upToDate.Collateral, RootCA: dcaptest.NewPKI(t).Root, Now: now},
			signQuoteManifest, quote, ErrInvalidRequest, true, "untrusted root CA"},
		{"no collateral for the platform", &dcap.Verifier{Collateral: collateral.Static{}, RootCA: p.Root, Now: now},
			signQuoteManifest, quote, ErrInvalidRequest, true, "collateral unavailable"},
		{"collateral source down", &dcap.Verifier{Collateral: providerFunc(func() (*collateral.Collateral, error) {
			return nil, errors.New("connection refused")
		}), RootCA: p.Root, Now: now}, signQuoteManifest, quote, nil, false, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newSignQuoteCore(t, tc.v, tc.manifest)
			_, err := c.SignQuote(ctx, tc.quote)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.msg)
			}
			for _, class := range []error{ErrForbidden, ErrInvalidRequest} {
				if errors.Is(err, class) != (class == tc.class) {
					t.Errorf("errors.Is(%v, %v) = %v", err, class, !(class == tc.class))
				}
			}
			var qe *QuoteVerificationError
			if errors.As(err, &qe) != tc.verify {
				t.Errorf("QuoteVerificationError: %v, want %v", !tc.verify, tc.verify)
			}
		})
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 1
	return c
}

// checkSignature verifies the sign-quote signature with the root
// certificate: SHA-256(base64std(quote as submitted) ‖ status).
func checkSignature(t *testing.T, c *Core, quote []byte, res SignQuoteResult) {
	t.Helper()
	pub := c.snap.Load().ca.Root.PublicKey.(*ecdsa.PublicKey)
	sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(quote) + res.TCBStatus))
	if !ecdsa.VerifyASN1(pub, sum[:], res.Signature) {
		t.Fatal("signature does not verify with the root certificate")
	}
}
