package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/metrics"
	"github.com/quarry-cc/quarry/internal/server/rest"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
)

// The start on a shared store (docs/ha.md, "Starting while etcd is
// unreachable"). Run
// listens at once and serves a gate: until the state is loaded the health
// endpoints answer, readiness says why the Coordinator is not ready, every
// other Client API request gets 503 with Retry-After and every Marble
// activation the gRPC code Unavailable, under a temporary certificate.
// Meanwhile it connects to etcd, joins the instances and loads the state,
// trying again for as long as etcd cannot be reached. Once the state is
// loaded the gate serves the Coordinator, in the same process.

// Start policy with store etcd.
const (
	// startBackoff is the wait after the first failed attempt; it doubles
	// after each further one up to maxStartBackoff (etcdstore.Connect's
	// own policy for the connect).
	startBackoff    = 250 * time.Millisecond
	maxStartBackoff = 5 * time.Second
	// loadTimeout bounds the load of the state (a peer key transfer, up
	// to 30 s, included) before it is tried again.
	loadTimeout = time.Minute
	// retriesLogged failed attempts are each logged; after them one a
	// minute (retryLogEvery), so that a long outage does not flood the log.
	retriesLogged = 8
	retryLogEvery = time.Minute
)

// startStatus is where a start on a shared store stands: the readiness
// probe until the state is loaded.
type startStatus struct {
	now func() time.Time

	mu      sync.Mutex
	step    string    // what runs now
	failed  int       // attempts failed so far
	cause   string    // the last failure, safe to show ("" before one)
	next    time.Time // when the next attempt starts
	lastLog time.Time // of the last retry logged
}

func newStartStatus() *startStatus {
	return &startStatus{now: time.Now, step: "connecting to etcd"}
}

// set records the step under way.
func (s *startStatus) set(step string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.step = step
}

// fail records a failed attempt whose next one starts after wait; it
// returns the attempt's number and whether to log it.
func (s *startStatus) fail(cause string, wait time.Duration) (attempt int, log bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed++
	s.cause = cause
	now := s.now()
	s.next = now.Add(wait)
	if s.failed <= retriesLogged || now.Sub(s.lastLog) >= retryLogEvery {
		s.lastLog = now
		return s.failed, true
	}
	return s.failed, false
}

// reason says why the Coordinator is not ready yet (safe to show: etcd's
// endpoints and errors are only in the log).
func (s *startStatus) reason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cause == "" {
		return "starting: " + s.step
	}
	if wait := s.next.Sub(s.now()); wait > 0 {
		return fmt.Sprintf("waiting for etcd: %s; attempt %d, next in %ds", s.cause, s.failed, int((wait+time.Second-1)/time.Second))
	}
	return fmt.Sprintf("waiting for etcd: %s; attempt %d, attempt %d under way (%s)", s.cause, s.failed, s.failed+1, s.step)
}

// Ready is the readiness probe while the state is not loaded: never ready.
func (s *startStatus) Ready(context.Context) (core.State, error) {
	return core.StateUninitialized, &metrics.NotReadyError{State: core.StateUninitialized, Reason: s.reason()}
}

// publicCause describes a failure to reach etcd in words safe to show on
// the unauthenticated readiness endpoints: no endpoint, address or
// certificate detail (those are in the log).
func publicCause(err error) string {
	// etcd's own errors (its client's rpctypes.EtcdError) carry a code
	// and a fixed message such as "etcdserver: no leader".
	var etcdErr interface {
		error
		Code() codes.Code
	}
	switch {
	case errors.Is(err, etcdstore.ErrTLS):
		return "TLS with etcd failed (a wrong CA, client certificate or scheme? the log has the cause)"
	case errors.Is(err, etcdstore.ErrUnreachable):
		return "no etcd endpoint answered"
	case errors.Is(err, context.DeadlineExceeded):
		return "etcd did not answer in time"
	case errors.As(err, &etcdErr):
		return "etcd answered " + etcdErr.Error()
	}
	return "etcd could not be used (the log has the cause)"
}

