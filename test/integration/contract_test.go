package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/quarry-cc/quarry/api"
	"github.com/quarry-cc/quarry/internal/server/rest"
)

// The harness's HTTPS clients (coordinator.client) send every request
// through validating, which checks the request and the answer against
// the Client API's OpenAPI description (api/openapi.yaml):
//
//   - every answer must be one the description lists for the operation
//     (status, media type, headers, body schema); an answer to a path or
//     method the description does not have must be the 404 or 405 envelope
//     of the path's generation;
//   - a request the description calls invalid (a deliberately malformed
//     body, a missing client certificate, a bad query) is recorded, not
//     failed, when the Coordinator refuses it (any status but 2xx): the
//     server and the description agree that it is invalid. When the
//     Coordinator accepts it with 2xx, the two disagree and the test fails.
//
// So tests that send bad requests on purpose need no marking, and a
// handler that starts accepting what the description forbids, or answers
// what it does not describe, fails the integration suite.

// contractDoc is the description, loaded once.
var contractDoc = sync.OnceValues(func() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		return nil, fmt.Errorf("loading api/openapi.yaml: %w", err)
	}
	return doc, nil
})

// contractStats are the figures reported after the run (reportContract).
var contractStats struct {
	exchanges, refusedInvalid, unvalidatedBodies atomic.Int64
	memoised                                     atomic.Int64 // validations answered from verdicts
	nanos                                        atomic.Int64
	mu                                           sync.Mutex
	seen                                         map[string]bool // "METHOD /path STATUS"
}

// validating wraps next so that every exchange is checked against the
// description; violations fail t. hasCert tells whether the client
// presents a certificate (the mutualTLS security schemes).
func validating(t testing.TB, next http.RoundTripper, hasCert bool) http.RoundTripper {
	doc, err := contractDoc()
	if err != nil {
		t.Fatal(err)
	}
	return &validatingTransport{t: t, next: next, doc: doc, hasCert: hasCert}
}

