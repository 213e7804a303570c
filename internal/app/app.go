// Package app is the composition root: it builds the Coordinator from the
// configuration with concrete backends (file store, simulation sealing,
// the attestation issuer and the DCAP quote verifier) and runs its servers.
package app

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/quarry-cc/quarry/internal/admission"
	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/metrics"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/server/marbleapi"
	"github.com/quarry-cc/quarry/internal/server/rest"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
)

// File names in the seal directory (docs/design/behaviour.md#sealed-state).
const (
	SealedDataFile = "sealed_data"
	SealedKeyFile  = "sealed_key"
)

// Timeouts of the Client API.
const (
	// shutdownTimeout bounds the graceful shutdown.
	shutdownTimeout = 10 * time.Second
	// writeTimeout bounds the reading of a request's body, its handling and
	// the writing of its answer.
	writeTimeout = 2 * time.Minute
	// readTimeout bounds the reading of a request, headers and body.
	readTimeout = 2 * time.Minute
	// requestTimeout is the deadline of a request's context: shorter than
	// writeTimeout, so that the Coordinator abandons a use case (and stores
	// nothing) while its answer can still be written, instead of storing a
	// state whose answer never arrives.
	requestTimeout = writeTimeout - 15*time.Second
	// http2MaxStreams bounds the concurrent requests of one HTTP/2
	// connection.
	http2MaxStreams = 32
)

// App is a configured Coordinator ready to run.
type App struct {
	cfg  config.Config
	log  *slog.Logger
	core *core.Core // nil until the state is loaded (store etcd: by Run)
	// unlock releases the store (the seal directory, or the connection to
	// etcd); nil until the store is taken.
	unlock func() error
	etcd   *etcdstore.Client // with store etcd (store.go)
	peer   *peerState        // with store etcd (peer.go)
	// quoter issues this instance's quotes, sealer seals the data key,
	// verifier verifies quotes (nil without a collateral source).
	quoter   attest.Issuer
	sealer   seal.KeySealer
	verifier core.QuoteVerifier

	// Metrics and health (metrics.go).
	hooks      metricsHooks
	metrics    *metrics.Metrics // nil without a metrics address
	probe      *metrics.Probe
	collateral *collateral.Cache // nil without a collateral source
}

// New builds the Coordinator. With the file store it takes the seal
// directory (exclusively), loads the sealed state and applies the startup
// manifest if one is set. With store etcd it prepares what needs no store
// and leaves the rest to Run, which listens meanwhile (starting.go).
func New(ctx context.Context, cfg config.Config, log *slog.Logger) (*App, error) {
	a := &App{cfg: cfg, log: log}
	if a.shared() {
		if err := a.prepare(ctx); err != nil {
			return nil, err
		}
		return a, nil
	}
	data, key, unlock, err := a.openFiles() // store.go
	if err != nil {
		return nil, err
	}
	a.unlock = unlock
	if err := a.prepare(ctx); err != nil {
		unlock()
		return nil, err
	}
	if err := a.loadCore(ctx, data, key); err != nil {
		unlock()
		return nil, err
	}
	if err := a.applyStartupManifest(ctx); err != nil {
		unlock()
		return nil, err
	}
	return a, nil
}

// shared reports whether the state is kept in etcd, shared with other
// instances.
func (a *App) shared() bool { return a.cfg.Store.Kind == config.StoreEtcd }

// release gives the store back (nothing when it was never taken).
func (a *App) release() {
	if a.unlock != nil {
		a.unlock()
	}
}

// tightenSealDir makes an existing seal directory accessible to its owner
// only: the sealed state is for the Coordinator alone (in simulation its
// data key lies unprotected in sealed_key). A directory with group or other
// permission bits is set to 0700 with a warning naming the old mode; if
// that fails, the warning says so and the Coordinator goes on (the files
// it writes are 0600).
func tightenSealDir(dir string, log *slog.Logger) {
	info, err := os.Stat(dir)
	if err != nil || !info.IsDir() {
		return // MkdirAll made it, or LockDir reports the problem
	}
	old := info.Mode().Perm()
	if old&0o077 == 0 {
		return
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		log.Warn("the seal directory is accessible to other users and its permissions cannot be tightened",
			"dir", dir, "mode", fmt.Sprintf("%04o", old), "error", err.Error())
		return
	}
	log.Warn("the seal directory was accessible to other users; permissions tightened",
		"dir", dir, "oldMode", fmt.Sprintf("%04o", old), "newMode", "0700")
}