// startShared connects to etcd, joins the instances and loads the state,
// and tries again after every failure etcd caused (core.ErrUnavailable,
// or etcd unreachable) until ctx ends. Any other failure ends the start
// with its reason: TLS with etcd refused etcdstore.TLSAttempts times in a
// row, a different instance on the prefix, the sealer, the attestation,
// a startup manifest that cannot be read or is refused.
func (a *App) startShared(ctx context.Context, st *startStatus) error {
	wait := startBackoff
	for {
		err := a.tryStartShared(ctx, st)
		if err == nil || ctx.Err() != nil || !errors.Is(err, core.ErrUnavailable) {
			return err
		}
		a.retrying(st, err, wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = min(2*wait, maxStartBackoff)
	}
}

// retrying records and (see retriesLogged) logs a failed attempt.
func (a *App) retrying(st *startStatus, err error, wait time.Duration) {
	if attempt, log := st.fail(publicCause(err), wait); log {
		a.log.Warn("etcd does not answer yet; retrying", "attempt", attempt, "retryIn", wait.String(), "error", err.Error())
	}
}

// tryStartShared is one start on etcd: the connect (which itself tries
// until etcd answers), the join and the load. On a failure it gives the
// connection back.
func (a *App) tryStartShared(ctx context.Context, st *startStatus) error {
	st.set("connecting to etcd")
	cli, err := a.connectEtcd(ctx, func(err error, wait time.Duration) { a.retrying(st, err, wait) })
	if err != nil {
		return err
	}
	data, key, err := etcdStores(cli)
	if err != nil {
		cli.Close()
		return err
	}
	a.etcd = cli
	a.enableCompaction(cli) // store.go
	st.set("joining the instances in etcd")
	err = a.joinShared(ctx)
	if err == nil {
		st.set("loading the state from etcd")
		lctx, cancel := context.WithTimeout(ctx, loadTimeout)
		err = a.loadCore(lctx, data, key)
		cancel()
	}
	if err == nil {
		// Not under loadTimeout: a manifest's secrets may take long to
		// make (--max-secret-generation); its steps with etcd are bounded
		// by the store timeout.
		st.set("applying the startup manifest")
		err = a.applyStartupManifest(ctx)
	}
	if err != nil {
		cli.Close()
		a.etcd, a.core = nil, nil
		return err
	}
	a.unlock = cli.Close
	return nil
}

// gate is what the servers serve: the starting answers until the state is
// loaded, then the Coordinator. Each request, handshake and activation
// looks once which of the two it gets.
type gate struct {
	live atomic.Pointer[liveServers]
	// temporary is the certificate of both APIs while no state is loaded.
	temporary                       *tls.Certificate
	startingClient, startingMetrics http.Handler
}

// liveServers is what the gate serves once the state is loaded.
type liveServers struct {
	core                   *core.Core
	client                 http.Handler
	metrics                http.Handler // nil without a metrics listener
	clientCert, marbleCert func() *tls.Certificate
	intercept              grpc.UnaryServerInterceptor // nil without metrics
}

// newGate makes the gate; the temporary certificate only when the gate
// will serve before the state is loaded (starting).
func (a *App) newGate(st *startStatus, starting bool) (*gate, error) {
	g := &gate{
		startingClient:  rest.Starting(st, a.log),
		startingMetrics: metrics.Handler(prometheus.NewRegistry(), noEvents{}, st, a.log),
	}
	if starting {
		dns, ips := a.cfg.SplitNames()
		cert, err := temporaryCertificate(dns, ips, time.Now())
		if err != nil {
			return nil, fmt.Errorf("the temporary certificate: %w", err)
		}
		g.temporary = cert
	}
	return g, nil
}

func (g *gate) clientHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l := g.live.Load(); l != nil {
			l.client.ServeHTTP(w, r)
			return
		}
		g.startingClient.ServeHTTP(w, r)
	})
}

func (g *gate) metricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l := g.live.Load(); l != nil && l.metrics != nil {
			l.metrics.ServeHTTP(w, r)
			return
		}
		g.startingMetrics.ServeHTTP(w, r)
	})
}

func (g *gate) clientCertificate() *tls.Certificate {
	if l := g.live.Load(); l != nil {
		return l.clientCert()
	}
	return g.temporary
}

func (g *gate) marbleCertificate() *tls.Certificate {
	if l := g.live.Load(); l != nil {
		return l.marbleCert()
	}
	return g.temporary
}

// errStarting refuses an activation before the state is loaded: the
// Marble gets Unavailable and activates again.
var errStarting = fmt.Errorf("%w: the Coordinator is starting and has not loaded its state yet", core.ErrUnavailable)

// Activate is the Marble API's activation: refused until the state is
// loaded.
func (g *gate) Activate(ctx context.Context, req core.ActivationRequest) (*core.Activation, error) {
	if l := g.live.Load(); l != nil {
		return l.core.Activate(ctx, req)
	}
	return nil, errStarting
}

// intercept runs the metrics' interceptor once there are metrics.
func (g *gate) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if l := g.live.Load(); l != nil && l.intercept != nil {
		return l.intercept(ctx, req, info, next)
	}
	return next(ctx, req)
}

// noEvents is the activation event log before the state is loaded.
type noEvents struct{}

func (noEvents) ActivationEvents() ([]core.ActivationEvent, uint64) { return nil, 0 }

// temporaryCertificate makes the certificate both APIs present while no
// state is loaded. It is self-signed by a fresh P-256 key that exists only
// in this process's memory, it is not a CA (it signs nothing), and it is
// never presented again once the state is loaded: no client can take it
// for the Coordinator's root or pin it. A client that verifies the
// Coordinator (its root, or its quote) refuses it; one that does not
// learns only that the Coordinator is starting.
func temporaryCertificate(dns []string, ips []net.IP, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "Quarry Coordinator (starting; temporary certificate)"},
		// Its validity does not matter: nothing trusts it.
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
		DNSNames:              append([]string{"localhost"}, dns...),
		IPAddresses:           append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, ips...),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
