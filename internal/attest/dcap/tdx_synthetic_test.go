package dcap_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/collateral/pccs"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// tdxBodies are the three body layouts a synthetic TDX quote can take.
var tdxBodies = []struct {
	name    string
	version uint16
	body    uint16
}{
	{"v4 TD1.0", 4, tdxquote.BodyTypeTD10},
	{"v5 TD1.0", 5, tdxquote.BodyTypeTD10},
	{"v5 TD1.5", 5, tdxquote.BodyTypeTD15},
}

func tdxLevel(pl *dcaptest.Platform, tdx [16]uint8, status string, adv ...string) dcaptest.TDXLevel {
	return dcaptest.TDXLevel{CompSVN: pl.Ext.CompSVN, PCESVN: pl.Ext.PCESVN, TDXCompSVN: tdx, Status: status, Advisories: adv}
}

// TestTDXSyntheticStatuses: each platform TCB status of the TDX level, the
// module's and the QE's statuses, merged by Intel's rules, for every body.
func TestTDXSyntheticStatuses(t *testing.T) {
	pl := newPlatform(t) // QE ISVSVN 8; quotes have TEE_TCB_SVN 06 01 03
	def := dcaptest.DefaultTEETCBSVN()
	upToDateModule := []dcaptest.TDXModuleIdentity{{ID: "TDX_01", Levels: []dcaptest.QELevel{{ISVSVN: 6, Status: "UpToDate"}}}}
	for _, tc := range []struct {
		name       string
		o          dcaptest.TDXCollateralOptions
		want       tcbstatus.Status
		advisories []string
	}{
		{name: "UpToDate", want: tcbstatus.UpToDate},
		{name: "SWHardeningNeeded", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, def, "SWHardeningNeeded", "INTEL-SA-00615")}}, want: tcbstatus.SWHardeningNeeded, advisories: []string{"INTEL-SA-00615"}},
		{name: "ConfigurationNeeded", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, def, "ConfigurationNeeded")}}, want: tcbstatus.ConfigurationNeeded},
		{name: "ConfigurationAndSWHardeningNeeded", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, def, "ConfigurationAndSWHardeningNeeded")}}, want: tcbstatus.ConfigurationAndSWHardeningNeeded},
		{name: "OutOfDate", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, [16]uint8{0, 0, 4}, "UpToDate"), tdxLevel(pl, def, "OutOfDate", "INTEL-SA-00001")}}, want: tcbstatus.OutOfDate, advisories: []string{"INTEL-SA-00001"}},
		{name: "OutOfDateConfigurationNeeded", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, def, "OutOfDateConfigurationNeeded")}}, want: tcbstatus.OutOfDateConfigurationNeeded},
		{name: "Revoked", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, def, "Revoked")}}, want: tcbstatus.Revoked},
		{name: "module OutOfDate", o: dcaptest.TDXCollateralOptions{Modules: []dcaptest.TDXModuleIdentity{{ID: "TDX_01", Levels: []dcaptest.QELevel{{ISVSVN: 7, Status: "UpToDate"}, {ISVSVN: 2, Status: "OutOfDate", Advisories: []string{"INTEL-SA-00002"}}}}}}, want: tcbstatus.OutOfDate, advisories: []string{"INTEL-SA-00002"}},
		{name: "module OutOfDate with ConfigurationNeeded", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, def, "ConfigurationNeeded")}, Modules: []dcaptest.TDXModuleIdentity{{ID: "TDX_01", Levels: []dcaptest.QELevel{{ISVSVN: 2, Status: "OutOfDate"}}}}}, want: tcbstatus.OutOfDateConfigurationNeeded},
		{name: "module Revoked", o: dcaptest.TDXCollateralOptions{Modules: []dcaptest.TDXModuleIdentity{{ID: "TDX_01", Levels: []dcaptest.QELevel{{ISVSVN: 6, Status: "Revoked"}}}}}, want: tcbstatus.Revoked},
		{name: "QE OutOfDate", o: dcaptest.TDXCollateralOptions{QELevels: []dcaptest.QELevel{{ISVSVN: 9, Status: "UpToDate"}, {ISVSVN: 8, Status: "OutOfDate"}}}, want: tcbstatus.OutOfDate},
		{name: "QE Revoked", o: dcaptest.TDXCollateralOptions{QELevels: []dcaptest.QELevel{{ISVSVN: 8, Status: "Revoked"}}}, want: tcbstatus.Revoked},
		{name: "module identity id lower-case", o: dcaptest.TDXCollateralOptions{Modules: []dcaptest.TDXModuleIdentity{{ID: "tdx_01", Levels: upToDateModule[0].Levels}}}, want: tcbstatus.UpToDate},
		{name: "FMSPC lower-case", o: dcaptest.TDXCollateralOptions{FMSPC: "00906ea10000"}, want: tcbstatus.UpToDate},
	} {
		col := pl.TDXCollateral(t, tc.o)
		for _, b := range tdxBodies {
			t.Run(tc.name+"/"+b.name, func(t *testing.T) {
				quote := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: b.version, BodyType: b.body})
				res, err := verifier(pl, col).Verify(context.Background(), quote)
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if res.Status != tc.want || !slices.Equal(res.Advisories, tc.advisories) {
					t.Errorf("status %v advisories %v, want %v %v", res.Status, res.Advisories, tc.want, tc.advisories)
				}
				if res.TDX == nil || res.TDX.BodyType != b.body || res.Version != b.version {
					t.Errorf("TDX result %+v", res.TDX)
				}
			})
		}
	}
}

