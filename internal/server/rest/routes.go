// Package rest serves the Client API over HTTP: one route table, the
// middleware, one JSend renderer, and thin handlers for /api/v2 (and later
// the unprefixed v1 adapters) over the Coordinator's use cases.
package rest

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/internal/admission"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/server/tlscert"
)

// Coordinator is what the REST server needs from the core.
type Coordinator interface {
	Status() core.State
	Quote(ctx context.Context, nonce []byte) (core.QuoteResult, error)
	Manifest() (core.ManifestResult, error)
	SetManifest(ctx context.Context, raw []byte) (map[string][]byte, error)
	Recover(ctx context.Context, secret, signature []byte) (core.RecoverResult, error)
	RecoveryPublicKey(ctx context.Context) ([]byte, error)
	RecoverUnsigned(ctx context.Context, secret []byte) (core.RecoverResult, error)
	Secrets(ctx context.Context, peer []*x509.Certificate, names []string) (map[string]secrets.Secret, error)
	SetSecrets(ctx context.Context, peer []*x509.Certificate, uploads map[string]secrets.Upload) error
	UpdateLog(ctx context.Context) ([]string, error)
	UpdateLogPage(ctx context.Context, after, limit uint64) (core.LogPage, error)
	Update(ctx context.Context, peer []*x509.Certificate, raw []byte) (core.UpdateResult, error)
	PendingUpdate(ctx context.Context) (core.PendingUpdate, error)
	AcknowledgeUpdate(ctx context.Context, peer []*x509.Certificate, raw []byte) (core.UpdateResult, error)
	CancelUpdate(ctx context.Context, peer []*x509.Certificate) error
	SignQuote(ctx context.Context, quote []byte) (core.SignQuoteResult, error)
	// AuthenticateUser is the cheap check before a body is read (docs/design/decisions.md#d16).
	AuthenticateUser(peer []*x509.Certificate) error
	CheckSetManifest() error
	CheckRecover() error
	CheckMonotonicCounter() error
	// CheckMonotonicCounterFeature is the counter's feature gate, after
	// AuthenticateMarble and before the body.
	CheckMonotonicCounterFeature() error
	// CheckSignQuote is sign-quote's feature gate before its body.
	CheckSignQuote() error
	// CheckRecoverUnsigned is the v1 recover's state and enclave check
	// before its body.
	CheckRecoverUnsigned() error
	RecoverySecrets(ctx context.Context, peer []*x509.Certificate) (map[string][]byte, error)
	// AuthenticateMarble is the monotonic counter's cheap check before
	// its body is read: a Marble certificate of the current Marble Root.
	AuthenticateMarble(peer []*x509.Certificate) (core.MarbleIdentity, error)
	SetMonotonicCounter(ctx context.Context, peer []*x509.Certificate, name string, value uint64) (uint64, error)
}

// Options configure the server.
type Options struct {
	// MaxManifestBytes bounds manifest and update request bodies.
	MaxManifestBytes int64
	// EnableV1Recover serves the unprefixed POST /recover, which carries
	// no signature (docs/design/decisions.md#d11); when false it answers 403.
	EnableV1Recover bool
	// RequestTimeout is the deadline of each request's context (0: none).
	// It should be shorter than the server's WriteTimeout, so that a use
	// case gives up (and stores nothing) while its answer can still be
	// written.
	RequestTimeout time.Duration
	// BodyMemory is the memory budget of request bodies being decoded at
	// once (0: DefaultBodyMemory); it is raised to fit at least one
	// request of the largest size.
	BodyMemory int64
	// MinBodyRate is the slowest a request body may arrive, in bytes per
	// second on average since the request came, once BodyGrace has
	// passed (0: no minimum); a slower body is cut with 408.
	MinBodyRate int64
	BodyGrace   time.Duration
	// BodyTimeout bounds the arrival of a whole body from the request's
	// start (0: none). The body's read deadlines replace the server's,
	// so it should be the server's ReadTimeout.
	BodyTimeout time.Duration
	// MaxRequestsPerSource bounds the requests in progress from one
	// source address (admission.Source); more get 429 (0: no bound).
	MaxRequestsPerSource int
	Logger               *slog.Logger
	// Metrics, if set, records every request by route (metrics.go).
	Metrics RequestMetrics
	// Readiness answers GET /api/v2/readyz (nil: ready whatever the
	// state).
	Readiness Readiness
	// Console, if set, serves the operator console under ConsolePath
	// (internal/console); nil: those paths are unknown like any other.
	Console http.Handler
}

