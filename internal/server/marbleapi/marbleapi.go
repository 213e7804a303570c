// Package marbleapi serves the Marble API: gRPC over TLS on the mesh
// address, through which a Marble asks the Coordinator to activate it
// (behaviour.md §11). It adapts the wire format (api/marblepb) to the
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
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/core"
)

// Coordinator is what the Marble API needs from the core.
type Coordinator interface {
	Activate(ctx context.Context, req core.ActivationRequest) (*core.Activation, error)
}

// Limits of the Marble API (see Options for what each bounds and why).
const (
	// DefaultMaxRecvBytes bounds one activation request. A DCAP quote with
	// its PCK certificate chain is about 5 KiB and a CSR about 1 KiB, so
	// this leaves a margin of 40 times; it also keeps the request memory
	// of all connections together (DefaultMaxConnections ×
	// DefaultMaxStreams × 256 KiB = 256 MiB) at the Client API's default
	// request body memory.
	DefaultMaxRecvBytes = 256 << 10
	// DefaultMaxStreams bounds the concurrent activations of one
	// connection. A Marble activates once per connection.
	DefaultMaxStreams = 4
	// DefaultMaxConnections bounds the open connections. Connections over
	// the limit wait in the kernel's accept queue until one closes (a
	// burst of Marbles starting together is delayed, not refused).
	DefaultMaxConnections = 256
	// DefaultHandshakeTimeout bounds the TLS handshake of a new
	// connection, as the Client API bounds its request headers.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultRequestTimeout bounds one activation; one that runs longer
	// (a slow collateral source) is abandoned before it stores anything.
	DefaultRequestTimeout = 105 * time.Second

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
	// MaxConnections bounds the open connections.
	MaxConnections int
	// HandshakeTimeout bounds a connection's TLS handshake.
	HandshakeTimeout time.Duration
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
	c     Coordinator
	opts  Options
	log   *slog.Logger
	grpc  *grpc.Server
	limit int
}

// New returns the Marble API server. cert is called at every handshake
// and returns the Coordinator's current Marble Root certificate (with the
// intermediate key); it changes with updates and recovery.
func New(c Coordinator, cert func() *tls.Certificate, opts Options) *Server {
	opts.MaxRecvBytes = cmp.Or(opts.MaxRecvBytes, DefaultMaxRecvBytes)
	opts.MaxSendBytes = cmp.Or(opts.MaxSendBytes, DefaultMaxSendBytes)
	opts.MaxStreams = cmp.Or(opts.MaxStreams, DefaultMaxStreams)
	opts.MaxConnections = cmp.Or(opts.MaxConnections, DefaultMaxConnections)
	opts.HandshakeTimeout = cmp.Or(opts.HandshakeTimeout, DefaultHandshakeTimeout)
	opts.RequestTimeout = cmp.Or(opts.RequestTimeout, DefaultRequestTimeout)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{c: c, opts: opts, log: opts.Logger, limit: opts.MaxConnections}
	s.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(TLSConfig(cert))),
		grpc.MaxRecvMsgSize(opts.MaxRecvBytes),
		grpc.MaxSendMsgSize(opts.MaxSendBytes),
		grpc.MaxConcurrentStreams(opts.MaxStreams),
		grpc.ConnectionTimeout(opts.HandshakeTimeout),
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
		grpc.ChainUnaryInterceptor(append(slices.Clone(opts.Interceptors), s.recoverPanics)...),
	)
	marblepb.RegisterMarbleServer(s.grpc, &service{s: s})
	return s
}

// TLSConfig returns the Marble API's TLS configuration: TLS 1.2 or newer,
// the current Marble Root as the server certificate, and a client
// certificate of any kind required. The client certificate is not
// chain-verified: a Marble's certificate is self-made, and it is bound to
// the Marble by its quote (report data = SHA-256 of the certificate).
func TLSConfig(cert func() *tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cert(), nil
		},
	}
}

// GetServiceInfo describes the served methods (for metrics that create
// their series up front).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo { return s.grpc.GetServiceInfo() }

// Serve accepts Marble connections on ln, at most MaxConnections at once,
// until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	err := s.grpc.Serve(netutil.LimitListener(ln, s.limit))
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
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
// *core.ActivationError's is written for the Marble (behaviour.md §11.3),
// and the core's error classes carry messages safe to show. An activation
// abandoned at its deadline says so. Anything else is an Internal error
// whose cause only the log gets.
func (s *Server) statusOf(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		s.log.Warn("marble activation abandoned at its deadline", "timeout", s.opts.RequestTimeout.String(), "error", err.Error())
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
// (behaviour.md §11.3). It is the only error→code map of the Marble API.
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
