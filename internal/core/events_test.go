package core

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// TestEventsKeepCompactQuotes: a Marble whose genuine quote carries
// 250 KiB of NULs in its certificate data (no signature covers them) is
// activated, but its event keeps the quote without them: the quote as
// DCAP made it, which verifies the same. In an Open Enclave header the
// quote stays wrapped. A TDX quote loses its padding too.
func TestEventsKeepCompactQuotes(t *testing.T) {
	admin := newFaultUser(t, "admin")
	m := newMarbleClient(t)
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	sum := sha256.Sum256(m.cert.Raw)
	var rd [64]byte
	copy(rd[:], sum[:])
	signer, _ := hex.DecodeString(actSignerID)
	enclave := dcaptest.Enclave{ISVProdID: 3, ISVSVN: 2, ReportData: rd}
	copy(enclave.MRSIGNER[:], signer)
	var mrtd, rtmr [48]byte
	mrtd[0], rtmr[0] = 0x5a, 0x1e
	td := tdxquote.TDReport{MRTD: mrtd, ReportData: rd}
	td.RTMR[1], td.RTMR[2] = rtmr, rtmr
	td.TDAttributes[3] = 0x10
	padded := append(pl.ChainPEM(), make([]byte, 250<<10)...)
	genuineSGX := pl.Quote(t, dcaptest.QuoteOptions{Version: 4, Enclave: enclave})
	paddedSGX := pl.Quote(t, dcaptest.QuoteOptions{Version: 4, Enclave: enclave, CertData: padded})
	tdPadded := append(pl.ChainPEM(), make([]byte, 30<<10)...) // TDX quotes have at most 64 KiB
	genuineTDX := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Body: td})
	paddedTDX := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Body: td, CertData: tdPadded})

	doc := map[string]any{
		"Packages": map[string]any{
			"pkg": map[string]any{"SignerID": actSignerID, "ProductID": 3, "SecurityVersion": 2},
			"td": map[string]any{"MRTD": hex.EncodeToString(mrtd[:]), "RTMR1": hex.EncodeToString(rtmr[:]), "RTMR2": hex.EncodeToString(rtmr[:]),
				"TDAttributes": "0000001000000000"},
		},
		"Marbles": map[string]any{"backend": map[string]any{"Package": "pkg"}, "vm": map[string]any{"Package": "td"}},
		"Users":   map[string]any{"admin": map[string]any{"Certificate": admin.pem}},
	}
	mf, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	v := &dcap.Verifier{
		Collateral: kindProvider{pl.Collateral(t, dcaptest.CollateralOptions{}), pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{})},
		RootCA:     pl.PKI.Root, Now: func() time.Time { return pl.PKI.Time },
	}
	c := newActivationCore(t, newStores(), Options{Issuer: fakeIssuer{}, QuoteVerifier: v})
	if _, err := c.SetManifest(context.Background(), mf); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		marble     string
		sent, want []byte
	}{
		{"backend", paddedSGX, genuineSGX},
		{"backend", sgxquote.Wrap(paddedSGX), sgxquote.Wrap(genuineSGX)},
		{"backend", genuineSGX, genuineSGX},
		{"vm", paddedTDX, genuineTDX},
	} {
		if _, err := c.Activate(context.Background(), m.request(tc.marble, uuidA, tc.sent)); err != nil {
			t.Fatalf("the padded quote was refused: %v", err)
		}
		events, _ := c.ActivationEvents()
		got := events[len(events)-1].Quote
		// The quotes differ in their attestation keys (each quote of the
		// test platform has its own), not in their lengths.
		if len(got) != len(tc.want) {
			t.Errorf("%s: the event keeps %d bytes of a %d-byte quote, want the %d bytes DCAP makes", tc.marble, len(got), len(tc.sent), len(tc.want))
		}
		signed, sig, chain := parts(t, got)
		sentSigned, sentSig, _ := parts(t, tc.sent)
		if !bytes.Equal(signed, sentSigned) || !bytes.Equal(sig, sentSig) || !bytes.Equal(chain, pl.ChainPEM()) {
			t.Errorf("%s: the kept quote is not the sent one without the padding", tc.marble)
		}
		if _, err := v.Verify(context.Background(), got); err != nil {
			t.Errorf("%s: the kept quote does not verify: %v", tc.marble, err)
		}
	}
}

// parts returns a quote's signed part, signature and certification data.
func parts(t *testing.T, b []byte) (signed, sig, certData []byte) {
	t.Helper()
	if tdxquote.IsTDX(b) {
		q, err := tdxquote.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		return q.SignedData(), q.Signature[:], q.CertData
	}
	q, err := sgxquote.ParseAny(b)
	if err != nil {
		t.Fatal(err)
	}
	return q.SignedData(), q.Signature[:], q.CertData
}