// ConsolePath is where Options.Console is mounted.
const ConsolePath = "/console/"

// NotAPIPaths are served on the Client API's listener but are not part
// of the API (HTML for browsers, not JSend): the API's description and
// its route checks leave them out.
var NotAPIPaths = []string{ConsolePath}

// Body limits of requests that are not manifests.
const (
	maxSmallBody   = 1 << 20  // 1 MiB: secrets and other small requests
	maxRecoverBody = 64 << 10 // 64 KiB: a recovery secret and its signature
	maxCounterBody = 4 << 10  // 4 KiB: a counter's name and value
)

// handlerFunc is a use-case adapter: it returns the response data or an error.
type handlerFunc func(r *http.Request) (any, error)

// route is one entry of the route table.
type route struct {
	method, path string
	handle       handlerFunc
	v1           bool
}

type server struct {
	c    Coordinator
	opts Options
	log  *slog.Logger

	warned        sync.Map // v1 paths whose deprecation was logged
	manifestCache atomic.Pointer[manifestCache]
	budget        *memoryBudget   // of request bodies being decoded
	gate          *admission.Gate // requests in progress per source
}

// deprecated logs, once per path and process, that a v1 path was used.
func (s *server) deprecated(path string) {
	if _, seen := s.warned.LoadOrStore(path, true); !seen {
		s.log.Warn("usage of deprecated API endpoint; use the /api/v2 equivalent", "path", path)
	}
}

// routes is the one route table of the Client API.
func (s *server) routes() []route {
	return []route{
		{method: http.MethodGet, path: v2.PathStatus, handle: s.getStatus},
		{method: http.MethodGet, path: v2.PathManifest, handle: s.getManifest},
		{method: http.MethodPost, path: v2.PathManifest, handle: s.postManifest},
		{method: http.MethodGet, path: v2.PathQuote, handle: s.getQuote},
		{method: http.MethodPost, path: v2.PathRecover, handle: s.postRecover},
		{method: http.MethodGet, path: v2.PathRecoverKey, handle: s.getRecoveryKey},
		{method: http.MethodGet, path: v2.PathRecoverSecrets, handle: s.getRecoverySecrets},
		{method: http.MethodGet, path: v2.PathSecrets, handle: s.getSecrets},
		{method: http.MethodPost, path: v2.PathSecrets, handle: s.postSecrets},
		{method: http.MethodGet, path: v2.PathUpdate, handle: s.getUpdateLog},
		{method: http.MethodGet, path: v2.PathUpdateLog, handle: s.getUpdateLogPage},
		{method: http.MethodPost, path: v2.PathUpdate, handle: s.postUpdate},
		{method: http.MethodGet, path: v2.PathUpdateManifest, handle: s.getPendingUpdate},
		{method: http.MethodPost, path: v2.PathUpdateManifest, handle: s.postAcknowledge},
		{method: http.MethodPost, path: v2.PathUpdateCancel, handle: s.postCancel},
		{method: http.MethodPost, path: v2.PathSignQuote, handle: s.postSignQuote},
		{method: http.MethodPost, path: v2.PathMonotonicCounter, handle: s.postMonotonicCounter},
		{method: http.MethodGet, path: PathHealthz, handle: s.getHealthz},
		{method: http.MethodGet, path: PathReadyz, handle: s.getReadyz},
		{method: http.MethodGet, path: v2.PathOpenAPI, handle: s.getOpenAPI},
	}
}

// allRoutes is the route table of both generations.
func (s *server) allRoutes() []route { return append(s.routes(), s.v1Routes()...) }

// New returns the Client API handler.
func New(c Coordinator, opts Options) http.Handler {
	h, _ := newServer(c, opts)
	return h
}

