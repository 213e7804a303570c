package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/quarry-cc/quarry/api"
)

// TestOpenAPIIsValid loads the embedded description and validates it as an
// OpenAPI 3.1 document, including its examples and defaults.
func TestOpenAPIIsValid(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("loading api/openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") || !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi = %q, want 3.1.x", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background(), openapi3.EnableExamplesValidation()); err != nil {
		t.Fatalf("api/openapi.yaml is not a valid OpenAPI 3.1 document: %v", err)
	}
}

// TestOpenAPIOperationsAreComplete checks what every operation of the
// description must say: an operationId, the conditions common to every
// operation (429, 431, 500, 503), 408 and 413 where there is a body, 401
// where a certificate is needed, and X-Request-Id on every answer.
func TestOpenAPIOperationsAreComplete(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			if op.OperationID == "" {
				t.Errorf("%s: no operationId", where)
			} else if other, dup := ids[op.OperationID]; dup {
				t.Errorf("%s: operationId %q is %s's too", where, op.OperationID, other)
			}
			ids[op.OperationID] = where
			want := []int{200, 429, 431, 500, 503}
			if op.RequestBody != nil {
				want = append(want, 400, 408, 413)
			}
			if op.Security != nil && len(*op.Security) > 0 {
				want = append(want, 401)
			}
			for _, code := range want {
				r := op.Responses.Status(code)
				if r == nil {
					t.Errorf("%s: no %d response", where, code)
					continue
				}
				if r.Value.Headers["X-Request-Id"] == nil {
					t.Errorf("%s: the %d response lacks the X-Request-Id header", where, code)
				}
			}
			for code, r := range op.Responses.Map() {
				if r.Value.Headers["X-Request-Id"] == nil {
					t.Errorf("%s: the %s response lacks the X-Request-Id header", where, code)
				}
			}
		}
	}
}
