package cli

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

// closedAddr returns a loopback address on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func (f *fakeCoordinator) received() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

// TestCoordinatorList: --coordinator and QUARRY_COORDINATOR take several
// comma-separated addresses; a refused address is skipped, with --root and
// with the attestation (here --insecure) alike; answers are final; a change
// whose connection broke is not sent again; another root is refused.
func TestCoordinatorList(t *testing.T) {
	a := newFakeCoordinator(t)
	b := newFakeInstance(t, a)
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile(filepath.Join(dir, "root.pem"), a.rootPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "m.json"), []byte(`{"Packages":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	status := func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.StatusResponse{Code: 3, Status: 3, Message: "running"}, "")
	}
	b.mux.HandleFunc("GET /api/v2/status", status)
	b.mux.HandleFunc("POST /api/v2/manifest", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, "success", v2.ManifestSetResponse{}, "")
	})
	addrs := closedAddr(t) + "," + b.addr()

	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
	}{
		"flag with --root":     {nil, []string{"status", "--root", "root.pem", "--coordinator", addrs}},
		"env with --root":      {map[string]string{EnvCoordinator: addrs}, []string{"status", "--root", "root.pem"}},
		"env with --insecure":  {map[string]string{EnvCoordinator: addrs}, []string{"status", "--insecure"}},
		"flag with --insecure": {nil, []string{"status", "--insecure", "--coordinator", addrs}},
	} {
		code, out, errOut := run(t, tc.env, tc.args...)
		if code != ExitOK || out != "3: running\n" {
			t.Errorf("%s: %d %q %q", name, code, out, errOut)
		}
	}
	if code, _, errOut := run(t, nil, "manifest", "set", "m.json", "--root", "root.pem", "--coordinator", addrs); code != ExitOK {
		t.Fatalf("manifest set over %s: %d %q", addrs, code, errOut)
	}

	// Answers of the first reachable instance are final: 404, 409, 500.
	for _, tc := range []struct {
		status, exit int
	}{{404, ExitNotFound}, {409, ExitConflict}, {500, ExitFailure}, {503, ExitFailure}} {
		first := newFakeInstance(t, a)
		first.mux.HandleFunc("GET /api/v2/status", func(w http.ResponseWriter, r *http.Request) {
			js := "fail"
			if tc.status >= 500 {
				js = "error"
			}
			reply(w, tc.status, js, nil, "no")
		})
		before := len(b.received())
		code, _, errOut := run(t, nil, "status", "--root", "root.pem", "--coordinator", closedAddr(t)+","+first.addr()+","+b.addr())
		if code != tc.exit {
			t.Errorf("HTTP %d from the first instance: exit %d %q, want %d", tc.status, code, errOut, tc.exit)
		}
		if after := len(b.received()); after != before {
			t.Errorf("HTTP %d from the first instance: the request went on to the next one", tc.status)
		}
	}

	// A manifest upload whose connection broke after it was sent: not sent
	// again, exit 1 with a hint to check the state.
	breaker := newFakeInstance(t, a)
	breaker.mux.HandleFunc("POST /api/v2/manifest", func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler)
	})
	code, _, errOut := run(t, nil, "manifest", "set", "m.json", "--root", "root.pem", "--coordinator", breaker.addr()+","+b.addr())
	if code != ExitFailure || !strings.Contains(errOut, "may have applied") {
		t.Fatalf("broken upload: %d %q", code, errOut)
	}
	if !slices.Contains(breaker.received(), "POST /api/v2/manifest") {
		t.Fatal("the breaking instance did not receive the upload")
	}
	if n := countOf(b.received(), "POST /api/v2/manifest"); n != 1 {
		t.Fatalf("the next instance received the upload %d times in all, want only the first, successful one", n)
	}

	// Another deployment's instance in the list: refused (exit 3), not skipped.
	other := newFakeCoordinator(t)
	before := len(b.received())
	code, _, errOut = run(t, nil, "status", "--root", "root.pem", "--coordinator", other.addr()+","+b.addr())
	if code != ExitVerification {
		t.Fatalf("another root: %d %q, want exit %d", code, errOut, ExitVerification)
	}
	if len(b.received()) != before {
		t.Fatal("after another root, the request went on to the next instance")
	}

	// Nothing reachable: exit 1 naming every address.
	c1, c2 := closedAddr(t), closedAddr(t)
	code, _, errOut = run(t, nil, "status", "--root", "root.pem", "--coordinator", c1+","+c2)
	if code != ExitFailure || !strings.Contains(errOut, c1) || !strings.Contains(errOut, c2) || !strings.Contains(errOut, "no Coordinator endpoint reachable") {
		t.Fatalf("nothing reachable: %d %q", code, errOut)
	}

	// Malformed lists are usage errors.
	for _, bad := range []string{"a,,b", b.addr() + "," + b.addr(), "a,http://b", ","} {
		if code, _, errOut := run(t, nil, "status", "--root", "root.pem", "--coordinator", bad); code != ExitUsage {
			t.Errorf("--coordinator %q: %d %q, want exit %d", bad, code, errOut, ExitUsage)
		}
	}
}

func countOf(list []string, s string) int {
	n := 0
	for _, e := range list {
		if e == s {
			n++
		}
	}
	return n
}
