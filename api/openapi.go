// Package api holds the Client API's machine-readable contract: the
// OpenAPI 3.1 description openapi.yaml, embedded so that the Coordinator
// serves the very bytes the tests check (docs/http.md, "OpenAPI
// description"). The wire types themselves are in api/v1, api/v2 and
// api/jsend.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 description of both Client API generations
// (openapi.yaml). Callers must not modify it.
//
//go:embed openapi.yaml
var OpenAPI []byte

// OpenAPIContentType is the media type the description is served with
// (RFC 9512).
const OpenAPIContentType = "application/yaml"
