package cli

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies holds the layering rule: the CLI is built only on the
// public SDK, the manifest model and the wire contract of this module.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/quarry-cc/quarry/internal/cli").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	const mod = "github.com/quarry-cc/quarry/"
	for _, pkg := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(pkg, mod)
		if !ok {
			continue
		}
		switch {
		case rel == "internal/cli", rel == "internal/buildinfo", rel == "client", rel == "manifest", strings.HasPrefix(rel, "api/"), rel == "internal/attest", strings.HasPrefix(rel, "internal/attest/"):
		default:
			t.Errorf("internal/cli depends on %s", pkg)
		}
	}
}
