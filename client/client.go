// Package client is the Go SDK of the Quarry Coordinator's Client API
// (/api/v2). It is wire-compatible with MarbleRun's Coordinator.
//
// A Client talks to one Coordinator (or several instances of one, below)
// over HTTPS. Trust is explicit: either a
// root certificate the caller already trusts (usually the one returned by
// VerifyCoordinator, which checks the Coordinator's quote), or, for a
// Coordinator in simulation mode, WithInsecureSkipVerify. There is no silent
// trust on first use. Likewise VerifyCoordinator takes either a Verifier (a
// Coordinator in an enclave, which always sends a quote) or
// InsecureSkipVerify (simulation), never both: "verify the quote if there is
// one" would accept anyone who answers without one.
//
//	att, err := client.VerifyCoordinator(ctx, "coordinator:4433", client.VerifyOptions{Verifier: v})
//	...
//	c, err := client.New("coordinator:4433", client.WithRootCertificate(att.Root))
//	st, err := c.Status(ctx)
//
// Several instances of one Coordinator deployment (serving the same state
// under the same root certificate) may be given as one comma-separated
// endpoint, "a:4433,b:4433,c:4433", to New and VerifyCoordinator. A request
// goes to the endpoint that answered last (at first the first one) and, if
// it fails at the connection level, on to the next, each endpoint at most
// once per request:
//
//   - Any HTTP answer is final, whatever its status (2xx, 4xx, 5xx, JSend
//     or not): the request reached a server that decided.
//   - A refusal by a live peer is final: the pinned root does not match
//     (every endpoint must present the same root; another one is
//     ErrRootMismatch, never skipped), a TLS alert, a peer that does not
//     speak TLS. The caller's context ending is final too.
//   - If no connection could be established (dial refused or timed out,
//     the TLS handshake reset or timed out; see WithConnectTimeout), nothing
//     was sent, and every request moves to the next endpoint.
//   - If the connection broke after it was established and before the
//     answer began, only GET requests move on. A POST is not repeated: it
//     may have been applied, and the Client never applies a write twice.
//     The error wraps ErrOutcomeUnknown; check the state before repeating.
//
// When no endpoint could be reached, the error wraps ErrUnreachable and
// each endpoint's error.
//
// The Coordinator's TLS server certificate is its root certificate itself, so
// a pinned Client accepts exactly that certificate, byte for byte; a
// certificate issued under the Coordinator's CAs (a Marble's, for example)
// cannot stand in for the Coordinator.
//
// Every method takes a context first and returns the response data, or an
// error: a *Error for answers of the Coordinator other than success, a
// transport error otherwise. Errors of the Coordinator match the sentinels
// (ErrNotFound, ErrConflict, ...) with errors.Is.
//
// DCAPVerifier verifies the Coordinator's SGX quote in pure Go against
// expected properties (EraConfig, MarbleRun's era config shape) and Intel's
// collateral from a file or a PCCS:
//
//	era, err := client.ReadEraConfig("coordinator-era.json")
//	v, err := client.NewDCAPVerifier(client.DCAPOptions{Expected: era, PCCSURL: pccsURL})
//	att, err := client.VerifyCoordinator(ctx, "coordinator:4433", client.VerifyOptions{Verifier: v})
//
// Dependencies: the SDK imports only the wire contract (api/...), the
// manifest model and, as the one exception, the pure leaf packages of quote
// verification under internal/attest (sgxquote, tdxquote, quotereader, pck, dcap, collateral,
// collateral/pccs, policy, tcbstatus). Those import neither the server nor
// a logger, so SDK users never compile the Coordinator.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/quarry-cc/quarry/api/jsend"
)

// DefaultPort is the Client API port used when an endpoint names none.
const DefaultPort = "4433"

// maxResponseBytes bounds a response body (manifests may be several MiB and
// travel as base64).
const maxResponseBytes = 64 << 20

// Client is a Client API client for one Coordinator deployment: one
// endpoint, or several instances of it that it fails over between (see
// ParseEndpoints, ErrUnreachable and ErrOutcomeUnknown). It is safe for
// concurrent use.
type Client struct {
	endpoints []*url.URL
	current   atomic.Int32 // index of the endpoint that answered last
	hc        *http.Client
	root      *x509.Certificate // pinned root; nil in insecure mode or with a caller-owned transport
}

// Option configures New.
type Option func(*options) error

type options struct {
	root       *x509.Certificate
	insecure   bool
	clientCert *tls.Certificate
	hc         *http.Client
	connect    time.Duration
}