// TestTDXSyntheticRelaunch: a TD 1.5 whose module is out of date but whose
// TEE_TCB_SVN2 reaches the newest level is advised to relaunch; TD 1.0
// bodies and too-low TEE_TCB_SVN2 stay OutOfDate.
func TestTDXSyntheticRelaunch(t *testing.T) {
	pl := newPlatform(t)
	def := dcaptest.DefaultTEETCBSVN()
	modules := []dcaptest.TDXModuleIdentity{{ID: "TDX_01", Levels: []dcaptest.QELevel{{ISVSVN: 8, Status: "UpToDate"}, {ISVSVN: 6, Status: "OutOfDate"}}}}
	for _, tc := range []struct {
		name  string
		level string
		svn2  [16]byte
		body  uint16
		want  tcbstatus.Status
	}{
		{"relaunch advised", "UpToDate", [16]byte{8, 1, 3}, tdxquote.BodyTypeTD15, tcbstatus.TDRelaunchAdvised},
		{"relaunch advised, configuration", "ConfigurationNeeded", [16]byte{8, 1, 3}, tdxquote.BodyTypeTD15, tcbstatus.TDRelaunchAdvisedConfigurationNeeded},
		{"SVN2 too low", "UpToDate", [16]byte{7, 1, 3}, tdxquote.BodyTypeTD15, tcbstatus.OutOfDate},
		{"SVN2 major 0", "UpToDate", [16]byte{6, 0, 3}, tdxquote.BodyTypeTD15, tcbstatus.TDRelaunchAdvised},
		{"TD 1.0 has no SVN2", "UpToDate", [16]byte{8, 1, 3}, tdxquote.BodyTypeTD10, tcbstatus.OutOfDate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			col := pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, def, tc.level)}, Modules: modules})
			var body tdxquote.TDReport
			body.TEETCBSVN2 = tc.svn2
			quote := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tc.body, Body: body})
			res, err := verifier(pl, col).Verify(context.Background(), quote)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want {
				t.Errorf("status %v, want %v", res.Status, tc.want)
			}
		})
	}
}

