package dcaptest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// Files of the real TDX vectors in ../shared/testdata/tdx (see its README).
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

// FindTDXTestdata returns the path of name in ../shared/testdata/tdx above
// the module root, or an error when it is absent.
func FindTDXTestdata(name string) (string, error) {
	sgx, err := FindSGXTestdata(".")
	if err != nil {
		return "", err
	}
	path := filepath.Join(sgx, "..", "tdx", name)
	if _, err := os.Stat(path); err != nil {
		return "", err
	}
	return path, nil
}

// TDXVector returns a real TDX quote and its collateral, or skips tb when
// the shared test vectors are absent.
func TDXVector(tb testing.TB, quoteFile, collateralFile string) ([]byte, *collateral.Collateral) {
	tb.Helper()
	read := func(name string) []byte {
		path, err := FindTDXTestdata(name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || path == "" {
				tb.Skipf("shared TDX test vectors absent (%v); they are expected at ../shared/testdata/tdx next to the repository", err)
			}
			tb.Fatal(err)
		}
		b, err := os.ReadFile(path)
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
