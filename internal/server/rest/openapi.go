package rest

import (
	"net/http"

	"github.com/quarry-cc/quarry/api"
)

// openAPIDocument is the embedded description as the renderer sends it.
var openAPIDocument = document{contentType: []string{api.OpenAPIContentType}, body: api.OpenAPI}

// getOpenAPI serves the OpenAPI 3.1 description of the Client API
// (api/openapi.yaml): no client certificate, in every state.
func (s *server) getOpenAPI(*http.Request) (any, error) { return openAPIDocument, nil }