// prepare makes what needs no store: the quote issuer and verifier, the
// key sealer and, with store etcd, the check of how the data key may be
// shared and the peer key transfer.
func (a *App) prepare(ctx context.Context) error {
	issuer, err := a.issuer()
	if err != nil {
		return err
	}
	verifier, err := a.quoteVerifier()
	if err != nil {
		return err
	}
	sealer, err := a.keySealer(issuer)
	if err != nil {
		return err
	}
	a.quoter, a.verifier, a.sealer = issuer, verifier, sealer
	if a.shared() {
		if err := a.checkSharedKey(); err != nil { // store.go
			return err
		}
		if err := a.setupPeer(ctx, issuer); err != nil { // peer.go
			return err
		}
	}
	enclave := seal.ProtectsKey(sealer)
	switch {
	case a.cfg.EnableV1Recover && enclave:
		a.log.Warn("the unprefixed v1 POST /recover is enabled (QUARRY_ENABLE_V1_RECOVER), but a Coordinator in an enclave refuses every recovery secret without a signature: use POST /api/v2/recover")
	case a.cfg.EnableV1Recover:
		a.log.Warn("the unprefixed v1 POST /recover is enabled: it accepts recovery secrets without a signature (QUARRY_ENABLE_V1_RECOVER)")
	}
	if enclave && a.cfg.MigrateMarbleRun == core.MigrateMarbleRunOn {
		a.log.Warn("migration of MarbleRun states is on in an enclave (QUARRY_MIGRATE_MARBLERUN=1): a MarbleRun sealed_data is migrated only after MarbleRun's signed recovery; a raw data key in sealed_key is never taken")
	}
	return nil
}

// loadCore makes the Coordinator on the stores data and key (its state
// loaded), its probe and metrics.
func (a *App) loadCore(ctx context.Context, data, key store.Store) error {
	dns, ips := a.cfg.SplitNames()
	marker, err := a.restoreMarker() // logstore.go
	if err != nil {
		return err
	}
	opts := core.Options{
		Names:     ca.Names{DNS: dns, IPs: ips},
		Data:      data,
		Key:       key,
		KeySealer: a.sealer,
		// A MarbleRun state: see docs/migration.md, "The enclave rule".
		MigrateMarbleRun: a.cfg.MigrateMarbleRun,
		// Update log segments beside the state (logstore.go).
		LogSegments: a.logSegments(),
		Issuer:      a.quoter,
		Logger:      a.log,

		QuoteVerifier: a.verifier,

		RecoveryTimeout:   a.cfg.RecoveryTimeout,
		StoreTimeout:      a.cfg.Store.Timeout,
		MaxStateBytes:     int(a.cfg.MaxStateBytes),
		AllowQuoteFailure: a.cfg.DevMode,
		SecretLimits:      secrets.Limits{MaxSecrets: a.cfg.MaxSecrets, MaxWork: a.cfg.MaxSecretGeneration},
		CounterLimits: core.CounterLimits{MaxPerMarble: a.cfg.MaxCountersPerMarble,
			MaxNameBytes: a.cfg.MaxCounterName, MaxTotal: a.cfg.MaxCounters},
		// Every activation attempt is logged by the core itself.
		ActivationEvents: activationEvents(a.cfg.ActivationEvents),
		OnActivation:     a.hooks.onActivation,
		OnCommit:         a.hooks.onCommit,

		// The marker of a restore from a backup (core/restored.go).
		RestoreMarker: marker,
	}
	a.peerOptions(&opts) // peer.go
	c, err := core.New(ctx, opts)
	if err != nil {
		return err
	}
	a.core = c
	a.initMetrics()
	return nil
}

