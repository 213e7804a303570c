package dcap_test

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

func tdxVerifier(col *collateral.Collateral, at time.Time) *dcap.Verifier {
	return &dcap.Verifier{Collateral: collateral.Static{Collateral: col}, Now: func() time.Time { return at }}
}

// TestTDXRealVectors checks the three real TDX quotes against the expected
// results of testdata/tdx/README.md at a time inside each window.
func TestTDXRealVectors(t *testing.T) {
	for _, tc := range []struct {
		name, quote, col string
		at               time.Time
		version, body    uint16
		mrtd             string // prefix, from the README
	}{
		{"A v4 TD1.0 padded", dcaptest.TDXQuoteA, dcaptest.TDXCollateralA, dcaptest.TDXTimeA(), 4, tdxquote.BodyTypeTD10, "91eb2b44d141d4ec"},
		{"C v5 TD1.5", dcaptest.TDXQuoteC, dcaptest.TDXCollateralB, dcaptest.TDXTimeBC(), 5, tdxquote.BodyTypeTD15, "7348651a34b2d2d3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			quote, col := dcaptest.TDXVector(t, tc.quote, tc.col)
			res, err := tdxVerifier(col, tc.at).Verify(context.Background(), quote)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if res.Status != tcbstatus.UpToDate || len(res.Advisories) != 0 {
				t.Errorf("status %v advisories %v, want UpToDate and none", res.Status, res.Advisories)
			}
			if res.TDX == nil {
				t.Fatal("no TDX result")
			}
			if res.Version != tc.version || res.TDX.BodyType != tc.body {
				t.Errorf("version %d body %d, want %d %d", res.Version, res.TDX.BodyType, tc.version, tc.body)
			}
			if got := hex.EncodeToString(res.TDX.Report.MRTD[:]); !strings.HasPrefix(got, tc.mrtd) {
				t.Errorf("MRTD %s, want prefix %s", got, tc.mrtd)
			}
			if res.TDX.ModuleID != "TDX_01" || res.TDX.ModuleStatus != tcbstatus.UpToDate || res.QEStatus != tcbstatus.UpToDate {
				t.Errorf("module %q %v, QE %v", res.TDX.ModuleID, res.TDX.ModuleStatus, res.QEStatus)
			}
			if res.Report != ([384]byte{}) {
				t.Error("a TDX result carries an SGX report body")
			}
		})
	}
}

// TestTDXRealNoTCBLevel: vector B passes every signature, chain and CRL
// check but its PCK components match no TCB level.
func TestTDXRealNoTCBLevel(t *testing.T) {
	quote, col := dcaptest.TDXVector(t, dcaptest.TDXQuoteB, dcaptest.TDXCollateralB)
	res, err := tdxVerifier(col, dcaptest.TDXTimeBC()).Verify(context.Background(), quote)
	if !errors.Is(err, dcap.ErrTCBNotSupported) || res != nil {
		t.Fatalf("Verify = %v, %v; want ErrTCBNotSupported", res, err)
	}
	var de *dcap.Error
	if !errors.As(err, &de) || de.Step != dcap.StepTCBLevel || !strings.Contains(err.Error(), "no matching TCB level") {
		t.Errorf("error %v, want the platform TCB level step and its reason", err)
	}
}

// TestTDXRealExpiry: outside each window the verifier reports the expired
// collateral (with the full result) and outside the certificates' validity
// it refuses the chain.
func TestTDXRealExpiry(t *testing.T) {
	for _, tc := range []struct {
		name, quote, col string
		at               time.Time
		kind             error
		text             string
	}{
		{"A PCK CRL expired", dcaptest.TDXQuoteA, dcaptest.TDXCollateralA, time.Date(2025, 7, 19, 10, 0, 36, 0, time.UTC), dcap.ErrCollateralExpired, "PCK CRL"},
		{"A TCB info expired", dcaptest.TDXQuoteA, dcaptest.TDXCollateralA, time.Date(2025, 7, 19, 10, 16, 4, 0, time.UTC), dcap.ErrCollateralExpired, "TCB info"},
		{"A before QE identity", dcaptest.TDXQuoteA, dcaptest.TDXCollateralA, time.Date(2025, 6, 19, 10, 0, 0, 0, time.UTC), dcap.ErrCollateralExpired, "QE identity"},
		{"C PCK CRL expired", dcaptest.TDXQuoteC, dcaptest.TDXCollateralB, time.Date(2026, 3, 20, 10, 41, 16, 0, time.UTC), dcap.ErrCollateralExpired, "PCK CRL"},
		{"C before TCB info", dcaptest.TDXQuoteC, dcaptest.TDXCollateralB, time.Date(2026, 2, 18, 10, 0, 0, 0, time.UTC), dcap.ErrCollateralExpired, "TCB info"},
		{"A before the PCK leaf", dcaptest.TDXQuoteA, dcaptest.TDXCollateralA, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), dcap.ErrBadChain, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			quote, col := dcaptest.TDXVector(t, tc.quote, tc.col)
			res, err := tdxVerifier(col, tc.at).Verify(context.Background(), quote)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err = %v, want %v mentioning %q", err, tc.kind, tc.text)
			}
			if tc.kind == dcap.ErrCollateralExpired && (res == nil || !res.CollateralExpired || res.TDX == nil) {
				t.Errorf("expired collateral: result %+v", res)
			}
		})
	}
}

