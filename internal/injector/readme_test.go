package injector_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/quarry-cc/quarry/internal/injector"
)

// readmeBlock returns the YAML block after marker in README.md.
func readmeBlock(t *testing.T, readme, marker string) []byte {
	t.Helper()
	_, after, ok := strings.Cut(readme, marker+"\n```yaml\n")
	block, _, ok2 := strings.Cut(after, "\n```")
	if !ok || !ok2 {
		t.Fatalf("README.md has no yaml block after %s", marker)
	}
	j, err := yaml.YAMLToJSON([]byte(block))
	if err != nil {
		t.Fatalf("%s: %v", marker, err)
	}
	return j
}

// canonical decodes a Pod and encodes it again, so that two spellings of
// the same pod compare equal.
func canonical(t *testing.T, raw []byte) []byte {
	t.Helper()
	var p corev1.Pod
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(p)
	return out
}

// TestReadmeExample: the pod before and after injection that
// README.md ("On Kubernetes") shows is what the injector makes of it.
func TestReadmeExample(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	before := readmeBlock(t, string(raw), "<!-- injector-before -->")
	want := readmeBlock(t, string(raw), "<!-- injector-after -->")
	in := newInjector(t, injector.IntelEPC)
	_, patched := admit(t, in, before, "shop")
	if got, w := canonical(t, patched), canonical(t, want); !bytes.Equal(got, w) {
		t.Fatalf("README.md's injected pod differs from the injector's:\ndocs     %s\ninjector %s", w, got)
	}
}
