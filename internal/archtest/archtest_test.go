// Package archtest holds the dependency rules of docs/design/architecture.md as
// tests over `go list -deps`, so that a change breaking them fails CI.
package archtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/quarry-cc/quarry"

// deps returns every package pkg depends on (itself included).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", module+"/"+pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// packages returns the module's packages matching pattern.
func packages(t *testing.T, pattern string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", module+"/"+pattern).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pattern, err)
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		pkgs = append(pkgs, strings.TrimPrefix(p, module+"/"))
	}
	return pkgs
}

// forbid fails if pkg depends on any package that has one of the prefixes.
func forbid(t *testing.T, pkg string, prefixes ...string) {
	t.Helper()
	for _, d := range deps(t, pkg) {
		for _, p := range prefixes {
			if d == p || strings.HasPrefix(d, p+"/") {
				t.Errorf("%s depends on %s (forbidden: %s)", pkg, d, p)
			}
		}
	}
}

func TestLeavesHaveNoTransportOrLogger(t *testing.T) {
	leaves := []string{"manifest", "internal/ca", "internal/seal", "internal/store/...", "internal/recovery",
		"internal/updatelog", "internal/user", "internal/secrets", "internal/marblerun/...", "internal/attest/...", "api/...",
		"internal/peer", "internal/limit"}
	for _, pattern := range leaves {
		for _, pkg := range packages(t, pattern) {
			// The PCCS client is the attest leaf's one HTTP adapter, and the
			// test helper serves a fake PCCS.
			if pkg == "internal/attest/collateral/pccs" || pkg == "internal/attest/dcaptest" ||
				pkg == "internal/store/etcdstore/etcdtest" { // runs etcd's own server in tests
				continue
			}
			// The Marble wire format's generated service stubs import gRPC
			// (and so net/http); it still must not log.
			if pkg == "api/marblepb" || strings.HasPrefix(pkg, "api/marblepb/") {
				forbid(t, pkg, "log/slog")
				continue
			}
			// The etcd store reaches etcd through etcd's client, which is
			// gRPC; it still must not log.
			if pkg == "internal/store/etcdstore" {
				forbid(t, pkg, "log/slog")
				continue
			}
			forbid(t, pkg, "net/http", "log/slog", "google.golang.org/grpc")
		}
	}
}

func TestCoreReachesNoBackendsOrServers(t *testing.T) {
	forbid(t, "internal/core", "net/http", module+"/internal/server", module+"/internal/app",
		module+"/internal/store/filestore", module+"/internal/store/memstore", module+"/internal/store/etcdstore",
		// The wire packages of api/; api/logchain (the update log's pure
		// hash chain and checkpoint rules, shared with the SDK) is allowed.
		module+"/api/v1", module+"/api/v2", module+"/api/jsend", module+"/api/marblepb", module+"/internal/config")
}

// TestVaultIsBelowCore: the crash-safe commit (internal/vault) knows stores
// and sealing only through their interfaces: the core imports it, never
// the other way round, and it names no backend and no transport. (It logs
// through the logger it is given: what it moves aside, the operator must
// hear of.)
func TestVaultIsBelowCore(t *testing.T) {
	forbid(t, "internal/vault", "net/http", "google.golang.org/grpc", module+"/internal/core", module+"/internal/app", module+"/internal/server",
		module+"/internal/config", module+"/internal/store/filestore", module+"/internal/store/memstore",
		module+"/internal/store/etcdstore", module+"/internal/marblerun", module+"/manifest", module+"/api")
	var uses bool
	for _, d := range deps(t, "internal/core") {
		uses = uses || d == module+"/internal/vault"
	}
	if !uses {
		t.Error("internal/core does not commit through internal/vault")
	}
}

// TestPersistenceLeavesAreBelowCore: the sealed state's types
// (internal/sealedstate) and MarbleRun migration (internal/migrate) are
// leaves the core imports: they import no core, app, server or
// configuration, no store and no transport, and do not log (migration is
// a pure converter; the core decides when to migrate and writes the
// result).
func TestPersistenceLeavesAreBelowCore(t *testing.T) {
	leaves := []string{"internal/sealedstate", "internal/migrate"}
	for _, pkg := range leaves {
		forbid(t, pkg, module+"/internal/core", module+"/internal/app", module+"/internal/server", module+"/internal/config",
			module+"/internal/vault", module+"/internal/store", "net/http", "google.golang.org/grpc", "log/slog")
	}
	core := deps(t, "internal/core")
	for _, pkg := range leaves {
		if !slices.Contains(core, module+"/"+pkg) {
			t.Errorf("internal/core does not use %s", pkg)
		}
	}
}