// TestTDXRealFlippedBytes: flipping any single byte of the signed region of
// each real quote makes verification fail.
func TestTDXRealFlippedBytes(t *testing.T) {
	for _, tc := range []struct {
		name, quote, col string
		at               time.Time
	}{
		{"A", dcaptest.TDXQuoteA, dcaptest.TDXCollateralA, dcaptest.TDXTimeA()},
		{"C", dcaptest.TDXQuoteC, dcaptest.TDXCollateralB, dcaptest.TDXTimeBC()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			quote, col := dcaptest.TDXVector(t, tc.quote, tc.col)
			q, err := tdxquote.Parse(quote)
			if err != nil {
				t.Fatal(err)
			}
			v := tdxVerifier(col, tc.at)
			n := len(q.SignedData())
			for i := range n {
				bad := append([]byte(nil), quote...)
				bad[i] ^= 0x01
				if res, err := v.Verify(context.Background(), bad); err == nil {
					t.Fatalf("flipped byte %d of %d: accepted with %v", i, n, res.Status)
				}
			}
			t.Logf("%d flipped bytes rejected", n)
		})
	}
}

// TestTDXRealFMSPCCase: the TCB info's FMSPC is upper-case hex; the same
// document with lower-case hex still matches the PCK's FMSPC (the signature
// then fails, which shows the FMSPC check itself is not the obstacle: the
// parsed collateral compares bytes).
func TestTDXRealFMSPCCase(t *testing.T) {
	quote, col := dcaptest.TDXVector(t, dcaptest.TDXQuoteA, dcaptest.TDXCollateralA)
	if !strings.Contains(string(col.TCBInfo), `"fmspc":"B0C06F000000"`) {
		t.Fatalf("the vector's TCB info does not carry the upper-case FMSPC")
	}
	res, err := tdxVerifier(col, dcaptest.TDXTimeA()).Verify(context.Background(), quote)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(res.PCK.FMSPC[:]); got != "b0c06f000000" {
		t.Errorf("PCK FMSPC %s", got)
	}
	lower := strings.Replace(string(col.TCBInfo), "B0C06F000000", "b0c06f000000", 1)
	info, err := collateral.ParseTDXTCBInfo([]byte(lower))
	if err != nil || info.FMSPC != res.PCK.FMSPC {
		t.Errorf("lower-case FMSPC parses to %X, %v; want the PCK's", info.FMSPC, err)
	}
}

// TestTDXRealSGXCollateral: a TDX quote verified with SGX collateral is
// refused (TCB info id SGX).
func TestTDXRealWrongKind(t *testing.T) {
	quote, col := dcaptest.TDXVector(t, dcaptest.TDXQuoteA, dcaptest.TDXCollateralA)
	_, sgxCol := dcaptest.Phala(t)
	mixed := *col
	mixed.TCBInfo, mixed.TCBInfoSignature, mixed.TCBInfoIssuerChain = sgxCol.TCBInfo, sgxCol.TCBInfoSignature, sgxCol.TCBInfoIssuerChain
	_, err := tdxVerifier(&mixed, dcaptest.TDXTimeA()).Verify(context.Background(), quote)
	if !errors.Is(err, dcap.ErrCollateral) {
		t.Fatalf("err = %v, want ErrCollateral", err)
	}
	mixed = *col
	mixed.QEIdentity, mixed.QEIdentitySignature = sgxCol.QEIdentity, sgxCol.QEIdentitySignature
	if _, err := tdxVerifier(&mixed, dcaptest.TDXTimeA()).Verify(context.Background(), quote); !errors.Is(err, dcap.ErrCollateral) {
		t.Fatalf("SGX QE identity: err = %v, want ErrCollateral", err)
	}
}
