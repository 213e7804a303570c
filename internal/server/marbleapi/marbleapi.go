// Package marbleapi serves the Marble API: gRPC over TLS on the mesh
// address, through which a Marble asks the Coordinator to activate it
// (docs/design/behaviour.md#marble-api). It adapts the wire format (api/marblepb) to the
// Coordinator's activation use case, maps refusals to gRPC status codes,
// and bounds what one client can make the server hold.
package marbleapi

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/limit"
	"github.com/quarry-cc/quarry/internal/server/tlscert"
)

// Coordinator is what the Marble API needs from the core.
type Coordinator interface {
	Activate(ctx context.Context, req core.ActivationRequest) (*core.Activation, error)
}

// Limits of the Marble API (see Options for what each bounds and why;
// docs/http.md, "The Marble API").
const (
	// DefaultMaxRecvBytes bounds one activation request. A DCAP quote with
	// its PCK certificate chain is about 5 KiB and a CSR about 1 KiB, so
	// this leaves a margin of 40 times.
	DefaultMaxRecvBytes = 256 << 10
	// DefaultMaxStreams bounds the concurrent activations of one
	// connection. A Marble activates once per connection.
	DefaultMaxStreams = 4
	// DefaultMaxConnections bounds the open connections. A connection over
	// the limit is closed at once, unless its source holds fewer
	// connections than the heaviest source, whose oldest connection then
	// makes room (package limit). With DefaultMaxStreams requests of
	// DefaultMaxRecvBytes each, the requests of all connections together
	// take at most 256 MiB; a connection holding a stream takes about
	// 80 KiB more (TLS, HTTP/2 frames, headers; docs/http.md).
	DefaultMaxConnections = 256
	// DefaultMaxConnectionsPerSource bounds the connections of one source
	// (an IPv4 address or an IPv6 /64): connections from one address,
	// however many, never take more than this many places.
	DefaultMaxConnectionsPerSource = 32
	// DefaultHandshakeTimeout bounds the TLS handshake of a new
	// connection, as the Client API bounds its request headers.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultRequestReadTimeout bounds the time from a new connection to
	// its first complete activation request (handshake, HTTP/2 preface,
	// headers and message), and from a new stream's headers to its
	// request message. A Marble sends its request right after the
	// handshake.
	DefaultRequestReadTimeout = 10 * time.Second
	// DefaultRequestTimeout bounds one activation; one that runs longer
	// (a slow collateral source) is abandoned before it stores anything.
	DefaultRequestTimeout = 105 * time.Second
	// MaxHeaderListBytes bounds the header list of one request (HTTP/2
	// SETTINGS_MAX_HEADER_LIST_SIZE, RFC 9113 section 6.5.2): a Marble
	// sends a few hundred bytes; gRPC's default, 16 MiB, would let each
	// unfinished header block hold that much.
	MaxHeaderListBytes = 8 << 10
	// streamWindow and connWindow are fixed HTTP/2 flow-control windows
	// (RFC 9113 section 6.9): what a client may send ahead of the server
	// reading it, per stream and per connection. Fixed windows turn off
	// gRPC's growth of the windows up to 16 MiB per connection.
	streamWindow = 64 << 10
	connWindow   = 256 << 10

	// templateOutputBudget is the manifest's bound on the bytes one
	// rendering of a Marble's Files and Env templates writes (package
	// manifest, maxTemplateOutput).
	templateOutputBudget = 64 << 20
	// predefinedOverhead covers what the Coordinator adds to the rendered
	// parameters: the MARBLE_PREDEFINED_* certificates and key, the TTLS
	// configuration, and the protobuf framing.
	predefinedOverhead = 4 << 20

	// Keepalive: a connection idle (no activation running) for
	// maxConnectionIdle is closed; every connection is closed after
	// maxConnectionAge, with maxConnectionAgeGrace for a running
	// activation to finish; a silent peer is pinged after pingAfter and
	// dropped if it does not answer within pingTimeout. Clients may ping
	// at most every minPingInterval, and only while an activation runs.
	maxConnectionIdle     = 2 * time.Minute
	maxConnectionAge      = 10 * time.Minute
	maxConnectionAgeGrace = 2 * time.Minute
	pingAfter             = time.Minute
	pingTimeout           = 20 * time.Second
	minPingInterval       = 30 * time.Second
)

// DefaultMaxSendBytes is the default bound of one activation answer:
// what a manifest of the default size (8 MiB) can render.
const DefaultMaxSendBytes = templateOutputBudget + 8<<20 + predefinedOverhead

