package client_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

// signQuote signs a sign-quote result as the Coordinator does: the root key
// over SHA-256(base64(quote) ‖ status).
func signQuote(t *testing.T, p *pki, quote []byte, status string) []byte {
	t.Helper()
	sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(quote) + status))
	sig, err := ecdsa.SignASN1(rand.Reader, p.rootKey, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// splice is the quote and status that the signature of (quote,
// ConfigurationAndSWHardeningNeeded) also covers: "ConfigurationAnd" is
// base64 for 12 bytes, so when base64(quote) has no padding, base64(quote ‖
// those bytes) ‖ "SWHardeningNeeded" is the same signed text.
func splice(t *testing.T, quote []byte) ([]byte, string) {
	t.Helper()
	if len(quote)%3 != 0 {
		t.Fatalf("a quote of %d bytes has base64 padding; the splice needs a multiple of 3", len(quote))
	}
	extra, err := base64.StdEncoding.DecodeString("ConfigurationAnd")
	if err != nil || len(extra) != 12 {
		t.Fatalf("decoding the status prefix: %v", err)
	}
	spliced := append(bytes.Clone(quote), extra...)
	const status = "SWHardeningNeeded"
	if base64.StdEncoding.EncodeToString(spliced)+status != base64.StdEncoding.EncodeToString(quote)+"ConfigurationAndSWHardeningNeeded" {
		t.Fatal("the splice does not give the same signed text")
	}
	return spliced, status
}

// sgxQuoteLen3 returns a synthetic SGX quote (raw, or OE-wrapped if wrap)
// whose length is a multiple of 3, by choosing the length of the QE
// authentication data.
func sgxQuoteLen3(t *testing.T, pl *dcaptest.Platform, wrap bool) []byte {
	t.Helper()
	for n := 32; n < 35; n++ {
		q := pl.Quote(t, dcaptest.QuoteOptions{AuthData: make([]byte, n)})
		if wrap {
			q = sgxquote.Wrap(q)
		}
		if len(q)%3 == 0 {
			return q
		}
	}
	t.Fatal("no QE authentication data length gives a quote length that is a multiple of 3")
	return nil
}

// TestVerifyQuoteSignatureSplice: a genuine sign-quote signature for status
// ConfigurationAndSWHardeningNeeded verifies; the same signature for the quote
// with the 12 bytes of "ConfigurationAnd" appended and status
// SWHardeningNeeded (the same signed text) is refused, for raw and
// OE-wrapped SGX quotes and a zero-padded TDX quote.
func TestVerifyQuoteSignatureSplice(t *testing.T) {
	p := newPKI(t)
	s := newSGXSetup(t, "UpToDate")
	tdx := s.pl.TDXQuote(t, dcaptest.TDXQuoteOptions{})
	// Real TDX quotes carry zero padding after their declared end; the
	// Coordinator signs the quote as submitted, padding included.
	tdx = append(tdx, make([]byte, 60+(3-len(tdx)%3)%3)...)
	for name, quote := range map[string][]byte{
		"SGX raw":        sgxQuoteLen3(t, s.pl, false),
		"SGX OE-wrapped": sgxQuoteLen3(t, s.pl, true),
		"TDX padded":     tdx,
	} {
		t.Run(name, func(t *testing.T) {
			sig := signQuote(t, p, quote, "ConfigurationAndSWHardeningNeeded")
			if err := client.VerifyQuoteSignature(p.root, quote, "ConfigurationAndSWHardeningNeeded", sig); err != nil {
				t.Fatalf("the genuine signature: %v", err)
			}
			spliced, status := splice(t, quote)
			err := client.VerifyQuoteSignature(p.root, spliced, status, sig)
			if !errors.Is(err, client.ErrVerification) || !errors.Is(err, client.ErrQuoteInvalid) {
				t.Fatalf("the spliced quote with status %s: %v, want ErrVerification and ErrQuoteInvalid", status, err)
			}
			// The genuine quote with another status does not verify either.
			if err := client.VerifyQuoteSignature(p.root, quote, "UpToDate", sig); !errors.Is(err, client.ErrVerification) {
				t.Fatalf("another status: %v", err)
			}
		})
	}
}

// TestVerifyQuoteSignatureStrict: quotes that are not exactly one
// well-formed quote, and statuses that are not Intel's names, are refused
// even with a signature that matches them.
func TestVerifyQuoteSignatureStrict(t *testing.T) {
	p := newPKI(t)
	s := newSGXSetup(t, "UpToDate")
	raw := s.pl.Quote(t, dcaptest.QuoteOptions{})
	wrapped := sgxquote.Wrap(raw)
	tdx := s.pl.TDXQuote(t, dcaptest.TDXQuoteOptions{})
	badOE := bytes.Clone(wrapped)
	binary.LittleEndian.PutUint64(badOE[8:], uint64(len(raw)-1))
	for name, quote := range map[string][]byte{
		"SGX with a zero byte appended":      append(bytes.Clone(raw), 0),
		"SGX with bytes appended":            append(bytes.Clone(raw), "trailing"...),
		"OE-wrapped with a byte appended":    append(bytes.Clone(wrapped), 0),
		"OE header length not the quote's":   badOE,
		"SGX truncated":                      raw[:len(raw)-1],
		"TDX with a non-zero byte after it":  append(bytes.Clone(tdx), 0, 0, 1),
		"TDX truncated":                      tdx[:len(tdx)-1],
		"not a quote":                        {1, 2, 3, 250},
		"empty":                              nil,
		"two quotes":                         append(bytes.Clone(raw), raw...),
		"SGX header only":                    raw[:sgxquote.HeaderSize],
		"OE header only":                     wrapped[:sgxquote.OEHeaderSize],
		"TDX with an SGX quote appended":     append(bytes.Clone(tdx), raw...),
		"OE-wrapped SGX with a TDX after it": append(bytes.Clone(wrapped), tdx...),
	} {
		sig := signQuote(t, p, quote, "UpToDate")
		err := client.VerifyQuoteSignature(p.root, quote, "UpToDate", sig)
		if !errors.Is(err, client.ErrVerification) || !errors.Is(err, client.ErrQuoteInvalid) {
			t.Errorf("%s: %v, want ErrVerification and ErrQuoteInvalid", name, err)
		}
	}
	// Well-formed quotes with a matching signature verify.
	for name, quote := range map[string][]byte{"SGX raw": raw, "OE-wrapped": wrapped, "TDX": tdx, "TDX zero-padded": append(bytes.Clone(tdx), 0, 0, 0)} {
		if err := client.VerifyQuoteSignature(p.root, quote, "SWHardeningNeeded", signQuote(t, p, quote, "SWHardeningNeeded")); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The status must be exactly one of Intel's names.
	for _, status := range []string{"", "Unknown", "uptodate", "UpToDate ", "AAAAUpToDate", "Fine"} {
		if err := client.VerifyQuoteSignature(p.root, raw, status, signQuote(t, p, raw, status)); !errors.Is(err, client.ErrVerification) {
			t.Errorf("status %q: %v, want ErrVerification", status, err)
		}
	}
	for _, status := range []string{"UpToDate", "OutOfDate", "Revoked", "ConfigurationNeeded", "OutOfDateConfigurationNeeded",
		"SWHardeningNeeded", "ConfigurationAndSWHardeningNeeded", "TDRelaunchAdvised", "TDRelaunchAdvisedConfigurationNeeded"} {
		if err := client.VerifyQuoteSignature(p.root, tdx, status, signQuote(t, p, tdx, status)); err != nil {
			t.Errorf("status %s: %v", status, err)
		}
	}
	// Another root's signature.
	if err := client.VerifyQuoteSignature(newPKI(t).root, raw, "UpToDate", signQuote(t, p, raw, "UpToDate")); !errors.Is(err, client.ErrVerification) {
		t.Fatalf("another root: %v", err)
	}
}

// TestVerifyQuoteSignatureDeclared: the Coordinator signs only the declared
// quote. A zero-padded TDX quote verifies with a signature over the quote
// without its padding (and, from Coordinators that signed as submitted,
// over the padded one); a quote with other bytes after its end is refused
// whichever of the two the signature covers, and verifies as DeclaredQuote
// cuts it.
func TestVerifyQuoteSignatureDeclared(t *testing.T) {
	p := newPKI(t)
	s := newSGXSetup(t, "UpToDate")
	tdx := s.pl.TDXQuote(t, dcaptest.TDXQuoteOptions{})
	padded := append(bytes.Clone(tdx), make([]byte, 70)...)
	const status = "SWHardeningNeeded"
	if err := client.VerifyQuoteSignature(p.root, padded, status, signQuote(t, p, tdx, status)); err != nil {
		t.Fatalf("padded TDX quote, signature over the declared quote: %v", err)
	}
	if err := client.VerifyQuoteSignature(p.root, padded, status, signQuote(t, p, padded, status)); err != nil {
		t.Fatalf("padded TDX quote, signature over it as submitted: %v", err)
	}
	if err := client.VerifyQuoteSignature(p.root, padded, "UpToDate", signQuote(t, p, tdx, status)); !errors.Is(err, client.ErrVerification) {
		t.Fatalf("another status: %v", err)
	}

	raw := s.pl.Quote(t, dcaptest.QuoteOptions{})
	for name, trailing := range map[string][]byte{
		"SGX with bytes appended":      append(bytes.Clone(raw), "trailing"...),
		"OE-wrapped with a byte after": append(sgxquote.Wrap(raw), 0),
		"TDX with a non-zero byte":     append(bytes.Clone(padded), 1),
	} {
		declared, err := client.DeclaredQuote(trailing)
		if err != nil {
			t.Fatalf("%s: DeclaredQuote: %v", name, err)
		}
		for what, signed := range map[string][]byte{"the declared quote": declared, "the quote as submitted": trailing} {
			err := client.VerifyQuoteSignature(p.root, trailing, status, signQuote(t, p, signed, status))
			if !errors.Is(err, client.ErrQuoteInvalid) || !strings.Contains(err.Error(), "DeclaredQuote") {
				t.Errorf("%s, signature over %s: %v, want ErrQuoteInvalid naming DeclaredQuote", name, what, err)
			}
		}
		if err := client.VerifyQuoteSignature(p.root, declared, status, signQuote(t, p, declared, status)); err != nil {
			t.Errorf("%s: the declared quote: %v", name, err)
		}
	}
	if _, err := client.DeclaredQuote(raw[:100]); !errors.Is(err, client.ErrQuoteInvalid) {
		t.Errorf("a truncated quote: %v", err)
	}

}
