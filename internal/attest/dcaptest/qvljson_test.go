package dcaptest_test

import (
	"context"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
)

// TestQVLJSONRoundTrip: synthetic collateral written with QVLJSON reads back
// with collateral.FromQVLJSON and verifies a quote the same way.
func TestQVLJSONRoundTrip(t *testing.T) {
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	col := pl.Collateral(t, dcaptest.CollateralOptions{})
	back, err := collateral.FromQVLJSON(dcaptest.QVLJSON(t, col))
	if err != nil {
		t.Fatal(err)
	}
	quote := pl.Quote(t, dcaptest.QuoteOptions{})
	v := dcap.Verifier{Collateral: collateral.Static{Collateral: back}, RootCA: p.Root, Now: func() time.Time { return p.Time }}
	res, err := v.Verify(context.Background(), quote)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status.String() != "UpToDate" {
		t.Fatalf("status %s", res.Status)
	}
}
