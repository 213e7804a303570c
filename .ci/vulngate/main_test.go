package main

import (
	"strings"
	"testing"
)

func TestGate(t *testing.T) {
	const stream = `{"config":{"scanner_name":"govulncheck"}}
{"finding":{"osv":"GO-1","fixed_version":"v1.26.9","trace":[{"module":"stdlib","version":"v1.26.8","package":"net/http","function":"Get"}]}}
{"finding":{"osv":"GO-1","fixed_version":"v1.26.9","trace":[{"module":"stdlib","version":"v1.26.8","package":"net/http","function":"Do"}]}}
{"finding":{"osv":"GO-2","fixed_version":"v1.26.11","trace":[{"module":"stdlib","version":"v1.26.8","package":"crypto/x509","function":"Verify"}]}}
{"finding":{"osv":"GO-3","fixed_version":"v1.27.1","trace":[{"module":"stdlib","version":"v1.26.8","package":"os","function":"Open"}]}}
{"finding":{"osv":"GO-4","trace":[{"module":"stdlib","version":"v1.26.8","package":"os","function":"Open"}]}}
{"finding":{"osv":"GO-5","fixed_version":"v0.3.8","trace":[{"module":"golang.org/x/text","version":"v0.3.7","package":"golang.org/x/text/language","function":"ParseAcceptLanguage"}]}}
{"finding":{"osv":"GO-6","fixed_version":"v1.26.9","trace":[{"module":"stdlib","version":"v1.26.8"}]}}
{"finding":{"osv":"GO-7","fixed_version":"v9.9.9","trace":[{"module":"example.com/m","version":"v1.0.0","package":"example.com/m"}]}}
`
	accepted, failed, err := gate(strings.NewReader(stream), "v1.26.10")
	if err != nil {
		t.Fatal(err)
	}
	// GO-1 is fixed in the release's Go (one line for its two functions);
	// GO-2 only in a newer patch, GO-3 only in another line, GO-4 in none,
	// GO-5 is not the standard library; GO-6 and GO-7 are not called.
	if len(accepted) != 1 || !strings.HasPrefix(accepted[0], "GO-1 ") {
		t.Errorf("accepted %q", accepted)
	}
	var ids []string
	for _, f := range failed {
		ids = append(ids, strings.Fields(f)[0])
	}
	if got := strings.Join(ids, " "); got != "GO-2 GO-3 GO-4 GO-5" {
		t.Errorf("failed %q", failed)
	}
	for _, bad := range []string{"", "1.26.10", "v1.26", "go1.26.10", "v1.26.x"} {
		if _, _, err := gate(strings.NewReader(stream), bad); err == nil {
			t.Errorf("-release-go %q accepted", bad)
		}
	}
	if _, _, err := gate(strings.NewReader(`{"finding":`), "v1.26.10"); err == nil {
		t.Error("a cut stream accepted")
	}
}
