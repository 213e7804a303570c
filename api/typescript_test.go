package api_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tsDir holds the TypeScript consumer of the description: package.json
// and package-lock.json pin openapi-typescript and typescript, example.ts
// uses the generated types.
const tsDir = "typescript"

// node returns the path of node, installing the pinned npm packages first
// if they are missing; without node the test is skipped, except under
// CI=true, where .ci/run installs it.
func node(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is not installed; .ci/run installs it (apt-get install nodejs npm)")
		}
		t.Skip("node is not installed; the TypeScript check runs in CI")
	}
	if _, err := os.Stat(filepath.Join(tsDir, "node_modules", "typescript", "bin", "tsc")); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			t.Fatalf("api/typescript/node_modules is missing and npm is not installed: %v", err)
		}
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = tsDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in api/typescript: %v\n%s", err, out)
		}
	}
	return bin
}

// run runs a node program from api/typescript/node_modules and returns
// its output and error.
func run(t *testing.T, nodeBin, script string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(nodeBin, append([]string{filepath.Join(tsDir, "node_modules", script)}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestTypeScriptTypes generates TypeScript types from api/openapi.yaml with
// openapi-typescript and type-checks example.ts, a typed fetch of two
// operations, against them with tsc; then checks that tsc does find a
// use of the types the description does not allow (a member that does not
// exist, a state code that does not exist), so that the check checks.
func TestTypeScriptTypes(t *testing.T) {
	nodeBin := node(t)
	dir := t.TempDir()
	gen := filepath.Join(dir, "generated", "client-api.d.ts")
	start := time.Now()
	if out, err := run(t, nodeBin, "openapi-typescript/bin/cli.js", "openapi.yaml", "-o", gen); err != nil {
		t.Fatalf("openapi-typescript: %v\n%s", err, out)
	}
	generated := time.Since(start)
	example, err := os.ReadFile(filepath.Join(tsDir, "example.ts"))
	if err != nil {
		t.Fatal(err)
	}
	tsconfig, err := os.ReadFile(filepath.Join(tsDir, "tsconfig.json"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("example.ts", string(example))
	write("tsconfig.json", string(tsconfig))
	if out, err := run(t, nodeBin, "typescript/bin/tsc", "-p", dir); err != nil {
		t.Fatalf("tsc: example.ts does not type-check against the generated types: %v\n%s", err, out)
	}
	t.Logf("openapi-typescript %s, tsc %s", generated.Round(time.Millisecond), (time.Since(start) - generated).Round(time.Millisecond))

	// The same program with two mistakes the types must catch.
	broken := strings.Replace(string(example), "return body.data.code;", "const four: typeof body.data.code = 4; return body.data.kode;", 1)
	if broken == string(example) {
		t.Fatal("example.ts no longer contains `return body.data.code;`; adjust the negative check")
	}
	write("example.ts", broken)
	out, err := run(t, nodeBin, "typescript/bin/tsc", "-p", dir)
	if err == nil {
		t.Fatalf("tsc accepted a member that does not exist (data.kode) and state code 4:\n%s", out)
	}
	for _, want := range []string{"kode", "'4'"} {
		if !strings.Contains(out, want) {
			t.Errorf("tsc's errors do not mention %s:\n%s", want, out)
		}
	}
}