// newServer returns the handler and the server behind it.
func newServer(c Coordinator, opts Options) (http.Handler, *server) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &server{c: c, opts: opts, log: opts.Logger}
	mux := http.NewServeMux()
	// methods maps each path of the route table to its methods; it tells
	// 405 from 404 for requests no route matched.
	methods := map[string][]string{}
	routes := s.allRoutes()
	for _, rt := range routes {
		methods[rt.path] = append(methods[rt.path], rt.method)
	}
	for _, rt := range routes {
		rend := renderer{log: s.log, v1: rt.v1, methods: methods}
		h, v1, path := rt.handle, rt.v1, rt.path
		mux.HandleFunc(rt.method+" "+rt.path, func(w http.ResponseWriter, r *http.Request) {
			if v1 {
				s.deprecated(path)
			}
			if s.opts.RequestTimeout > 0 {
				ctx, cancel := context.WithTimeout(r.Context(), s.opts.RequestTimeout)
				defer cancel()
				r = r.WithContext(ctx)
			}
			data, err := h(r)
			if err != nil && errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				err = &unavailableError{err: err, retryAfter: 10, msg: abandoned(s.opts.RequestTimeout, err)}
			}
			rend.write(w, r, data, err)
		})
	}
	if opts.Console != nil {
		mux.Handle(ConsolePath, opts.Console) // /console redirects here
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// The escaped path: /api/v2%2Fstatus is not /api/v2/status.
		p := r.URL.EscapedPath()
		err := fmt.Errorf("%w: %s", errUnknownPath, p)
		if _, ok := methods[p]; ok {
			err = fmt.Errorf("%w: %s %s (allowed: %s)", errBadMethod, r.Method, p, allowHeader(methods, p))
		}
		renderer{log: s.log, v1: isV1(r), methods: methods}.write(w, r, nil, err)
	})
	onPanic := func(w http.ResponseWriter, r *http.Request) {
		renderer{log: s.log, v1: isV1(r), methods: methods}.write(w, r, nil, errPanic)
	}
	maxBody := max(manifestBodyLimit(opts.MaxManifestBytes), opts.MaxManifestBytes, maxSmallBody)
	s.budget = newMemoryBudget(cmp.Or(opts.BodyMemory, DefaultBodyMemory), decodeCost(maxBody))
	s.gate = admission.NewGate(opts.MaxRequestsPerSource)
	refuse := func(w http.ResponseWriter, r *http.Request, err error) {
		renderer{log: s.log, v1: isV1(r), methods: methods}.write(w, r, nil, err)
	}
	p := pace{rate: opts.MinBodyRate, grace: opts.BodyGrace, timeout: opts.BodyTimeout}
	h := withRequestLog(s.log, onPanic)(withRequestChecks(refuse)(withBodies(s.budget, p, maxBody)(withSourceGate(s.gate, refuse)(mux))))
	if opts.Metrics != nil {
		known := make(map[string]bool, len(methods))
		for p := range methods {
			known[p] = true
		}
		h = withRequestMetrics(opts.Metrics, known)(h)
	}
	return h, s
}

// abandoned is the message of a request that failed past its deadline: it
// says what the core knows the failed change left in the store
// (core.OutcomeOf), so that a client repeats a request only where that
// cannot apply its change twice.
func abandoned(timeout time.Duration, err error) string {
	switch core.OutcomeOf(err) {
	case core.Stored:
		return fmt.Sprintf("the request did not finish within %s: the change WAS stored, but the store reported an error afterwards (see the Coordinator's log); do not repeat the request, check the state first", timeout)
	case core.OutcomeUnknown:
		return fmt.Sprintf("the request did not finish within %s and was abandoned; whether the change was stored is unknown (the store could not be read back); check the state before repeating the request", timeout)
	}
	return fmt.Sprintf("the request did not finish within %s and was abandoned; nothing was stored; retry later", timeout)
}

// isV1 tells whether a request outside the route table is answered in the
// unprefixed generation's envelope.
func isV1(r *http.Request) bool { return !strings.HasPrefix(r.URL.Path, "/api/v2/") }

// allowHeader lists the methods a known path accepts.
func allowHeader(methods map[string][]string, path string) string {
	ms := slices.Clone(methods[path])
	if slices.Contains(ms, http.MethodGet) {
		ms = append(ms, http.MethodHead)
	}
	slices.Sort(ms)
	return strings.Join(ms, ", ")
}

// TLSConfig returns the Client API's TLS configuration: TLS 1.2 or newer,
// the Coordinator's current root certificate, and a client certificate
// requested (users are checked per request) but not required.
//
// A client that comes back with a session ticket resumes its TLS session
// while the root is unchanged (tlscert); every request is checked as over a
// new connection.
func TLSConfig(cert func() *tls.Certificate) *tls.Config {
	return tlscert.Server(&tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequestClientCert,
		// http/1.0: clients that offer only it get HTTP/1.x instead of a
		// failed handshake.
		NextProtos: []string{"h2", "http/1.1", "http/1.0"},
	}, cert)
}