type validatingTransport struct {
	t       testing.TB
	next    http.RoundTripper
	doc     *openapi3.T
	hasCert bool
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// wrapped transport.
func (v *validatingTransport) CloseIdleConnections() {
	if c, ok := v.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (v *validatingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	for _, p := range rest.NotAPIPaths {
		if strings.HasPrefix(req.URL.Path, p) {
			return v.next.RoundTrip(req) // not the API (the operator console's pages)
		}
	}
	start := time.Now()
	ex := v.request(req)
	spent := time.Since(start)
	resp, err := v.next.RoundTrip(req)
	if err != nil {
		contractStats.nanos.Add(int64(spent))
		return resp, err
	}
	// Read the whole answer (the Coordinator always sends a
	// Content-Length) and hand the test the same bytes.
	raw, readErr := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = &replayBody{r: bytes.NewReader(raw), err: readErr}
	start = time.Now()
	if readErr == nil {
		v.response(ex, req, resp, raw)
	} else {
		contractStats.unvalidatedBodies.Add(1)
	}
	contractStats.nanos.Add(int64(spent + time.Since(start)))
	contractStats.exchanges.Add(1)
	return resp, nil
}

// exchange is what the request's validation found.
type exchange struct {
	input  *openapi3filter.RequestValidationInput // nil: no operation
	routeE error                                  // routers.ErrPathNotFound or ErrMethodNotAllowed
	reqErr error                                  // the request violates the description
}

// request finds the operation of req and validates req against it.
func (v *validatingTransport) request(req *http.Request) exchange {
	method := req.Method
	if method == http.MethodHead {
		method = http.MethodGet // every GET answers HEAD (RFC 9110, section 9.3.2)
	}
	path := req.URL.EscapedPath()
	item := v.doc.Paths.Value(path)
	if item == nil {
		return exchange{routeE: routers.ErrPathNotFound}
	}
	op := item.GetOperation(method)
	if op == nil {
		return exchange{routeE: routers.ErrMethodNotAllowed}
	}
	route := &routers.Route{Spec: v.doc, Path: path, PathItem: item, Method: method, Operation: op}
	in := &openapi3filter.RequestValidationInput{
		Request: req,
		Route:   route,
		Options: &openapi3filter.Options{
			MultiError:         true,
			ExcludeRequestBody: req.Method == http.MethodHead,
			// mutualTLS: satisfied when the client presents a
			// certificate; whether it is the right one the server decides
			// (401), which the description allows.
			AuthenticationFunc: func(context.Context, *openapi3filter.AuthenticationInput) error {
				if !v.hasCert {
					return errors.New("no client certificate")
				}
				return nil
			},
		},
	}
	check, copied := req, false // copied: check has its own copy of the body
	switch {
	case req.Body == nil || req.Body == http.NoBody:
	case req.GetBody != nil:
		// A copy of the body; the original goes to the server.
		body, err := req.GetBody()
		if err != nil {
			return exchange{input: in, reqErr: fmt.Errorf("copying the request body: %w", err)}
		}
		check = req.Clone(req.Context())
		check.Body, copied = body, true
	default:
		// A body that can be read once (a test streaming it slowly):
		// the request's body is not validated, its answer is.
		contractStats.unvalidatedBodies.Add(1)
		in.Options.ExcludeRequestBody = true
	}
	if method != req.Method || copied && req.Header.Get("Content-Type") == "" {
		body := check.Body
		check = check.Clone(check.Context())
		check.Method, check.Body = method, body
		// The Coordinator reads every body as JSON whatever its
		// Content-Type (api/openapi.yaml, "Bodies"); the harness's
		// requests carry none.
		if check.Body != nil && check.Header.Get("Content-Type") == "" {
			check.Header.Set("Content-Type", "application/json")
		}
	}
	in.Request = check
	var body []byte
	if copied {
		var err error
		if body, err = io.ReadAll(check.Body); err != nil {
			return exchange{input: in, reqErr: fmt.Errorf("copying the request body: %w", err)}
		}
		check.Body.Close()
	}
	key := verdictKey("request", req.Method, path, req.URL.RawQuery, check.Header.Get("Content-Type"), fmt.Sprint(v.hasCert, in.Options.ExcludeRequestBody), body)
	err := memo(key, func() error {
		if copied {
			check.Body = io.NopCloser(bytes.NewReader(body))
		}
		return openapi3filter.ValidateRequest(req.Context(), in)
	})
	in.Request = req
	return exchange{input: in, reqErr: err}
}

// verdicts memoises validations: the validator's verdict depends only on
// what goes into its key, and the tests repeat many exchanges (kin-openapi
// compiles the schemas of a document in JSON Schema 2020-12 on every
// validation).
var verdicts sync.Map // key → error (nil: valid)

// verdictKey is the key of one validation: the parts, and the SHA-256 of
// the body.
func verdictKey(parts ...any) string {
	h := sha256.New()
	for _, p := range parts {
		switch p := p.(type) {
		case []byte:
			h.Write(p)
		default:
			fmt.Fprintf(h, "%v\x00", p)
		}
	}
	return string(h.Sum(nil))
}

// memo returns the verdict for key, validating with f the first time.
func memo(key string, f func() error) error {
	if v, ok := verdicts.Load(key); ok {
		contractStats.memoised.Add(1)
		err, _ := v.(error)
		return err
	}
	err := f()
	verdicts.Store(key, err)
	return err
}

// requestIDFormat is the form of X-Request-Id (api/openapi.yaml).
var requestIDFormat = regexp.MustCompile(`^[0-9a-f]{16}$`)

// response validates the answer to req.
func (v *validatingTransport) response(ex exchange, req *http.Request, resp *http.Response, raw []byte) {
	t := v.t
	t.Helper()
	where := req.Method + " " + req.URL.EscapedPath()
	if ex.input == nil {
		v.unknownRoute(ex, req, resp, raw)
		return
	}
	contractStats.mu.Lock()
	if contractStats.seen == nil {
		contractStats.seen = map[string]bool{}
	}
	contractStats.seen[fmt.Sprintf("%s %s %d", ex.input.Route.Method, ex.input.Route.Path, resp.StatusCode)] = true
	contractStats.mu.Unlock()
	if ex.reqErr != nil {
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			t.Errorf("openapi: %s: the Coordinator accepted (HTTP %d) a request that api/openapi.yaml calls invalid: %v",
				where, resp.StatusCode, ex.reqErr)
		} else {
			contractStats.refusedInvalid.Add(1)
			t.Logf("openapi: %s: a request outside api/openapi.yaml, refused with HTTP %d as the description expects (%s)",
				where, resp.StatusCode, firstLine(ex.reqErr))
		}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: ex.input,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Options: &openapi3filter.Options{
			MultiError:            true,
			IncludeResponseStatus: true,
			ExcludeResponseBody:   req.Method == http.MethodHead,
		},
	}
	out.SetBodyBytes(raw)
	// X-Request-Id differs in every answer: one of the right form is
	// validated as a fixed one of that form, so that the verdict can be
	// memoised; one of another form is validated as it is.
	header := resp.Header.Clone()
	if id := header.Get("X-Request-Id"); requestIDFormat.MatchString(id) {
		header.Set("X-Request-Id", "0123456789abcdef")
	}
	out.Header = header
	key := verdictKey("response", ex.input.Route.Method, ex.input.Route.Path, req.Method, resp.StatusCode,
		header.Get("Content-Type"), header.Values("X-Request-Id"), header.Values("Retry-After"), raw)
	if err := memo(key, func() error { return openapi3filter.ValidateResponse(req.Context(), out) }); err != nil {
		t.Errorf("openapi: %s: the answer HTTP %d is not one api/openapi.yaml describes: %v\nbody: %.2000s", where, resp.StatusCode, err, raw)
	}
}

// unknownRoute checks the answer to a path or method the description does
// not have: the 404 or 405 envelope of the path's generation.
func (v *validatingTransport) unknownRoute(ex exchange, req *http.Request, resp *http.Response, raw []byte) {
	t := v.t
	t.Helper()
	where := req.Method + " " + req.URL.EscapedPath()
	want, schema := http.StatusNotFound, "V1Error"
	if errors.Is(ex.routeE, routers.ErrMethodNotAllowed) {
		want = http.StatusMethodNotAllowed
		if resp.Header.Get("Allow") == "" {
			t.Errorf("openapi: %s: HTTP %d without an Allow header", where, resp.StatusCode)
		}
	}
	if strings.HasPrefix(req.URL.Path, "/api/v2/") {
		schema = "V2Fail"
	}
	// 429, 431 and 503 may answer any request before it is routed.
	if resp.StatusCode != want && !slices.Contains([]int{429, 431, 503}, resp.StatusCode) {
		t.Errorf("openapi: %s is not in api/openapi.yaml, yet answered HTTP %d (want %d)", where, resp.StatusCode, want)
		return
	}
	if resp.StatusCode == 503 && schema == "V2Fail" {
		schema = "V2Error"
	}
	if req.Method == http.MethodHead {
		return
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("openapi: %s: HTTP %d with Content-Type %q, want application/json", where, resp.StatusCode, ct)
		return
	}
	var body any
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Errorf("openapi: %s: HTTP %d body is not JSON: %q", where, resp.StatusCode, raw)
		return
	}
	if err := v.doc.Components.Schemas[schema].Value.VisitJSON(body, openapi3.EnableJSONSchema2020()); err != nil {
		t.Errorf("openapi: %s: HTTP %d body is not api/openapi.yaml's %s: %v\nbody: %s", where, resp.StatusCode, schema, err, raw)
	}
}

