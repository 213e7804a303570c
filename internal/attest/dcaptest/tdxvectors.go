package dcaptest

import (
	"os"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// Files of the real TDX vectors in testdata/tdx (see its README).
const (
	TDXQuoteA      = "phala-dcap-qvl/tdx_quote"                          // v4, TD 1.0, 70 bytes of padding
	TDXCollateralA = "phala-dcap-qvl/tdx_quote_collateral.json"          // for A
	TDXQuoteB      = "phala-dcap-qvl/tdx_quote_outdated"                 // v5, TD 1.5, no matching TCB level
	TDXQuoteC      = "go-tdx-guest/quote_v5_sample.dat"                  // v5, TD 1.5, UpToDate
	TDXCollateralB = "phala-dcap-qvl/tdx_quote_outdated_collateral.json" // for B and C
)

// Verification times inside the vectors' windows (README "Expected results").
func TDXTimeA() time.Time  { return time.Unix(1751328000, 0).UTC() } // 2025-07-01
func TDXTimeBC() time.Time { return time.Unix(1772323200, 0).UTC() } // 2026-03-01

// TDXVector returns a real TDX quote and its collateral; a missing file
// fails tb.
func TDXVector(tb testing.TB, quoteFile, collateralFile string) ([]byte, *collateral.Collateral) {
	tb.Helper()
	read := func(name string) []byte {
		b, err := os.ReadFile(TDXTestdata(tb, name))
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	quote := read(quoteFile)
	col, err := collateral.FromQVLJSON(read(collateralFile))
	if err != nil {
		tb.Fatalf("collateral %s: %v", collateralFile, err)
	}
	return quote, col
}