// TestLogStoreIsBelowCore: the update log's segments (internal/logstore)
// are reached through the store interface only: no backend, no core, app,
// server or configuration, no transport, no logging.
func TestLogStoreIsBelowCore(t *testing.T) {
	forbid(t, "internal/logstore", module+"/internal/core", module+"/internal/app", module+"/internal/server", module+"/internal/config",
		module+"/internal/vault", module+"/internal/store/filestore", module+"/internal/store/memstore", module+"/internal/store/etcdstore",
		"net/http", "google.golang.org/grpc", "log/slog")
	if !slices.Contains(deps(t, "internal/core"), module+"/internal/logstore") {
		t.Error("internal/core does not use internal/logstore")
	}
}

func TestServersDoNotNameBackends(t *testing.T) {
	for _, pkg := range []string{"internal/server/rest", "internal/server/marbleapi"} {
		forbid(t, pkg, module+"/internal/app", module+"/internal/store/filestore",
			module+"/internal/store/memstore", module+"/internal/store/etcdstore", module+"/internal/config")
	}
}

func TestSDKDoesNotCompileTheServer(t *testing.T) {
	for _, pkg := range []string{"client", "internal/cli"} {
		forbid(t, pkg, module+"/internal/core", module+"/internal/server", module+"/internal/app",
			module+"/internal/store", module+"/internal/config", module+"/internal/seal", module+"/internal/secrets")
	}
}

// TestMarbleRuntimeIsSmall checks that the public Marble runtime, linked
// into applications, compiles none of the Coordinator.
func TestMarbleRuntimeIsSmall(t *testing.T) {
	forbid(t, "marble", module+"/internal/core", module+"/internal/server", module+"/internal/app",
		module+"/internal/store", module+"/internal/config", module+"/internal/seal", module+"/internal/secrets",
		module+"/internal/ca", module+"/manifest", "net/http/pprof", "log/slog")
}

// TestEnvironmentReadOnlyAtTheTop checks that no package below cmd/ reads
// the environment (internal/config gets a getenv function), except the one
// entry point of the CLI.
func TestEnvironmentReadOnlyAtTheTop(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// main packages (cmd/, examples/) read their environment; below them
	// only the CLI's one entry point does (it hands a getenv function to
	// everything else), and the Marble SDK's CredentialsFromEnv, for a
	// program that a premain started: there the environment is how the
	// Coordinator's parameters arrive (docs/marbles.md).
	allowed := func(rel string) bool {
		return strings.HasPrefix(rel, "cmd/") || strings.HasPrefix(rel, "examples/") ||
			rel == "internal/cli/cli.go" || rel == "marble/tls.go"
	}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, call := range []string{"os.Getenv(", "os.LookupEnv(", "os.Environ("} {
			if bytes.Contains(src, []byte(call)) && !allowed(filepath.ToSlash(rel)) {
				t.Errorf("%s calls %s; configuration is read in cmd/ and internal/config only", rel, strings.TrimSuffix(call, "("))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestConsoleReadsOnlyTheUseCases checks that the operator console
// (internal/console) reaches the Coordinator only through the core's use
// cases, as the REST handlers do: of the module it imports the core, the
// manifest's types and the update log's chain rules, nothing that holds or
// makes a secret or a key, and no server, store, app or configuration.
func TestConsoleReadsOnlyTheUseCases(t *testing.T) {
	const pkg = "internal/console"
	allowed := map[string]bool{module + "/internal/core": true, module + "/manifest": true, module + "/api/logchain": true}
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, module+"/"+pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	for _, imp := range strings.Fields(string(out)) {
		if strings.HasPrefix(imp, module+"/") && !allowed[imp] {
			t.Errorf("%s imports %s; it may import only %v", pkg, imp, allowed)
		}
		if !strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
			continue // the standard library
		}
		if !strings.HasPrefix(imp, module+"/") {
			t.Errorf("%s imports %s from outside the module", pkg, imp)
		}
	}
	forbid(t, pkg, module+"/internal/app", module+"/internal/server", module+"/internal/store/filestore",
		module+"/internal/store/memstore", module+"/internal/store/etcdstore", module+"/internal/config", "net/http/pprof")
}

// TestTestPKIOnlyInTests checks that internal/testpki, which makes
// certificates for tests, is compiled into no program: only test files and
// test-support packages (named …test) import it.
func TestTestPKIOnlyInTests(t *testing.T) {
	const testpki = module + "/internal/testpki"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := fields[0]
		if pkg == testpki || strings.HasSuffix(pkg, "test") {
			continue
		}
		checked++
		for _, d := range fields[1:] {
			if d == testpki {
				t.Errorf("%s depends on %s, which is for tests only", pkg, testpki)
			}
		}
	}
	if checked == 0 {
		t.Fatal("go list named no package")
	}
}
