package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// attestLeaves are the quote-verification packages the SDK may import
// (documented in the package comment).
var attestLeaves = map[string]bool{
	"internal/attest":                 true,
	"internal/attest/sgxquote":        true,
	"internal/attest/tdxquote":        true,
	"internal/attest/quotereader":     true,
	"internal/attest/pck":             true,
	"internal/attest/dcap":            true,
	"internal/attest/collateral":      true,
	"internal/attest/collateral/pccs": true,
	"internal/attest/policy":          true,
	"internal/attest/tcbstatus":       true,
}

// TestDependencies holds the layering rule: the public SDK imports only the
// wire contract (api/...) and the manifest model of this module, plus pure
// leaf packages under internal/attest for quote verification, so that SDK
// users never compile the server.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/quarry-cc/quarry/client").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	const mod = "github.com/quarry-cc/quarry/"
	for _, pkg := range strings.Fields(string(out)) {
		if !strings.HasPrefix(pkg, mod) {
			if strings.Contains(strings.SplitN(pkg, "/", 2)[0], ".") {
				t.Errorf("client depends on the third-party package %s", pkg)
			}
			continue
		}
		rel := strings.TrimPrefix(pkg, mod)
		switch {
		case rel == "client", rel == "manifest", strings.HasPrefix(rel, "api/"), attestLeaves[rel]:
		default:
			t.Errorf("client depends on %s", pkg)
		}
	}
}
