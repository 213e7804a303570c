package dcaptest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// SGXTestdata returns the path of name in the shared SGX test vectors, which
// live at ../shared/testdata/sgx relative to the module root. It skips tb
// when they are absent.
func SGXTestdata(tb testing.TB, name string) string {
	tb.Helper()
	path, err := FindSGXTestdata(name)
	if err != nil {
		tb.Skipf("shared SGX test vectors absent (%v); they are expected at ../shared/testdata/sgx next to the repository", err)
	}
	return path
}

// FindSGXTestdata is SGXTestdata without a testing.TB, for fuzz seeds: it
// returns an error when the file is absent.
func FindSGXTestdata(name string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
	path := filepath.Join(dir, "..", "shared", "testdata", "sgx", name)
	if _, err := os.Stat(path); err != nil {
		return "", err
	}
	return path, nil
}

// Files of the Phala dcap-qvl vector.
const (
	PhalaQuoteFile      = "phala-dcap-qvl/sgx_quote"
	PhalaCollateralFile = "phala-dcap-qvl/sgx_quote_collateral.json"
)

// PhalaTime is a time inside the Phala collateral's validity
// (2025-06-19T10:56:11Z to 2025-07-19T10:01:18Z).
func PhalaTime() time.Time { return time.Date(2025, 7, 1, 0, 0, 0, 0, time.UTC) }

// Phala returns the real Phala quote and its collateral, or skips tb.
func Phala(tb testing.TB) (quote []byte, col *collateral.Collateral) {
	tb.Helper()
	quote, err := os.ReadFile(SGXTestdata(tb, PhalaQuoteFile))
	if err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(SGXTestdata(tb, PhalaCollateralFile))
	if err != nil {
		tb.Fatal(err)
	}
	col, err = collateral.FromQVLJSON(data)
	if err != nil {
		tb.Fatalf("Phala collateral: %v", err)
	}
	return quote, col
}
