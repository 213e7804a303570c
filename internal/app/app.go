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

// File names in the seal directory (behaviour.md §10).
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
	cfg    config.Config
	log    *slog.Logger
	core   *core.Core
	unlock func() error
	etcd   *etcdstore.Client // with store etcd (store.go)
	peer   *peerState        // with store etcd (peer.go)
	// verifier verifies quotes (nil without a collateral source).
	verifier core.QuoteVerifier

	// Metrics and health (metrics.go).
	hooks      metricsHooks
	metrics    *metrics.Metrics // nil without a metrics address
	probe      *metrics.Probe
	collateral *collateral.Cache // nil without a collateral source
}

// New builds the Coordinator: it takes the seal directory (exclusively),
// loads the sealed state and applies the startup manifest if one is set.
func New(ctx context.Context, cfg config.Config, log *slog.Logger) (*App, error) {
	a := &App{cfg: cfg, log: log}
	data, key, unlock, err := a.openStores(ctx) // store.go
	if err != nil {
		return nil, err
	}
	a.unlock = unlock
	if err := a.init(ctx, data, key); err != nil {
		unlock()
		return nil, err
	}
	return a, nil
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

func (a *App) init(ctx context.Context, data, key store.Store) error {
	dns, ips := a.cfg.SplitNames()
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
	a.verifier = verifier
	if err := a.setupPeer(ctx, issuer); err != nil { // peer.go
		return err
	}
	if err := a.joinShared(ctx, sealer); err != nil {
		return err
	}
	marker, err := a.restoreMarker()
	if err != nil {
		return err
	}
	opts := core.Options{
		Names:     ca.Names{DNS: dns, IPs: ips},
		Data:      data,
		Key:       key,
		KeySealer: sealer,
		// A MarbleRun state: see docs/migration.md, "The enclave rule".
		MigrateMarbleRun: a.cfg.MigrateMarbleRun,
		// Update log segments beside the state (logstore.go).
		LogSegments: a.logSegments(),
		Issuer:      issuer,
		Logger:      a.log,

		QuoteVerifier: verifier,

		RecoveryTimeout:   a.cfg.RecoveryTimeout,
		StoreTimeout:      a.cfg.Store.Timeout,
		MaxStateBytes:     int(a.cfg.MaxStateBytes),
		AllowQuoteFailure: a.cfg.DevMode,
		SecretLimits:      secrets.Limits{MaxSecrets: a.cfg.MaxSecrets, MaxWork: a.cfg.MaxSecretGeneration},
		// Every activation attempt is logged by the core itself.
		ActivationEvents: activationEvents(a.cfg.ActivationEvents),
		OnActivation:     a.hooks.onActivation,
		OnCommit:         a.hooks.onCommit,

		// The marker of a restore from a backup (core/restored.go).
		RestoreMarker: marker,
	}
	a.peerOptions(&opts) // peer.go
	a.core, err = core.New(ctx, opts)
	if err != nil {
		return err
	}
	a.initMetrics()
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
	return a.applyStartupManifest(ctx)
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
// (decision D10). In recovery mode it is not applied: that would replace
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
// shuts both down gracefully and releases the seal directory. If either
// server fails, the other is shut down too and Run returns the failure.
func (a *App) Run(ctx context.Context) error {
	defer a.unlock()
	ln, err := net.Listen("tcp", a.cfg.ClientAddr)
	if err != nil {
		return fmt.Errorf("client API: %w", err)
	}
	meshLn, err := net.Listen("tcp", a.cfg.MeshAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("marble API: %w", err)
	}
	metricsLn, err := a.listenMetrics()
	if err != nil {
		ln.Close()
		meshLn.Close()
		return err
	}
	peerLn, err := a.listenPeer() // peer.go
	if err != nil {
		ln.Close()
		meshLn.Close()
		if metricsLn != nil {
			metricsLn.Close()
		}
		return err
	}
	defer a.servePeer(peerLn, a.verifier)()
	ln = rest.GuardPlainHTTP(ln) // plain HTTP gets a JSend 400, not net/http's text
	bodyMem, bodyMemSource := bodyMemory(readSystemFile)
	go a.core.Follow(ctx) // with a shared store: follow the other instances
	var fresh *freshness  // with a shared store: every handshake presents the newest state's certificates
	if a.core.Shared() {
		fresh = &freshness{s: a.core, timeout: a.cfg.Store.Timeout}
	}
	handler := rest.New(a.core, rest.Options{
		MaxManifestBytes: a.cfg.MaxManifestBytes,
		EnableV1Recover:  a.cfg.EnableV1Recover,
		RequestTimeout:   requestTimeout,
		BodyMemory:       bodyMem,
		Logger:           a.log,
		Metrics:          a.restMetrics(),
		Readiness:        a.probe,
	})
	srv := &http.Server{
		Handler:           a.syncing(handler, fresh), // store.go
		TLSConfig:         rest.TLSConfig(freshCertificate(fresh, a.core.TLSCertificate)),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute,
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
		HTTP2: &http.HTTP2Config{
			// Few concurrent requests per connection, and little buffered
			// body per stream and connection: one client must not make
			// the Coordinator buffer much (decision D16).
			MaxConcurrentStreams:          http2MaxStreams,
			MaxReceiveBufferPerStream:     256 << 10,
			MaxReceiveBufferPerConnection: 1 << 20,
		},
	}
	mesh := marbleapi.New(a.core, freshCertificate(fresh, a.core.MarbleTLSCertificate), marbleapi.Options{
		MaxSendBytes:   marbleapi.MaxSendBytesFor(a.cfg.MaxManifestBytes),
		RequestTimeout: requestTimeout,
		Logger:         a.log,
		Interceptors:   a.grpcInterceptors(),
	})
	stopMetrics := a.serveMetrics(metricsLn, mesh)

	clientErr, meshErr := make(chan error, 1), make(chan error, 1)
	go func() { clientErr <- srv.ServeTLS(ln, "", "") }()
	go func() { meshErr <- mesh.Serve(meshLn) }()
	a.log.Info("marble API listening", "addr", meshLn.Addr().String())
	a.log.Info("client API listening", "addr", ln.Addr().String(), "state", int(a.core.Status()),
		"requestBodyMemory", bodyMem, "requestBodyMemorySource", bodyMemSource)

	var failure error
	select {
	case err := <-clientErr:
		failure = fmt.Errorf("client API: %w", err)
		clientErr <- nil // already ended
	case err := <-meshErr:
		// Serve returns nil only after Shutdown, which has not happened.
		failure = fmt.Errorf("marble API: %w", cmp.Or(err, errors.New("stopped serving")))
		meshErr <- nil
	case <-ctx.Done():
		a.log.Info("shutting down")
	}
	if failure != nil {
		a.log.Error("a server failed; shutting down the other", "error", failure.Error())
	}
	shutErr := a.shutdown(srv, mesh, clientErr, meshErr)
	mctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return errors.Join(failure, shutErr, stopMetrics(mctx))
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