// TestTDXSyntheticFailures: module identity and TD QE identity mismatches,
// missing TCB levels, wrong collateral kinds.
func TestTDXSyntheticFailures(t *testing.T) {
	pl := newPlatform(t)
	def := dcaptest.DefaultTEETCBSVN()
	var otherSigner [48]byte
	otherSigner[0] = 1
	withBody := func(f func(*tdxquote.TDReport)) []byte {
		var b tdxquote.TDReport
		f(&b)
		return pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15, Body: b})
	}
	otherQE := pl.PKI.NewPlatform(t, pl.Ext)
	otherQE.QE.MRSIGNER[0] ^= 0xff
	for _, tc := range []struct {
		name  string
		o     dcaptest.TDXCollateralOptions
		col   *collateral.Collateral
		quote []byte
		kind  error
		step  dcap.Step
	}{
		{name: "no module identity for major version", o: dcaptest.TDXCollateralOptions{Modules: []dcaptest.TDXModuleIdentity{{ID: "TDX_03", Levels: []dcaptest.QELevel{{ISVSVN: 1, Status: "UpToDate"}}}}}, kind: dcap.ErrTDXModule, step: dcap.StepTDXModule},
		{name: "module MRSIGNERSEAM mismatch", o: dcaptest.TDXCollateralOptions{Modules: []dcaptest.TDXModuleIdentity{{ID: "TDX_01", MRSIGNER: otherSigner, Levels: []dcaptest.QELevel{{ISVSVN: 1, Status: "UpToDate"}}}}}, kind: dcap.ErrTDXModule, step: dcap.StepTDXModule},
		{name: "SEAMATTRIBUTES set", quote: withBody(func(b *tdxquote.TDReport) { b.SEAMAttributes[0] = 1 }), kind: dcap.ErrTDXModule, step: dcap.StepTDXModule},
		{name: "major 0 against tdxModule mrsigner", o: dcaptest.TDXCollateralOptions{ModuleMRSIGNER: otherSigner}, quote: withBody(func(b *tdxquote.TDReport) { b.TEETCBSVN = [16]byte{6, 0, 3} }), kind: dcap.ErrTDXModule, step: dcap.StepTDXModule},
		{name: "module SVN below every level", o: dcaptest.TDXCollateralOptions{Modules: []dcaptest.TDXModuleIdentity{{ID: "TDX_01", Levels: []dcaptest.QELevel{{ISVSVN: 7, Status: "UpToDate"}}}}}, kind: dcap.ErrTCBNotSupported, step: dcap.StepTDXModuleTCB},
		{name: "module level status invalid", o: dcaptest.TDXCollateralOptions{Modules: []dcaptest.TDXModuleIdentity{{ID: "TDX_01", Levels: []dcaptest.QELevel{{ISVSVN: 6, Status: "ConfigurationNeeded"}}}}}, kind: dcap.ErrCollateral, step: dcap.StepTDXModuleTCB},
		{name: "TD QE identity mismatch", col: otherQE.TDXCollateral(t, dcaptest.TDXCollateralOptions{}), kind: dcap.ErrQEIdentity, step: dcap.StepQEMatch},
		{name: "TD QE below every level", o: dcaptest.TDXCollateralOptions{QELevels: []dcaptest.QELevel{{ISVSVN: 9, Status: "UpToDate"}}}, kind: dcap.ErrTCBNotSupported, step: dcap.StepQEMatch},
		{name: "no SGX level", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{{CompSVN: svns(6), PCESVN: 13, TDXCompSVN: def, Status: "UpToDate"}}}, kind: dcap.ErrTCBNotSupported, step: dcap.StepTCBLevel},
		{name: "no TDX level", o: dcaptest.TDXCollateralOptions{Levels: []dcaptest.TDXLevel{tdxLevel(pl, [16]uint8{0, 0, 4}, "UpToDate")}}, kind: dcap.ErrTCBNotSupported, step: dcap.StepTCBLevel},
		{name: "TCB info id SGX", o: dcaptest.TDXCollateralOptions{TCBInfoID: "SGX"}, kind: dcap.ErrCollateral, step: dcap.StepTCBInfo},
		{name: "QE identity id QE", o: dcaptest.TDXCollateralOptions{QEIdentityID: "QE"}, kind: dcap.ErrCollateral, step: dcap.StepQEIdentity},
		{name: "SGX collateral", col: pl.Collateral(t, dcaptest.CollateralOptions{}), kind: dcap.ErrCollateral, step: dcap.StepTCBInfo},
		{name: "other FMSPC", o: dcaptest.TDXCollateralOptions{FMSPC: "00906EA10001"}, kind: dcap.ErrCollateral, step: dcap.StepTCBInfo},
	} {
		t.Run(tc.name, func(t *testing.T) {
			col := tc.col
			if col == nil {
				col = pl.TDXCollateral(t, tc.o)
			}
			quote := tc.quote
			if quote == nil {
				quote = pl.TDXQuote(t, dcaptest.TDXQuoteOptions{})
			}
			res, err := verifier(pl, col).Verify(context.Background(), quote)
			var de *dcap.Error
			if !errors.Is(err, tc.kind) || !errors.As(err, &de) || de.Step != tc.step {
				t.Fatalf("Verify = %v, %v; want %v at %q", res, err, tc.kind, tc.step)
			}
		})
	}
}

