package rest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/quarry-cc/quarry/api"
	v2 "github.com/quarry-cc/quarry/api/v2"
)

// outsideDescription lists the routes of the table that api/openapi.yaml
// deliberately does not describe, as "METHOD /path" with the reason:
// pages for people rather than API operations (a console under
// /console/, say). Every other route must be described, and every
// described operation must be a route.
var outsideDescription = map[string]string{}

// routeKey is a route as "METHOD /path", with ServeMux's wildcards
// ({name...}) written as OpenAPI path templates ({name}).
func routeKey(method, path string) string {
	return strings.ToUpper(method) + " " + wildcardRest.ReplaceAllString(path, "{$1}")
}

var wildcardRest = regexp.MustCompile(`\{([^}.]+)\.\.\.\}`)

// TestOpenAPIDescribesEveryRoute walks the route table of both
// generations and the operations of api/openapi.yaml: each route must be
// described (or listed in outsideDescription) and each described
// operation must be a route.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("loading api/openapi.yaml: %v", err)
	}
	described := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			described[routeKey(method, path)] = true
		}
	}
	routes := map[string]bool{}
	for _, rt := range (&server{}).allRoutes() {
		routes[routeKey(rt.method, rt.path)] = true
	}
	var missing, extra []string
	for key := range routes {
		_, outside := outsideDescription[key]
		switch {
		case outside && described[key]:
			t.Errorf("%s is listed in outsideDescription but api/openapi.yaml describes it; remove one of the two", key)
		case !outside && !described[key]:
			missing = append(missing, key)
		}
	}
	for key := range described {
		if !routes[key] {
			extra = append(extra, key)
		}
	}
	for key := range outsideDescription {
		if !routes[key] {
			t.Errorf("outsideDescription lists %s, which is no route", key)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	for _, key := range missing {
		t.Errorf("route %s is not described in api/openapi.yaml: describe it (or list it in outsideDescription if it is no API operation)", key)
	}
	for _, key := range extra {
		t.Errorf("api/openapi.yaml describes %s, which is no route of the Client API: remove it from the description", key)
	}
	if len(routes) == 0 || len(described) == 0 {
		t.Fatalf("%d routes, %d described operations", len(routes), len(described))
	}
}

// TestOpenAPIServed checks that GET /api/v2/openapi.yaml serves the
// embedded description as is, without a client certificate, with the
// headers of every answer.
func TestOpenAPIServed(t *testing.T) {
	h := New(nil, Options{})
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, "https://coordinator"+v2.PathOpenAPI, nil))
		body, _ := io.ReadAll(w.Result().Body)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: HTTP %d %s", method, w.Code, body)
		}
		for k, want := range map[string]string{
			"Content-Type": "application/yaml", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
		} {
			if got := w.Header().Get(k); got != want {
				t.Errorf("%s: %s = %q, want %q", method, k, got, want)
			}
		}
		if w.Header().Get("X-Request-Id") == "" {
			t.Errorf("%s: no X-Request-Id", method)
		}
		if method == http.MethodGet && string(body) != string(api.OpenAPI) {
			t.Errorf("GET served %d bytes that are not api/openapi.yaml's %d", len(body), len(api.OpenAPI))
		}
	}
	if _, err := openapi3.NewLoader().LoadFromData(api.OpenAPI); err != nil {
		t.Fatal(err)
	}
}
