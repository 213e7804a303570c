package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// FuzzHandler sends arbitrary methods, paths, queries and bodies to the whole
// Client API handler over a real core: every answer must be a JSON envelope
// with a 2xx or 4xx status — never a panic, never a 5xx for client input.
func FuzzHandler(f *testing.F) {
	c, err := core.New(context.Background(), core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		f.Fatal(err)
	}
	h := New(c, Options{MaxManifestBytes: 1 << 16})
	paths := []string{}
	for _, rt := range (&server{}).allRoutes() {
		paths = append(paths, rt.path)
	}
	paths = append(paths, "/", "/api/v2/", "/api/v2/status/", "/nope")
	methods := []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead}

	f.Add(uint8(1), uint8(1), "", []byte(`{"manifest":"e30="}`))
	f.Add(uint8(1), uint8(2), "", []byte(`{"manifest":"eyJQYWNrYWdlcyI6eyJwIjp7IkRlYnVnIjp0cnVlfX0sIk1hcmJsZXMiOnsibSI6eyJQYWNrYWdlIjoicCJ9fX0="}`))
	f.Add(uint8(0), uint8(3), "nonce=AAAA", []byte(nil))
	f.Add(uint8(1), uint8(4), "", []byte(`{"recoverySecret":"AAAA","recoverySecretSignature":"AAAA"}`))
	f.Add(uint8(0), uint8(6), "s=a&s=", []byte(nil))
	f.Add(uint8(1), uint8(7), "", []byte(`{"secrets":{"a":{"key":"AAAA"}}}`))
	f.Add(uint8(1), uint8(14), "", []byte(`[1,2,3]`))
	f.Add(uint8(1), uint8(13), "", []byte(`{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}}}`))
	f.Fuzz(func(t *testing.T, m, p uint8, query string, body []byte) {
		path := paths[int(p)%len(paths)]
		method := methods[int(m)%len(methods)]
		req := httptest.NewRequest(method, "https://coordinator"+path, bytes.NewReader(body))
		req.URL.RawQuery = strings.ReplaceAll(query, "#", "")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 || w.Code < 200 {
			t.Fatalf("%s %s?%s %q: HTTP %d %s", method, path, query, body, w.Code, w.Body.Bytes())
		}
		if method == http.MethodHead || w.Code == http.StatusOK && path == v2.PathOpenAPI {
			return // no body, or the OpenAPI description (openapi_test.go)
		}
		var env map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil {
			t.Fatalf("%s %s: not JSON: %q", method, path, w.Body.Bytes())
		}
		st, _ := env["status"].(string)
		if st == "" {
			st, _ = env["Status"].(string)
		}
		if (w.Code == 200) != (st == "success") || (w.Code != 200 && st != "fail" && st != "error") {
			t.Fatalf("HTTP %d with envelope %s", w.Code, w.Body.Bytes())
		}
		if w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("Content-Type %q", w.Header().Get("Content-Type"))
		}
	})
}