// MaxSendBytesFor returns the largest activation answer a manifest of at
// most maxManifestBytes can produce: the templates' output budget (64
// MiB), the manifest's own bytes (untemplated files, Argv), and 4 MiB for
// the certificates, key and TTLS configuration the Coordinator adds. An
// answer over the limit fails with ResourceExhausted instead of being
// sent.
func MaxSendBytesFor(maxManifestBytes int64) int {
	return int(min(templateOutputBudget+max(maxManifestBytes, 0)+predefinedOverhead, 1<<31-1))
}

// Options configure the server; zero fields take the defaults above.
type Options struct {
	// MaxRecvBytes bounds one activation request (larger ones fail with
	// ResourceExhausted before the Coordinator sees them).
	MaxRecvBytes int
	// MaxSendBytes bounds one activation answer (see MaxSendBytesFor).
	MaxSendBytes int
	// MaxStreams bounds the concurrent activations per connection.
	MaxStreams uint32
	// MaxConnections bounds the open connections, MaxConnectionsPerSource
	// those of one source (package limit).
	MaxConnections          int
	MaxConnectionsPerSource int
	// SourceKey names a connection's source (limit.SourceKey when nil).
	SourceKey func(net.Addr) string
	// OnRefuse, if set, learns of each connection refused or evicted by
	// the connection limits (for a rate-limited log).
	OnRefuse func(limit.Refusal)
	// HandshakeTimeout bounds a connection's TLS handshake.
	HandshakeTimeout time.Duration
	// RequestReadTimeout bounds the wait for a connection's first request
	// and for each stream's request message.
	RequestReadTimeout time.Duration
	// RequestTimeout bounds one activation.
	RequestTimeout time.Duration
	// Logger receives panics and internal failures (never secrets).
	Logger *slog.Logger
	// Interceptors run around every call, outermost first, outside the
	// panic recovery (metrics: a recovered panic counts as Internal).
	Interceptors []grpc.UnaryServerInterceptor
}

// Server is the Marble API server.
type Server struct {
	c    Coordinator
	opts Options
	log  *slog.Logger
	grpc *grpc.Server

	mu sync.Mutex
	// waiting are the connections that have not yet sent a complete
	// request, by remote address.
	waiting map[string]*meshConn
}

// New returns the Marble API server. cert is called at every handshake
// and returns the Coordinator's current Marble Root certificate (with the
// intermediate key); it changes with updates and recovery.
func New(c Coordinator, cert func() *tls.Certificate, opts Options) *Server {
	opts.MaxRecvBytes = cmp.Or(opts.MaxRecvBytes, DefaultMaxRecvBytes)
	opts.MaxSendBytes = cmp.Or(opts.MaxSendBytes, DefaultMaxSendBytes)
	opts.MaxStreams = cmp.Or(opts.MaxStreams, DefaultMaxStreams)
	opts.MaxConnections = cmp.Or(opts.MaxConnections, DefaultMaxConnections)
	opts.MaxConnectionsPerSource = cmp.Or(opts.MaxConnectionsPerSource, DefaultMaxConnectionsPerSource)
	opts.HandshakeTimeout = cmp.Or(opts.HandshakeTimeout, DefaultHandshakeTimeout)
	opts.RequestReadTimeout = cmp.Or(opts.RequestReadTimeout, DefaultRequestReadTimeout)
	opts.RequestTimeout = cmp.Or(opts.RequestTimeout, DefaultRequestTimeout)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{c: c, opts: opts, log: opts.Logger, waiting: map[string]*meshConn{}}
	interceptors := append([]grpc.UnaryServerInterceptor{s.requestArrived}, opts.Interceptors...)
	s.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(TLSConfig(cert))),
		grpc.MaxRecvMsgSize(opts.MaxRecvBytes),
		grpc.MaxSendMsgSize(opts.MaxSendBytes),
		grpc.MaxConcurrentStreams(opts.MaxStreams),
		grpc.MaxHeaderListSize(MaxHeaderListBytes),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.ConnectionTimeout(opts.HandshakeTimeout),
		grpc.InTapHandle(s.startRequestTimer),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     maxConnectionIdle,
			MaxConnectionAge:      maxConnectionAge,
			MaxConnectionAgeGrace: maxConnectionAgeGrace,
			Time:                  pingAfter,
			Timeout:               pingTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             minPingInterval,
			PermitWithoutStream: false,
		}),
		grpc.ChainUnaryInterceptor(append(slices.Clone(interceptors), s.recoverPanics)...),
	)
	marblepb.RegisterMarbleServer(s.grpc, &service{s: s})
	return s
}