// WithRootCertificate trusts exactly this Coordinator root certificate: the
// Coordinator must present it as its TLS certificate.
func WithRootCertificate(root *x509.Certificate) Option {
	return func(o *options) error {
		if root == nil {
			return errors.New("client: WithRootCertificate: nil certificate")
		}
		o.root = root
		return nil
	}
}

// WithRootPEM is WithRootCertificate for PEM text. If the text holds a whole
// chain (as GET /api/v2/quote returns it), the self-signed CA certificate in
// it is taken as the root.
func WithRootPEM(pemText []byte) Option {
	return func(o *options) error {
		root, err := ParseRootPEM(pemText)
		if err != nil {
			return fmt.Errorf("client: WithRootPEM: %w", err)
		}
		o.root = root
		return nil
	}
}

// WithInsecureSkipVerify accepts any TLS certificate from the Coordinator.
// Use it only for a Coordinator in simulation mode, which cannot be attested,
// or to bootstrap with VerifyCoordinator. It is never implied.
func WithInsecureSkipVerify() Option {
	return func(o *options) error {
		o.insecure = true
		return nil
	}
}

// WithClientCertificate presents cert in the TLS handshake: a manifest user's
// certificate for the secrets and update endpoints.
func WithClientCertificate(cert tls.Certificate) Option {
	return func(o *options) error {
		if len(cert.Certificate) == 0 {
			return errors.New("client: WithClientCertificate: empty certificate")
		}
		o.clientCert = &cert
		return nil
	}
}

// WithHTTPClient uses hc for the requests (timeouts, proxies, ...). If hc's
// Transport is nil or an *http.Transport, a clone of it gets the TLS settings
// of the other options; a caller-supplied other RoundTripper is used as it is
// and must not be combined with the TLS options.
func WithHTTPClient(hc *http.Client) Option {
	return func(o *options) error {
		if hc == nil {
			return errors.New("client: WithHTTPClient: nil client")
		}
		o.hc = hc
		return nil
	}
}

// DefaultConnectTimeout bounds connecting to one endpoint (TCP and TLS
// handshake each) unless WithConnectTimeout says otherwise: an endpoint
// that does not accept the connection in time is given up for the next.
const DefaultConnectTimeout = 10 * time.Second

// WithConnectTimeout bounds connecting to one endpoint: the TCP connection
// and the TLS handshake, each (default DefaultConnectTimeout). With several
// endpoints, this is how long a dead instance delays a request before the
// next one is tried. It cannot be combined with a WithHTTPClient transport
// other than an *http.Transport.
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("client: WithConnectTimeout: %v is not positive", d)
		}
		o.connect = d
		return nil
	}
}

// ErrExclusiveOptions is wrapped when options that exclude each other are
// combined: WithRootCertificate (or WithRootPEM) with WithInsecureSkipVerify
// in New, VerifyOptions.Verifier with VerifyOptions.InsecureSkipVerify in
// VerifyCoordinator. The error names both options.
var ErrExclusiveOptions = errors.New("options that exclude each other")

// ErrNoTrust is returned by New when no way to trust the Coordinator was
// chosen.
var ErrNoTrust = errors.New("client: no trusted root certificate: use WithRootCertificate (for example the root returned by VerifyCoordinator), or WithInsecureSkipVerify for a Coordinator in simulation mode")

// New returns a Client for the Coordinator at endpoint: "host", "host:port"
// or "https://host:port" (the port defaults to 4433), or several of them
// comma-separated, instances of one deployment that the Client fails over
// between on connection errors (see ErrUnreachable for the rule). Exactly one of
// WithRootCertificate/WithRootPEM and WithInsecureSkipVerify must be given,
// unless WithHTTPClient supplies a transport that does its own verification.
func New(endpoint string, opts ...Option) (*Client, error) {
	endpoints, err := parseEndpoints(endpoint)
	if err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.root != nil && o.insecure {
		return nil, fmt.Errorf("client: %w: WithRootCertificate and WithInsecureSkipVerify: pin the root, or skip verification (simulation mode only)", ErrExclusiveOptions)
	}
	hc, err := o.httpClient()
	if err != nil {
		return nil, err
	}
	return &Client{endpoints: endpoints, hc: hc, root: o.root}, nil
}