// activationEvents translates the configured number of kept activation
// events (0: none) to the core's option (0: the default; negative: none).
func activationEvents(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// applyStartupManifest sets EDG_STARTUP_MANIFEST when no state exists. With
// saved state the saved state wins, and the log says whether it matches
// (docs/design/decisions.md#d10). In recovery mode it is not applied: that would replace
// the unrecovered state without an operator's decision.
func (a *App) applyStartupManifest(ctx context.Context) error {
	if a.cfg.StartupManifest == "" {
		return nil
	}
	raw, err := os.ReadFile(a.cfg.StartupManifest)
	if err != nil {
		return fmt.Errorf("reading startup manifest: %w", err)
	}
	sum := sha256.Sum256(raw)
	fp := hex.EncodeToString(sum[:])
	switch a.core.Status() {
	case core.StateAcceptingManifest:
		if _, err := a.core.SetManifest(ctx, raw); a.startupManifestRace(err) {
			a.log.Info("another instance set a manifest first; the startup manifest is not applied", "file", a.cfg.StartupManifest)
			return nil
		} else if err != nil {
			return fmt.Errorf("setting startup manifest %s: %w", a.cfg.StartupManifest, err)
		}
		a.log.Info("startup manifest set", "file", a.cfg.StartupManifest, "manifestFingerprint", fp)
	case core.StateAcceptingMarbles:
		m, err := a.core.Manifest()
		if err != nil {
			return err
		}
		a.log.Info("saved state found; the startup manifest is not applied",
			"file", a.cfg.StartupManifest, "matchesSavedManifest", m.Fingerprint == fp)
	case core.StateRecovery:
		a.log.Warn("in recovery mode; the startup manifest is not applied (recover, or set a manifest through the API)",
			"file", a.cfg.StartupManifest)
	}
	return nil
}

// Run serves the Client API and the Marble API until ctx is cancelled, then
// shuts both down gracefully and releases the store. If either server
// fails, the other is shut down too and Run returns the failure. With store
// etcd it listens at once and loads the state meanwhile (starting.go):
// until then both APIs answer that the Coordinator is starting; a start
// that cannot succeed (a wrong configuration) ends Run with its reason.
func (a *App) Run(ctx context.Context) error {
	limits := a.admitClients() // limits.go: raises and logs the file descriptor limit
	ls, err := a.listen()
	if err != nil {
		a.release()
		return err
	}
	admitted := admission.NewListener(ls.client, limits) // connections per source and in all
	// With the file store the state is loaded (New); with store etcd it
	// is loaded while the servers answer that the Coordinator is starting.
	live := a.core != nil
	st := newStartStatus()
	g, err := a.newGate(st, !live) // starting.go
	if err != nil {
		admitted.Close()
		ls.close()
		a.release()
		return err
	}
	ln := rest.GuardPlainHTTP(admitted) // plain HTTP gets a JSend 400, not net/http's text
	// Every goroutine of Run's own ends before Run returns: those that
	// live as long as Run (the admission log, following the other
	// instances) run under bg, cancelled and waited for at shutdown.
	bg := newBackground(ctx)
	bg.Go(func(ctx context.Context) { a.logAdmission(ctx, admitted) })
	bodyMem, bodyMemSource := bodyMemory(readSystemFile)
	srv := &http.Server{
		Handler:           g.clientHandler(),
		TLSConfig:         rest.TLSConfig(g.clientCertificate),
		ReadHeaderTimeout: clientHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       2 * time.Minute,
		// Well above the documented limit (rest.MaxHeaderBytes), which the
		// handler enforces with a JSend 431; net/http's own plain-text
		// 431 is left for requests far over it.
		MaxHeaderBytes: 16 * rest.MaxHeaderBytes,
		// "OPTIONS *" goes to the handler (a JSend 404) instead of
		// net/http's empty 200.
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     slog.NewLogLogger(a.log.Handler(), a.cfg.HTTPErrorLogLevel),

		// Connections in a request are never evicted for a newcomer.
		ConnState: admitted.ConnState,
		HTTP2: &http.HTTP2Config{
			// Few concurrent requests per connection, and little buffered
			// body per stream and connection: one client must not make
			// the Coordinator buffer much (docs/design/decisions.md#d16).
			MaxConcurrentStreams:          http2MaxStreams,
			MaxReceiveBufferPerStream:     256 << 10,
			MaxReceiveBufferPerConnection: 1 << 20,
		},
	}
	mesh := marbleapi.New(g, g.marbleCertificate, marbleapi.Options{
		MaxSendBytes:            marbleapi.MaxSendBytesFor(a.cfg.MaxManifestBytes),
		MaxConnections:          a.cfg.Mesh.MaxConnections,
		MaxConnectionsPerSource: a.cfg.Mesh.MaxConnectionsPerSource,
		OnRefuse:                a.refusalLog("marble API"), // limits.go
		RequestTimeout:          requestTimeout,
		Logger:                  a.log,
		Interceptors:            []grpc.UnaryServerInterceptor{g.intercept},
	})
	serving := servingOptions{bodyMemory: bodyMem, maxRequestsPerSource: limits.MaxPerSource}

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var loaded chan error
	stopPeer := func() {}
	if live {
		if stopPeer, err = a.goLive(bg, g, mesh, serving); err != nil {
			bg.stop()
			admitted.Close()
			ls.close()
			a.release()
			return err
		}
	} else {
		loaded = make(chan error, 1)
		go func() { loaded <- a.startShared(loadCtx, st) }()
	}
	stopMetrics := a.serveMetrics(ls.metrics, g.metricsHandler())

	clientErr, meshErr := make(chan error, 1), make(chan error, 1)
	go func() { clientErr <- srv.ServeTLS(ln, "", "") }()
	go func() { meshErr <- mesh.Serve(ls.mesh) }()
	a.log.Info("marble API listening", "addr", ls.mesh.Addr().String())
	if live {
		a.log.Info("client API listening", "addr", ln.Addr().String(), "state", int(a.core.Status()),
			"requestBodyMemory", bodyMem, "requestBodyMemorySource", bodyMemSource)
		a.log.Info("state loaded; serving", "state", int(a.core.Status()))
	} else {
		a.log.Info("client API listening", "addr", ln.Addr().String(), "starting", true,
			"requestBodyMemory", bodyMem, "requestBodyMemorySource", bodyMemSource)
	}

	var failure error
	start := time.Now()
	for stop := false; !stop; {
		select {
		case err := <-loaded:
			loaded = nil // received
			if err != nil {
				if ctx.Err() == nil {
					failure = &StartError{Err: err}
				}
				a.log.Info("shutting down")
				stop = true
				break
			}
			stopServing, err := a.goLive(bg, g, mesh, serving)
			if err != nil {
				failure = &StartError{Err: err}
				a.log.Info("shutting down")
				stop = true
				break
			}
			stopPeer = stopServing
			a.log.Info("state loaded; serving", "state", int(a.core.Status()), "after", time.Since(start).String())
		case err := <-clientErr:
			failure = fmt.Errorf("client API: %w", err)
			clientErr <- nil // already ended
			a.log.Error("a server failed; shutting down the other", "error", failure.Error())
			stop = true
		case err := <-meshErr:
			// Serve returns nil only after Shutdown, which has not happened.
			failure = fmt.Errorf("marble API: %w", cmp.Or(err, errors.New("stopped serving")))
			meshErr <- nil
			a.log.Error("a server failed; shutting down the other", "error", failure.Error())
			stop = true
		case <-ctx.Done():
			a.log.Info("shutting down")
			stop = true
		}
	}
	stopLoad()
	shutErr := a.shutdown(srv, mesh, clientErr, meshErr)
	stopPeer()
	bg.stop() // before the store is released: Follow reads it
	released := true
	if loaded != nil {
		// The start under way ends with ctx (a step with etcd returns at
		// once; a peer key transfer or a quote within their own bounds).
		select {
		case <-loaded:
		case <-time.After(shutdownTimeout):
			a.log.Warn("the start under way did not end within the shutdown timeout; the store is left to the process exit")
			released = false
		}
	}
	mctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	metricsErr := stopMetrics(mctx)
	if released {
		a.release()
	}
	return errors.Join(failure, shutErr, metricsErr)
}

// StartError is Run's error when a start on a shared store ended for a
// reason waiting does not cure (docs/ha.md, "Starting while etcd is
// unreachable"): the Coordinator did not start.
type StartError struct{ Err error }

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// goLive serves the loaded Coordinator through the gate: the Client API's
// handler and certificate, the Marble API's certificate and activations,
// the metrics, and the peer key server (its listener is opened only now:
// before, another instance that dials it is refused at once instead of
// waiting); with a shared store it follows the other instances. It
// returns the peer key server's stop.
func (a *App) goLive(bg *background, g *gate, mesh *marbleapi.Server, so servingOptions) (stopPeer func(), err error) {
	peerLn, err := a.listenPeer() // peer.go
	if err != nil {
		return nil, err
	}
	bg.Go(a.core.Follow) // with a shared store: follow the other instances
	var fresh *freshness // with a shared store: every handshake presents the newest state's certificates
	if a.core.Shared() {
		fresh = &freshness{s: a.core, timeout: a.cfg.Store.Timeout}
	}
	handler := rest.New(a.core, rest.Options{
		MaxManifestBytes: a.cfg.MaxManifestBytes,
		EnableV1Recover:  a.cfg.EnableV1Recover,
		RequestTimeout:   requestTimeout,
		BodyMemory:       so.bodyMemory,
		Logger:           a.log,
		Metrics:          a.restMetrics(),
		Readiness:        a.probe,
		Console:          a.consoleHandler(), // console.go

		// Bodies keep a minimum rate and arrive within the read timeout;
		// requests in progress are bounded per source like connections.
		MinBodyRate:          a.cfg.Client.MinBodyRate,
		BodyGrace:            a.cfg.Client.BodyGrace,
		BodyTimeout:          readTimeout,
		MaxRequestsPerSource: so.maxRequestsPerSource,
	})
	l := &liveServers{
		core:       a.core,
		client:     a.syncing(handler, fresh), // store.go
		clientCert: freshCertificate(fresh, a.core.TLSCertificate),
		marbleCert: freshCertificate(fresh, a.core.MarbleTLSCertificate),
	}
	if a.metrics != nil {
		a.metrics.InitializeGRPC(mesh)
		l.metrics = metrics.Handler(a.metrics.Registry(), a.core, a.probe, a.log)
		l.intercept = a.metrics.GRPCInterceptor()
	}
	stopPeer = a.servePeer(peerLn, a.verifier) // peer.go
	g.live.Store(l)
	return stopPeer, nil
}

// background runs the goroutines that live as long as Run: stop cancels
// their context and waits until every one has returned.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newBackground(parent context.Context) *background {
	ctx, cancel := context.WithCancel(parent)
	return &background{ctx: ctx, cancel: cancel}
}