// TLSConfig returns the Marble API's TLS configuration: TLS 1.2 or newer,
// the current Marble Root as the server certificate, and a client
// certificate of any kind required. The client certificate is not
// chain-verified: a Marble's certificate is self-made, and it is bound to
// the Marble by its quote (report data = SHA-256 of the certificate).
//
// A Marble that comes back with a session ticket resumes its TLS session
// while the Marble Root is unchanged (tlscert): the resumed session keeps
// the client certificate whose key the first handshake proved, and saves
// both ECDSA signatures of a full handshake.
func TLSConfig(cert func() *tls.Certificate) *tls.Config {
	return tlscert.Server(&tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAnyClientCert,
		NextProtos: []string{"h2"},
	}, cert)
}

// GetServiceInfo describes the served methods (for metrics that create
// their series up front).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo { return s.grpc.GetServiceInfo() }

// Serve accepts Marble connections on ln, at most MaxConnections at once
// and MaxConnectionsPerSource from one source, until Shutdown; it returns
// nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	lim := limit.NewListener(ln, limit.Options{
		Max:       s.opts.MaxConnections,
		PerSource: s.opts.MaxConnectionsPerSource,
		Key:       s.opts.SourceKey,
		OnRefuse:  s.opts.OnRefuse,
	})
	err := s.grpc.Serve(&firstRequestListener{Listener: lim, s: s})
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// firstRequestListener gives each connection a read deadline until its
// first complete request (meshConn).
type firstRequestListener struct {
	net.Listener
	s *Server
}

func (l *firstRequestListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	mc := &meshConn{Conn: c, s: l.s, key: c.RemoteAddr().String(), first: time.Now().Add(l.s.opts.RequestReadTimeout)}
	l.s.mu.Lock()
	l.s.waiting[mc.key] = mc
	l.s.mu.Unlock()
	mc.applyRead()
	return mc, nil
}

// meshConn is a Marble API connection. Until its first request message
// has arrived, its reads end at first, whatever read deadline gRPC sets
// (gRPC sets one for the handshake and clears it after): a connection
// that never sends a request, or stops halfway through its headers,
// holds its place for at most RequestReadTimeout.
type meshConn struct {
	net.Conn
	s   *Server
	key string

	mu    sync.Mutex
	first time.Time // zero once the first request arrived
	asked time.Time // the read deadline gRPC asked for
}

func (c *meshConn) applyRead() {
	d := c.asked
	if !c.first.IsZero() && (d.IsZero() || c.first.Before(d)) {
		d = c.first
	}
	c.Conn.SetReadDeadline(d)
}

func (c *meshConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = t
	c.applyRead()
	return c.Conn.SetWriteDeadline(t)
}

func (c *meshConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = t
	c.applyRead()
	return nil
}

// arrived lifts the first-request deadline.
func (c *meshConn) arrived() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.first = time.Time{}
	c.applyRead()
}

func (c *meshConn) Close() error {
	c.s.forget(c)
	return c.Conn.Close()
}

func (s *Server) forget(c *meshConn) {
	s.mu.Lock()
	if s.waiting[c.key] == c {
		delete(s.waiting, c.key)
	}
	s.mu.Unlock()
}

// errNoRequest ends a stream whose request message did not arrive in
// time.
var errNoRequest = errors.New("marble API: no request message within the request read timeout")

// requestTimerKey is the context key of a stream's request timer.
type requestTimerKey struct{}

// startRequestTimer runs when a stream's headers have arrived: the stream
// is cancelled unless its request message arrives within
// RequestReadTimeout (requestArrived stops the timer).
func (s *Server) startRequestTimer(ctx context.Context, _ *tap.Info) (context.Context, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(s.opts.RequestReadTimeout, func() { cancel(errNoRequest) })
	return context.WithValue(ctx, requestTimerKey{}, t), nil
}

// requestArrived runs first once a request message has arrived: it stops
// the stream's request timer and lifts the connection's first-request
// deadline.
func (s *Server) requestArrived(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if t, ok := ctx.Value(requestTimerKey{}).(*time.Timer); ok && !t.Stop() {
		return nil, status.Errorf(codes.DeadlineExceeded, "the request message did not arrive within %s; activate again", s.opts.RequestReadTimeout)
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		s.mu.Lock()
		c := s.waiting[p.Addr.String()]
		delete(s.waiting, p.Addr.String())
		s.mu.Unlock()
		if c != nil {
			c.arrived()
		}
	}
	return next(ctx, req)
}