// httpClient builds the HTTP client for the options.
func (o *options) httpClient() (*http.Client, error) {
	tlsOpts := o.root != nil || o.insecure || o.clientCert != nil
	if o.hc != nil && !tlsOpts {
		if o.connect != 0 {
			if _, ok := o.hc.Transport.(*http.Transport); !ok && o.hc.Transport != nil {
				return nil, fmt.Errorf("client: WithHTTPClient: transport %T cannot take WithConnectTimeout", o.hc.Transport)
			}
			hc := *o.hc
			tr := defaultTransport()
			if t, ok := o.hc.Transport.(*http.Transport); ok {
				tr = t.Clone()
			}
			setConnectTimeout(tr, o.connect)
			hc.Transport = tr
			return &hc, nil
		}
		return o.hc, nil // the caller's transport does its own verification
	}
	if o.root == nil && !o.insecure {
		return nil, ErrNoTrust
	}
	hc := &http.Client{}
	tr := defaultTransport()
	if o.hc != nil {
		*hc = *o.hc
		switch t := o.hc.Transport.(type) {
		case nil:
		case *http.Transport:
			tr = t.Clone()
		default:
			return nil, fmt.Errorf("client: WithHTTPClient: transport %T cannot take the TLS options; configure its TLS yourself and leave out the root, insecure and client-certificate options", t)
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if tr.TLSClientConfig != nil {
		cfg = tr.TLSClientConfig.Clone()
	}
	// Verification is done by VerifyConnection (pinning) or skipped
	// (insecure); the default host-name based verification is not used.
	cfg.InsecureSkipVerify = true
	if o.root != nil {
		cfg.VerifyConnection = pinRoot(o.root)
	}
	if o.clientCert != nil {
		cfg.Certificates = []tls.Certificate{*o.clientCert}
	}
	tr.TLSClientConfig = cfg
	tr.ForceAttemptHTTP2 = true
	if o.connect != 0 {
		setConnectTimeout(tr, o.connect)
	}
	hc.Transport = tr
	return hc, nil
}

// setConnectTimeout bounds tr's TCP connections and TLS handshakes by d.
func setConnectTimeout(tr *http.Transport, d time.Duration) {
	tr.DialContext = (&net.Dialer{Timeout: d, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = d
}

func defaultTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: DefaultConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   DefaultConnectTimeout,
		ResponseHeaderTimeout: 5 * time.Minute,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConns:          10,
	}
}

// pinRoot accepts a TLS connection only if the peer's certificate is root.
func pinRoot(root *x509.Certificate) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: the Coordinator presented no certificate", ErrVerification)
		}
		if !cs.PeerCertificates[0].Equal(root) {
			return fmt.Errorf("%w: %w", ErrVerification, ErrRootMismatch)
		}
		return nil
	}
}

// ErrRootMismatch means the Coordinator's TLS certificate is not the pinned
// root certificate. A Coordinator in recovery mode serves a temporary root
// until it is recovered.
var ErrRootMismatch = errors.New("the Coordinator's TLS certificate is not the trusted root certificate (a Coordinator in recovery mode serves a temporary root until it is recovered)")

// parseEndpoint turns an endpoint into the base URL.
func parseEndpoint(endpoint string) (*url.URL, error) {
	e := strings.TrimSpace(endpoint)
	if e == "" {
		return nil, errors.New("client: empty Coordinator endpoint")
	}
	if !strings.Contains(e, "://") {
		e = "https://" + e
	}
	u, err := url.Parse(e)
	if err != nil {
		return nil, fmt.Errorf("client: invalid Coordinator endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("client: invalid Coordinator endpoint %q: the Client API is served over https only", endpoint)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("client: invalid Coordinator endpoint %q: no host", endpoint)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("client: invalid Coordinator endpoint %q: give only the host and port", endpoint)
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), DefaultPort)
	}
	u.Path = ""
	return u, nil
}

// Endpoint returns the base URL of the endpoint that answered last (before
// any answer, the first one).
func (c *Client) Endpoint() string { return c.endpoints[c.current.Load()].String() }

// Endpoints returns the base URLs of all endpoints, in the order given.
func (c *Client) Endpoints() []string {
	out := make([]string, len(c.endpoints))
	for i, u := range c.endpoints {
		out[i] = u.String()
	}
	return out
}

// Root returns the pinned root certificate, or nil if the Client does not pin
// one.
func (c *Client) Root() *x509.Certificate { return c.root }

// response is what do returns besides the decoded data.
type response struct {
	tls *tls.ConnectionState
}

