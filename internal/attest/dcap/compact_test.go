package dcap_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// padding is what a sender can add to a quote's PCK certificate chain
// without breaking a signature: NULs after it, whitespace between and in
// its PEM blocks.
func paddedChains(pl *dcaptest.Platform, nuls int) map[string][]byte {
	chain := pl.ChainPEM()
	pem := chain[:len(chain)-1]
	end := []byte("-----END CERTIFICATE-----\n")
	spaced := bytes.ReplaceAll(pem, end, append(bytes.Clone(end), bytes.Repeat([]byte(" \t\r\n"), 1000)...))
	return map[string][]byte{
		"NULs":                   append(bytes.Clone(chain), make([]byte, nuls)...),
		"whitespace in the PEM":  append(spaced, 0),
		"CRLF and no terminator": bytes.ReplaceAll(pem, []byte("\n"), []byte("\r\n")),
	}
}

// TestCompactSGX: a genuine quote whose chain a sender padded still
// verifies (no signature covers the padding), and Compact gives back the
// quote as DCAP made it, which verifies the same; a quote as DCAP makes
// it is left as it is.
func TestCompactSGX(t *testing.T) {
	pl := newPlatform(t)
	v := verifier(pl, pl.Collateral(t, dcaptest.CollateralOptions{}))
	for _, version := range []uint16{3, 4, 5} {
		enclave := dcaptest.Enclave{ISVProdID: 3}
		genuine := pl.Quote(t, dcaptest.QuoteOptions{Version: version, Enclave: enclave})
		q, err := sgxquote.Parse(genuine)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(q.Compact(), genuine) {
			t.Errorf("v%d: Compact changed a quote as DCAP makes it", version)
		}
		for name, cd := range paddedChains(pl, 250<<10) {
			padded := pl.Quote(t, dcaptest.QuoteOptions{Version: version, Enclave: enclave, CertData: cd})
			res, err := v.Verify(context.Background(), padded)
			if err != nil {
				t.Fatalf("v%d %s: the padded quote does not verify: %v", version, name, err)
			}
			pq, err := sgxquote.Parse(padded)
			if err != nil {
				t.Fatal(err)
			}
			c := pq.Compact()
			if len(c) > len(genuine) {
				t.Errorf("v%d %s: %d bytes after Compact, the quote as DCAP makes it has %d", version, name, len(c), len(genuine))
			}
			cq, err := sgxquote.Parse(c)
			if err != nil {
				t.Fatalf("v%d %s: the compact quote does not parse: %v", version, name, err)
			}
			if cq.Body != pq.Body || !bytes.Equal(cq.SignedData(), pq.SignedData()) {
				t.Errorf("v%d %s: Compact changed the signed part", version, name)
			}
			cres, err := v.Verify(context.Background(), c)
			if err != nil {
				t.Fatalf("v%d %s: the compact quote does not verify: %v", version, name, err)
			}
			if cres.Report != res.Report || cres.Status != res.Status {
				t.Errorf("v%d %s: the compact quote verifies to another result", version, name)
			}
		}
	}
}

func TestCompactTDX(t *testing.T) {
	pl := newPlatform(t)
	v := verifier(pl, pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{}))
	for _, version := range []uint16{4, 5} {
		genuine := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: version})
		q, err := tdxquote.Parse(genuine)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(q.Compact(), genuine) {
			t.Errorf("v%d: Compact changed a quote as DCAP makes it", version)
		}
		// Padding after the quote's end (configfs-tsm's buffer) goes too.
		tail, err := tdxquote.Parse(append(bytes.Clone(genuine), make([]byte, 4096)...))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tail.Compact(), genuine) {
			t.Errorf("v%d: Compact kept the padding after the quote", version)
		}
		for name, cd := range paddedChains(pl, 40<<10) { // TDX quotes have at most 64 KiB
			padded := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: version, CertData: cd})
			res, err := v.Verify(context.Background(), padded)
			if err != nil {
				t.Fatalf("v%d %s: the padded quote does not verify: %v", version, name, err)
			}
			pq, err := tdxquote.Parse(padded)
			if err != nil {
				t.Fatal(err)
			}
			c := pq.Compact()
			if len(c) > len(genuine) {
				t.Errorf("v%d %s: %d bytes after Compact, the quote as DCAP makes it has %d", version, name, len(c), len(genuine))
			}
			cres, err := v.Verify(context.Background(), c)
			if err != nil {
				t.Fatalf("v%d %s: the compact quote does not verify: %v", version, name, err)
			}
			if cres.TDX.Report != res.TDX.Report {
				t.Errorf("v%d %s: the compact quote verifies to another result", version, name)
			}
		}
	}
}