// TestTDXSyntheticSGXCollateralForSGX: the SGX path refuses TDX collateral
// and an SGX-only provider serves no TDX collateral.
func TestTDXSyntheticProviders(t *testing.T) {
	pl := newPlatform(t)
	tdxCol := pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{})
	if _, err := verifier(pl, tdxCol).Verify(context.Background(), pl.Quote(t, dcaptest.QuoteOptions{})); !errors.Is(err, dcap.ErrCollateral) {
		t.Errorf("SGX quote with TDX collateral: %v", err)
	}
	v := verifier(pl, nil)
	v.Collateral = providerFunc(func(context.Context, [6]byte, collateral.CA) (*collateral.Collateral, error) { return tdxCol, nil })
	if _, err := v.Verify(context.Background(), pl.TDXQuote(t, dcaptest.TDXQuoteOptions{})); !errors.Is(err, dcap.ErrCollateralUnavailable) {
		t.Errorf("SGX-only provider: %v", err)
	}

	// A PCCS: SGX paths serve SGX collateral, the TDX paths TDX collateral;
	// a cache in front keeps both apart.
	mux := dcaptest.TDXPCCSHandler(pl.Collateral(t, dcaptest.CollateralOptions{}), tdxCol)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	v.Collateral = collateral.NewCache(&pccs.Client{BaseURL: srv.URL + dcaptest.PCCSPath, HTTPClient: srv.Client()}, v.Now)
	for range 2 {
		if res, err := v.Verify(context.Background(), pl.TDXQuote(t, dcaptest.TDXQuoteOptions{})); err != nil || res.TDX == nil {
			t.Fatalf("TDX via PCCS: %v", err)
		}
		if res, err := v.Verify(context.Background(), pl.Quote(t, dcaptest.QuoteOptions{})); err != nil || res.TDX != nil {
			t.Fatalf("SGX via PCCS: %v", err)
		}
	}
	if n := mux.TDXRequests.Load(); n != 2 {
		t.Errorf("%d TDX collateral requests, want 2 (tcb and qe/identity once, then cached)", n)
	}
}

// BenchmarkVerifyTDX measures TDX verifications per second over the real
// vector A (compare BenchmarkVerify for SGX).
func BenchmarkVerifyTDX(b *testing.B) {
	quote, col := dcaptest.TDXVector(b, dcaptest.TDXQuoteA, dcaptest.TDXCollateralA)
	v := tdxVerifier(col, dcaptest.TDXTimeA())
	ctx := context.Background()
	b.ReportAllocs()
	start := cpuTime()
	for b.Loop() {
		if _, err := v.Verify(ctx, quote); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifications/s")
	reportPerCPUSecond(b, start)
}