// do sends one request and decodes the JSend envelope: the data of a success
// into out (if not nil), anything else into a *Error. It fails over between
// the endpoints as the package's rule says (failover.go).
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) (response, error) {
	var buf []byte
	if in != nil {
		var err error
		if buf, err = json.Marshal(in); err != nil {
			return response{}, fmt.Errorf("client: encoding the %s %s request: %w", method, path, err)
		}
	}
	n := len(c.endpoints)
	first := int(c.current.Load())
	var urls []string
	var errs []error
	var resp *http.Response
	var target string
	for i := range n {
		idx := (first + i) % n
		u := *c.endpoints[idx]
		u.Path = path
		u.RawQuery = query.Encode()
		var a attempt
		r, err := c.send(a.trace(ctx), method, u.String(), buf)
		if err == nil {
			c.current.Store(int32(idx))
			resp, target = r, u.String()
			break
		}
		if !a.failOver(ctx, method, err) {
			if a.outcomeUnknown(method, err) {
				return response{}, fmt.Errorf("%s %s: %w (%w)", method, u.String(), err, ErrOutcomeUnknown)
			}
			return response{}, fmt.Errorf("%s %s: %w", method, u.String(), err)
		}
		urls, errs = append(urls, u.String()), append(errs, err)
	}
	if resp == nil {
		return response{}, unreachable(method, path, urls, errs)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		if ctx.Err() != nil {
			return response{}, ended(ctx, method, target)
		}
		return response{}, fmt.Errorf("%s %s: reading the response: %w", method, path, err)
	}
	r := response{tls: resp.TLS}
	if len(raw) > maxResponseBytes {
		return r, fmt.Errorf("%s %s: response larger than %d bytes", method, path, maxResponseBytes)
	}
	var env jsend.Response[json.RawMessage]
	if jErr := json.Unmarshal(raw, &env); jErr != nil || env.Status == "" {
		if ctx.Err() != nil {
			// The context ended and the transport handed back what raced
			// its cancellation: a server whose handler stops when the
			// client goes answers an implicit empty 200 to the closing
			// connection. That is the deadline, not an answer.
			return response{}, ended(ctx, method, target)
		}
		// Not a JSend answer (a proxy, another server, a v1-only peer).
		return r, &Error{
			Method: method, Path: path, HTTPStatus: resp.StatusCode,
			Message: notJSend(resp, raw),
		}
	}
	if resp.StatusCode != http.StatusOK || env.Status != jsend.StatusSuccess {
		msg := env.Message
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		return r, &Error{
			Method: method, Path: path, HTTPStatus: resp.StatusCode,
			Status: env.Status, Message: msg, Data: nullToNil(env.Data),
			RetryAfter: retryAfter(resp.Header),
		}
	}
	if out != nil {
		if len(env.Data) == 0 || string(env.Data) == "null" {
			return r, fmt.Errorf("%s %s: the success response carries no data", method, path)
		}
		if err := json.Unmarshal(env.Data, out); err != nil {
			return r, fmt.Errorf("%s %s: decoding the response data: %w", method, path, err)
		}
	}
	return r, nil
}

// ended is the error of a request to target whose context ended before a
// Client API answer arrived. A state-changing request was sent, so whether
// it was applied is unknown.
func ended(ctx context.Context, method, target string) error {
	if !idempotent(method) {
		return fmt.Errorf("%s %s: %w (%w)", method, target, ctx.Err(), ErrOutcomeUnknown)
	}
	return fmt.Errorf("%s %s: %w", method, target, ctx.Err())
}

// send sends one request to target and returns the response, or the
// transport's error (without the *url.Error's repetition of method and
// URL).
func (c *Client) send(ctx context.Context, method, target string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, err
	}
	return resp, nil
}

// notJSend describes a response that is not a JSend envelope.
func notJSend(resp *http.Response, raw []byte) string {
	text := strings.TrimSpace(string(raw))
	if len(text) > 200 {
		text = text[:200] + "..."
	}
	msg := "unexpected response (not a Client API answer)"
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		msg += ", Content-Type " + ct
	}
	if text != "" {
		msg += ": " + text
	}
	return msg
}

func nullToNil(m json.RawMessage) json.RawMessage {
	if len(m) == 0 || string(m) == "null" {
		return nil
	}
	return m
}

// ParseRootPEM returns the root certificate in pemText: its only certificate,
// or the self-signed CA certificate of a chain.
func ParseRootPEM(pemText []byte) (*x509.Certificate, error) {
	certs, err := parseCertificates(pemText)
	if err != nil {
		return nil, err
	}
	if len(certs) == 1 {
		return certs[0], nil
	}
	for _, c := range certs {
		if c.IsCA && c.CheckSignatureFrom(c) == nil {
			return c, nil
		}
	}
	return nil, errors.New("no self-signed root certificate among the PEM certificates")
}

// parseCertificates decodes all CERTIFICATE blocks of pemText.
func parseCertificates(pemText []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := pemText
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing a PEM certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block found")
	}
	return out, nil
}
