package core

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// kindProvider serves SGX collateral to Get and TDX collateral to GetTDX.
type kindProvider struct{ sgx, tdx *collateral.Collateral }

func (p kindProvider) Get(context.Context, [6]byte, collateral.CA) (*collateral.Collateral, error) {
	return p.sgx, nil
}

func (p kindProvider) GetTDX(context.Context, [6]byte, collateral.CA) (*collateral.Collateral, error) {
	return p.tdx, nil
}

// TestActivateTDX runs activations through the real DCAP verifier over a
// synthetic Intel-like PKI: a TDX Marble with a TDX quote bound to its TLS
// certificate is accepted; a wrong MRTD or RTMR, a disallowed TCB status,
// an SGX quote for the TDX package and a TDX quote for the SGX package are
// refused. Bytes after a quote's declared end are ignored.
func TestActivateTDX(t *testing.T) {
	admin := newFaultUser(t, "admin")
	m := newMarbleClient(t)
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	var mrtd, rtmr1, rtmr2 [48]byte
	for i := range mrtd {
		mrtd[i], rtmr1[i], rtmr2[i] = 0x5a, 0x1e, 0x3c
	}
	sum := sha256.Sum256(m.cert.Raw)
	tdQuote := func(f func(*tdxquote.TDReport)) []byte {
		var body tdxquote.TDReport
		body.MRTD, body.RTMR[1], body.RTMR[2] = mrtd, rtmr1, rtmr2
		body.TDAttributes[3] = 0x10 // SEPT_VE_DISABLE
		copy(body.ReportData[:], sum[:])
		if f != nil {
			f(&body)
		}
		return pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15, Body: body})
	}
	var sgxRD [64]byte
	copy(sgxRD[:], sum[:])
	signer, _ := hex.DecodeString(actSignerID)
	enclave := dcaptest.Enclave{ISVProdID: 3, ISVSVN: 2, ReportData: sgxRD}
	copy(enclave.MRSIGNER[:], signer)
	sgxQuote := pl.Quote(t, dcaptest.QuoteOptions{Enclave: enclave})

	doc := map[string]any{
		"Packages": map[string]any{
			"pkg": map[string]any{"SignerID": actSignerID, "ProductID": 3, "SecurityVersion": 2},
			"td": map[string]any{
				"MRTD": hex.EncodeToString(mrtd[:]), "RTMR1": hex.EncodeToString(rtmr1[:]), "RTMR2": strings.ToUpper(hex.EncodeToString(rtmr2[:])),
				"TDAttributes": "0000001000000000",
			},
		},
		"Marbles": map[string]any{"backend": map[string]any{"Package": "pkg"}, "vm": map[string]any{"Package": "td"}},
		"Users":   map[string]any{"admin": map[string]any{"Certificate": admin.pem}},
	}
	mf, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	upToDate := kindProvider{pl.Collateral(t, dcaptest.CollateralOptions{}), pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{})}
	outOfDate := kindProvider{upToDate.sgx, pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{
		Modules: []dcaptest.TDXModuleIdentity{{ID: "TDX_01", Levels: []dcaptest.QELevel{{ISVSVN: 7, Status: "UpToDate"}, {ISVSVN: 1, Status: "OutOfDate"}}}},
	})}
	for _, tc := range []struct {
		name, marble string
		src          kindProvider
		quote        []byte
		want         string // "" = accepted
	}{
		{"TDX Marble accepted", "vm", upToDate, tdQuote(nil), ""},
		{"SGX Marble still accepted", "backend", upToDate, sgxQuote, ""},
		// Bytes after the declared quote are ignored, as by Intel's library.
		{"TDX quote with zero padding", "vm", upToDate, append(tdQuote(nil), make([]byte, 70)...), ""},
		{"TDX quote with other bytes after it", "vm", upToDate, append(tdQuote(nil), "trailing"...), ""},
		{"SGX quote with bytes after it", "backend", upToDate, append(bytes.Clone(sgxQuote), 0, 1, 2), ""},
		{"SGX quote with bytes after it, tampered inside", "backend", upToDate, append(flip(sgxQuote, 200), 0, 1, 2), "signature"},
		{"wrong MRTD", "vm", upToDate, tdQuote(func(b *tdxquote.TDReport) { b.MRTD[47] ^= 1 }), "MRTD"},
		{"wrong RTMR2", "vm", upToDate, tdQuote(func(b *tdxquote.TDReport) { b.RTMR[2][0] ^= 1 }), "RTMR"},
		{"not bound to the certificate", "vm", upToDate, tdQuote(func(b *tdxquote.TDReport) { b.ReportData[0] ^= 1 }), "not bound to the TLS client certificate"},
		{"debug TD", "vm", upToDate, tdQuote(func(b *tdxquote.TDReport) { b.TDAttributes[0] |= 1 }), "debug"},
		{"TD under debug (TDATTRIBUTES bit 6)", "vm", upToDate, tdQuote(func(b *tdxquote.TDReport) { b.TDAttributes[0] |= 1 << 6 }), "debug"},
		{"wrong RTMR1", "vm", upToDate, tdQuote(func(b *tdxquote.TDReport) { b.RTMR[1][5] ^= 1 }), "RTMR1"},
		{"SEPT_VE_DISABLE clear", "vm", upToDate, tdQuote(func(b *tdxquote.TDReport) { b.TDAttributes[3] = 0 }), "TD attributes"},
		{"OutOfDate module refused", "vm", outOfDate, tdQuote(nil), "TCB status not accepted: OutOfDate"},
		{"SGX quote for the TDX package", "vm", upToDate, sgxQuote, "an SGX quote for a TDX package"},
		{"TDX quote for the SGX package", "backend", upToDate, tdQuote(nil), "a TDX quote for an SGX package"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &dcap.Verifier{Collateral: tc.src, RootCA: pl.PKI.Root, Now: func() time.Time { return pl.PKI.Time }}
			c := newActivationCore(t, newStores(), Options{Issuer: fakeIssuer{}, QuoteVerifier: v})
			if _, err := c.SetManifest(context.Background(), mf); err != nil {
				t.Fatal(err)
			}
			_, err := c.Activate(context.Background(), m.request(tc.marble, uuidA, tc.quote))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ae *ActivationError
			if !errors.As(err, &ae) || ae.Reason != RefusedQuote || !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a quote refusal mentioning %q", err, tc.want)
			}
		})
	}
}