// Shutdown stops accepting connections and waits for running activations
// to finish until ctx ends; then it closes every connection.
func (s *Server) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
		return fmt.Errorf("marble API: activations still running were cut off: %w", ctx.Err())
	}
}

// recoverPanics turns a panic in a handler into an Internal error (the
// server keeps running) and logs it with its stack.
func (s *Server) recoverPanics(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("marble API handler panicked", "method", info.FullMethod, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			resp, err = nil, status.Error(codes.Internal, "internal error; see the Coordinator's log")
		}
	}()
	return next(ctx, req)
}

// service implements the generated MarbleServer.
type service struct {
	marblepb.UnimplementedMarbleServer
	s *Server
}

var _ marblepb.MarbleServer = (*service)(nil)

// Activate activates the calling Marble: the client certificate of the TLS
// handshake and the request go to the Coordinator; its answer becomes the
// Marble's parameters, its refusal a status (codeOf).
func (v *service) Activate(ctx context.Context, req *marblepb.ActivationReq) (*marblepb.ActivationResp, error) {
	s := v.s
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	act, err := s.c.Activate(ctx, core.ActivationRequest{
		Quote:      req.GetQuote(),
		CSR:        req.GetCSR(),
		MarbleType: req.GetMarbleType(),
		UUID:       req.GetUUID(),
		Peer:       peerCertificates(ctx),
	})
	if err != nil {
		return nil, s.statusOf(ctx, err)
	}
	return &marblepb.ActivationResp{Parameters: &marblepb.Parameters{
		Files: act.Files,
		Env:   act.Env,
		Argv:  act.Argv,
	}}, nil
}

// peerCertificates returns the client certificates of the TLS handshake
// (nil without TLS).
func peerCertificates(ctx context.Context) []*x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	return info.State.PeerCertificates
}

// statusOf renders an activation failure. A refusal keeps its message: a
// *core.ActivationError's is written for the Marble (docs/design/behaviour.md#activation-checks),
// and the core's error classes carry messages safe to show. An activation
// abandoned at its deadline says so, and what is known of the state: the
// core stores nothing before it counts the activation, so an activation
// abandoned before that step stored nothing, and one abandoned while
// storing the count says what the store step reported (the core's message
// tells whether the state changed). Anything else is an Internal error
// whose cause only the log gets.
func (s *Server) statusOf(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		s.log.Warn("marble activation abandoned at its deadline", "timeout", s.opts.RequestTimeout.String(), "error", err.Error())
		var ae *core.ActivationError
		if errors.As(err, &ae) && ae.Reason == core.RefusedStore &&
			!errors.Is(err, core.ErrConflict) && !errors.Is(err, core.ErrUnavailable) {
			return status.Error(codes.DeadlineExceeded, fmt.Sprintf(
				"the activation did not finish within %s and was abandoned while storing its activation count; the store reported: %s; activate again", s.opts.RequestTimeout, err.Error()))
		}
		return status.Error(codes.DeadlineExceeded, fmt.Sprintf(
			"the activation did not finish within %s and was abandoned; nothing was stored; activate again", s.opts.RequestTimeout))
	}
	code := codeOf(err)
	if code == codes.Unavailable {
		s.log.Warn("marble activation refused: the shared state store is unavailable", "error", err.Error())
		return status.Error(code, "the Coordinator cannot reach its state store; activate again")
	}
	var ae *core.ActivationError
	if errors.As(err, &ae) || code != codes.Internal {
		return status.Error(code, err.Error())
	}
	s.log.Error("marble activation failed", "error", err.Error())
	return status.Error(codes.Internal, "internal error; see the Coordinator's log")
}

// codeOf maps the class of a refused activation to its gRPC code
// (docs/design/behaviour.md#activation-checks). It is the only error→code map of the Marble API.
func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, core.ErrWrongState):
		return codes.FailedPrecondition
	case errors.Is(err, core.ErrUnauthenticated):
		return codes.Unauthenticated
	case errors.Is(err, core.ErrForbidden):
		return codes.PermissionDenied
	case errors.Is(err, core.ErrInvalidRequest):
		return codes.InvalidArgument
	case errors.Is(err, core.ErrConflict):
		// A concurrent change (an update during the activation): the
		// Marble may activate again.
		return codes.Aborted
	case errors.Is(err, core.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, core.ErrTooLarge):
		// The change would take the state beyond a limit (e.g. too many
		// monotonic counters); the message names it.
		return codes.ResourceExhausted
	case errors.Is(err, core.ErrUnavailable):
		// The shared store cannot be reached (the outcome may be unknown), and
		// the Marble may activate again (here or on another instance).
		return codes.Unavailable
	}
	return codes.Internal
}
