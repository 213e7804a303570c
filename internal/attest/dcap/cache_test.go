package dcap_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
)

// cacheCase is a real quote with its collateral at a time inside its
// window and one after the TCB info's nextUpdate.
type cacheCase struct {
	name         string
	quote        []byte
	col          *collateral.Collateral
	valid, after time.Time
}

func cacheCases(t *testing.T) []cacheCase {
	sgxQuote, sgxCol := dcaptest.Phala(t)
	tdxQuote, tdxCol := dcaptest.TDXVector(t, dcaptest.TDXQuoteA, dcaptest.TDXCollateralA)
	sgxInfo, err := collateral.ParseTCBInfo(sgxCol.TCBInfo)
	if err != nil {
		t.Fatal(err)
	}
	tdxInfo, err := collateral.ParseTDXTCBInfo(tdxCol.TCBInfo)
	if err != nil {
		t.Fatal(err)
	}
	return []cacheCase{
		{"SGX", sgxQuote, sgxCol, dcaptest.PhalaTime(), sgxInfo.NextUpdate.Add(time.Second)},
		{"TDX", tdxQuote, tdxCol, dcaptest.TDXTimeA(), tdxInfo.NextUpdate.Add(time.Second)},
	}
}

func verifyAt(col *collateral.Collateral, now time.Time, quote []byte) (*dcap.Result, error) {
	v := &dcap.Verifier{Collateral: collateral.Static{Collateral: col}, Now: func() time.Time { return now }}
	return v.Verify(context.Background(), quote)
}

// TestCachedCollateralOnlyForItsBytes: after a collateral was verified and
// kept, a copy differing in one byte of a signed document, a signature or
// a CRL is verified afresh and fails; the kept verdict is not reused.
func TestCachedCollateralOnlyForItsBytes(t *testing.T) {
	for _, tc := range cacheCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			dcap.ForgetCollaterals()
			if _, err := verifyAt(tc.col, tc.valid, tc.quote); err != nil {
				t.Fatal(err)
			}
			if n := dcap.CachedCollaterals(); n != 1 {
				t.Fatalf("%d collaterals kept after one verification, want 1", n)
			}
			for _, edit := range []struct {
				name string
				do   func(c *collateral.Collateral)
				kind error
				step dcap.Step
			}{
				// One more byte that keeps the JSON well-formed (and
				// its meaning the same): a space after the brace.
				{"TCB info", func(c *collateral.Collateral) {
					c.TCBInfo = append([]byte("{ "), bytes.TrimPrefix(c.TCBInfo, []byte("{"))...)
				}, dcap.ErrBadSignature, dcap.StepTCBInfo},
				{"TCB info signature", func(c *collateral.Collateral) { c.TCBInfoSignature = flip(c.TCBInfoSignature, 7) }, dcap.ErrBadSignature, dcap.StepTCBInfo},
				{"QE identity", func(c *collateral.Collateral) {
					c.QEIdentity = append([]byte("{ "), bytes.TrimPrefix(c.QEIdentity, []byte("{"))...)
				}, dcap.ErrBadSignature, dcap.StepQEIdentity},
				{"QE identity signature", func(c *collateral.Collateral) { c.QEIdentitySignature = flip(c.QEIdentitySignature, 33) }, dcap.ErrBadSignature, dcap.StepQEIdentity},
				{"PCK CRL", func(c *collateral.Collateral) { c.PCKCRL = c.RootCACRL }, dcap.ErrBadCRL, dcap.StepPCKCRL},
			} {
				c := *tc.col
				edit.do(&c)
				_, err := verifyAt(&c, tc.valid, tc.quote)
				var de *dcap.Error
				if !errors.As(err, &de) || de.Kind != edit.kind || de.Step != edit.step {
					t.Errorf("%s changed after the original was kept: err = %v, want %v at %q", edit.name, err, edit.kind, edit.step)
				}
			}
			// The original is still accepted from the cache.
			if _, err := verifyAt(tc.col, tc.valid, tc.quote); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCachedCollateralExpires: a kept collateral used after its TCB info's
// nextUpdate fails with ErrCollateralExpired (and the complete result),
// exactly as a fresh verification at that time does.
func TestCachedCollateralExpires(t *testing.T) {
	for _, tc := range cacheCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			dcap.ForgetCollaterals()
			_, fresh := verifyAt(tc.col, tc.after, tc.quote)
			if !errors.Is(fresh, dcap.ErrCollateralExpired) {
				t.Fatalf("fresh verification after nextUpdate: %v, want ErrCollateralExpired", fresh)
			}
			if _, err := verifyAt(tc.col, tc.valid, tc.quote); err != nil {
				t.Fatal(err)
			}
			if dcap.CachedCollaterals() != 1 {
				t.Fatal("the collateral was not kept")
			}
			res, err := verifyAt(tc.col, tc.after, tc.quote)
			if !errors.Is(err, dcap.ErrCollateralExpired) || res == nil || !res.CollateralExpired {
				t.Fatalf("kept collateral after nextUpdate: result %v, err %v; want ErrCollateralExpired with the result", res, err)
			}
			if err.Error() != fresh.Error() {
				t.Fatalf("kept collateral after nextUpdate: %q, fresh verification: %q", err, fresh)
			}
		})
	}
}