// replayBody returns the bytes read, then the error that ended the read.
type replayBody struct {
	r   *bytes.Reader
	err error
}

func (b *replayBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF && b.err != nil {
		err = b.err
	}
	return n, err
}

func (b *replayBody) Close() error { return nil }

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// reportContract prints the validator's figures after the run.
func reportContract() {
	n := contractStats.exchanges.Load()
	if n == 0 {
		return
	}
	doc, err := contractDoc()
	if err != nil {
		return
	}
	ops := 0
	for _, item := range doc.Paths.Map() {
		ops += len(item.Operations())
	}
	contractStats.mu.Lock()
	hit := map[string]bool{}
	for k := range contractStats.seen {
		f := strings.Fields(k)
		hit[f[0]+" "+f[1]] = true
	}
	answers := len(contractStats.seen)
	contractStats.mu.Unlock()
	fmt.Fprintf(os.Stderr, "openapi: %d exchanges validated against api/openapi.yaml in %s; %d of %d operations and %d (operation, status) pairs exercised; %d invalid requests refused as described; %d bodies not validated (streamed or cut); %d validations memoised\n",
		n, time.Duration(contractStats.nanos.Load()).Round(time.Millisecond), len(hit), ops, answers,
		contractStats.refusedInvalid.Load(), contractStats.unvalidatedBodies.Load(), contractStats.memoised.Load())
}

// TestOpenAPIServedByCoordinator fetches the description from the real
// binary, without a client certificate: the bytes of api/openapi.yaml, as
// application/yaml, in every state (here: waiting for a manifest, and
// running).
func TestOpenAPIServedByCoordinator(t *testing.T) {
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	check := func(when string) {
		t.Helper()
		resp, err := hc.Get(c.url("/api/v2/openapi.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/yaml" {
			t.Fatalf("%s: HTTP %d, Content-Type %q: %.300s", when, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
		}
		if !bytes.Equal(raw, api.OpenAPI) {
			t.Fatalf("%s: served %d bytes that are not api/openapi.yaml's %d", when, len(raw), len(api.OpenAPI))
		}
		doc, err := openapi3.NewLoader().LoadFromData(raw)
		if err != nil {
			t.Fatalf("%s: the served description does not load: %v", when, err)
		}
		if !doc.IsOpenAPI31OrLater() {
			t.Fatalf("%s: served openapi %q", when, doc.OpenAPI)
		}
	}
	check("waiting for a manifest")
	expect(t, setManifest(t, c, hc, newFixture(t).bytes(t)), http.StatusOK, "success")
	check("running")
}
