package dcaptest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// SGXTestdata returns the path of name in the SGX test vectors, which live
// in testdata/sgx at the module root (testdata/sgx/README.md says where they
// come from). The vectors are part of the repository, so a missing file
// fails tb: a test never passes silently without them.
func SGXTestdata(tb testing.TB, name string) string {
	tb.Helper()
	path, err := vectorPath("sgx", name)
	if err != nil {
		tb.Fatalf("SGX test vector %s: %v (the vectors are committed under testdata/sgx at the module root)", name, err)
	}
	return path
}

// TDXTestdata is SGXTestdata for the TDX vectors in testdata/tdx.
func TDXTestdata(tb testing.TB, name string) string {
	tb.Helper()
	path, err := vectorPath("tdx", name)
	if err != nil {
		tb.Fatalf("TDX test vector %s: %v (the vectors are committed under testdata/tdx at the module root)", name, err)
	}
	return path
}

// vectorPath returns the path of testdata/<kind>/<name> at the module root,
// found by walking up from the working directory to go.mod, or an error when
// the file is absent.
func vectorPath(kind, name string) (string, error) {
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
	path := filepath.Join(dir, "testdata", kind, name)
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

// Phala returns the real Phala quote and its collateral; a missing file
// fails tb.
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
