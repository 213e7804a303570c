//go:build unix

package integration

import (
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
	"github.com/quarry-cc/quarry/internal/attest/tsm/tsmtest"
	"github.com/quarry-cc/quarry/manifest"
)

// TestTDXAttestation starts a Coordinator whose quotes come from a fake
// configfs-tsm report directory (the test plays the kernel and the TD
// quoting enclave of a synthetic Intel-like PKI): its quote is a TDX quote,
// the SDK verifies it against the expected TD measurements and refuses
// other ones, and sign-quote accepts it.
func TestTDXAttestation(t *testing.T) {
	t.Parallel()
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	from, until := collateralWindow()
	col := pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{IssueDate: from, NextUpdate: until})
	dir := t.TempDir()
	colFile, rootFile := filepath.Join(dir, "collateral.json"), filepath.Join(dir, "root.pem")
	if err := os.WriteFile(colFile, dcaptest.QVLJSON(t, col), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rootFile, dcaptest.PEM(p.Root), 0o600); err != nil {
		t.Fatal(err)
	}
	var body tdxquote.TDReport
	copy(body.MRTD[:], "integration coordinator TD measurement.........")
	copy(body.RTMR[1][:], "integration coordinator kernel measurement.....")
	copy(body.RTMR[2][:], "integration coordinator initrd measurement.....")
	kernel := tsmtest.New(t, func(rd [64]byte) []byte {
		b := body
		b.ReportData = rd
		return pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15, Body: b})
	})
	c := startCoordinator(t, "", "QUARRY_COLLATERAL_FILE="+colFile, "QUARRY_SGX_ROOT_CA="+rootFile,
		"QUARRY_ATTESTATION=tdx", "QUARRY_TSM_REPORT_DIR="+kernel.Dir)
	hc := c.client(nil, nil)

	verifier := func(era client.EraConfig) *client.DCAPVerifier {
		v, err := client.NewDCAPVerifier(client.DCAPOptions{Expected: era, CollateralFile: colFile, RootCA: p.Root})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	era := client.EraConfig{TDXMeasurements: manifest.TDXMeasurements{
		MRTD: hex.EncodeToString(body.MRTD[:]), RTMR1: strings.ToUpper(hex.EncodeToString(body.RTMR[1][:])),
		RTMR2: hex.EncodeToString(body.RTMR[2][:]),
	}}
	att, err := client.VerifyCoordinator(context.Background(), c.addr, client.VerifyOptions{Verifier: verifier(era)})
	if err != nil {
		t.Fatalf("VerifyCoordinator: %v", err)
	}
	if !att.QuoteVerified || !tdxquote.IsTDX(att.Quote) {
		t.Fatalf("quote verified %v, TDX %v", att.QuoteVerified, tdxquote.IsTDX(att.Quote))
	}
	for name, bad := range map[string]client.EraConfig{
		"wrong MRTD":  {TDXMeasurements: manifest.TDXMeasurements{MRTD: strings.Repeat("ee", 48), RTMR1: era.RTMR1, RTMR2: era.RTMR2}},
		"wrong RTMR1": {TDXMeasurements: manifest.TDXMeasurements{MRTD: era.MRTD, RTMR1: strings.Repeat("ee", 48), RTMR2: era.RTMR2}},
		"wrong RTMR2": {TDXMeasurements: manifest.TDXMeasurements{MRTD: era.MRTD, RTMR1: era.RTMR1, RTMR2: strings.Repeat("ee", 48)}},
		"wrong MRTD, RTMR1 and RTMR2 not required": {
			TDXMeasurements: manifest.TDXMeasurements{MRTD: strings.Repeat("ee", 48)}, InsecureAllowUnsetRTMR1RTMR2: true,
		},
		"SGX era": {UniqueID: strings.Repeat("ee", 32)},
	} {
		if _, err := client.VerifyCoordinator(context.Background(), c.addr, client.VerifyOptions{Verifier: verifier(bad)}); !errors.Is(err, client.ErrEnclaveMismatch) {
			t.Errorf("%s: %v", name, err)
		}
	}

	// sign-quote accepts the Coordinator's TDX quote.
	expect(t, setManifest(t, c, hc, []byte(signQuoteManifest)), http.StatusOK, "success")
	r, d := postSignQuote(t, c, hc, map[string][]byte{"sgxQuote": att.Quote})
	expect(t, r, http.StatusOK, "success")
	if d.TCBStatus != "UpToDate" {
		t.Fatalf("tcbStatus %q", d.TCBStatus)
	}
	checkQuoteSignature(t, c, hc, att.Quote, d)
	t.Logf("TDX quote of %d bytes verified and signed; kernel served %d quotes", len(att.Quote), len(kernel.Served()))
	if len(kernel.Served()) == 0 {
		t.Fatal("the fake kernel served no quote")
	}
}