// Go runs f in a goroutine with the background's context.
func (b *background) Go(f func(ctx context.Context)) { b.wg.Go(func() { f(b.ctx) }) }

// stop cancels the goroutines' context and waits for them.
func (b *background) stop() {
	b.cancel()
	b.wg.Wait()
}

// servingOptions are what Run decided for the Client API that the
// Coordinator's handler needs once the state is loaded.
type servingOptions struct {
	bodyMemory           int64
	maxRequestsPerSource int
}

// listeners are the App's open listeners (metrics nil: not configured).
type listeners struct {
	client, mesh, metrics net.Listener
}

// listen opens every listener, or none.
func (a *App) listen() (*listeners, error) {
	ls := &listeners{}
	var err error
	if ls.client, err = net.Listen("tcp", a.cfg.ClientAddr); err != nil {
		return nil, fmt.Errorf("client API: %w", err)
	}
	if ls.mesh, err = net.Listen("tcp", a.cfg.MeshAddr); err != nil {
		ls.close()
		return nil, fmt.Errorf("marble API: %w", err)
	}
	if ls.metrics, err = a.listenMetrics(); err != nil { // metrics.go
		ls.close()
		return nil, err
	}
	return ls, nil
}

func (ls *listeners) close() {
	for _, ln := range []net.Listener{ls.client, ls.mesh, ls.metrics} {
		if ln != nil {
			ln.Close()
		}
	}
}

// shutdown stops both servers gracefully within shutdownTimeout: running
// requests and activations finish, new ones are refused; whatever still runs
// then is cut off.
func (a *App) shutdown(srv *http.Server, mesh *marbleapi.Server, clientErr, meshErr <-chan error) error {
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var clientShut, meshShut error
	wg.Go(func() {
		if clientShut = srv.Shutdown(sctx); clientShut != nil {
			srv.Close()
			clientShut = fmt.Errorf("client API shutdown: %w", clientShut)
		}
	})
	wg.Go(func() { meshShut = mesh.Shutdown(sctx) })
	wg.Wait()
	errs := []error{clientShut, meshShut}
	if err := <-clientErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		errs = append(errs, fmt.Errorf("client API: %w", err))
	}
	if err := <-meshErr; err != nil {
		errs = append(errs, fmt.Errorf("marble API: %w", err))
	}
	return errors.Join(errs...)
}
