package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/quarry-cc/quarry/internal/buildinfo"
	"github.com/quarry-cc/quarry/internal/console"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/metrics"
	"github.com/quarry-cc/quarry/internal/server/rest"
)

// metricsHooks forwards the core's hooks to the metrics once they exist
// (the metrics read the core, so they are made after it), and counts the
// activations for the console.
type metricsHooks struct {
	m      atomic.Pointer[metrics.Metrics]
	counts console.Counts
}

func (h *metricsHooks) onActivation(a core.ActivationAttempt) {
	h.counts.OnActivation(a)
	if m := h.m.Load(); m != nil {
		m.OnActivation(a)
	}
}

func (h *metricsHooks) onCommit(r core.CommitResult) {
	if m := h.m.Load(); m != nil {
		m.OnCommit(r)
	}
}

func (h *metricsHooks) onCompaction(err error) {
	if m := h.m.Load(); m != nil {
		m.OnCompaction(err)
	}
}

// initMetrics makes the readiness probe and, when a metrics address is
// set, the metrics (in the App's own registry).
func (a *App) initMetrics() {
	a.probe = metrics.NewProbe(a.core, a.cfg.ReadyInRecovery, a.checkSealDir)
	if a.cfg.PrometheusAddr == "" {
		return
	}
	version, commit := buildVersion()
	opts := metrics.Options{Version: version, Commit: commit, MarbleUUIDLabel: a.cfg.MetricsMarbleUUIDLabel}
	if a.collateral != nil {
		opts.CollateralNextUpdate = a.collateral.NextUpdate
	}
	if a.etcd != nil {
		opts.EtcdStatus = a.etcdStatus
	}
	a.metrics = metrics.New(a.core, opts)
	a.hooks.m.Store(a.metrics)
	if a.cfg.MetricsMarbleUUIDLabel {
		a.log.Warn("the activation metrics carry a uuid label: every Marble instance makes new series (QUARRY_METRICS_MARBLE_UUID_LABEL)")
	}
}

// etcdStatus asks every etcd endpoint for its database size and quota.
func (a *App) etcdStatus(ctx context.Context) []metrics.EtcdMember {
	var out []metrics.EtcdMember
	for _, s := range a.etcd.Status(ctx) {
		out = append(out, metrics.EtcdMember{Endpoint: s.Endpoint, OK: s.Err == nil, DBSize: s.DBSize, DBSizeInUse: s.DBSizeInUse, Quota: s.Quota})
	}
	return out
}

// checkSealDir fails when the seal directory is gone (the file store
// would find "no state" there).
func (a *App) checkSealDir(context.Context) error {
	info, err := os.Stat(a.cfg.SealDir)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("%s is not a directory", a.cfg.SealDir)
	}
	return nil
}

// buildVersion returns the stamped (or module) version and the commit of
// the binary.
func buildVersion() (version, commit string) {
	return buildinfo.Version(), buildinfo.Commit()
}

// restMetrics returns the Client API's request recorder (nil without
// metrics).
func (a *App) restMetrics() rest.RequestMetrics {
	if a.metrics == nil {
		return nil
	}
	return a.metrics.Requests()
}

// listenMetrics opens the metrics listener (nil without a metrics
// address).
func (a *App) listenMetrics() (net.Listener, error) {
	if a.cfg.PrometheusAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", a.cfg.PrometheusAddr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return ln, nil
}

// serveMetrics serves h (/metrics, /events, /healthz and /readyz) over
// plain HTTP on ln and returns the function that shuts the server down;
// with a nil ln it does nothing. A failure of this server is logged; it
// does not stop the Coordinator.
func (a *App) serveMetrics(ln net.Listener, h http.Handler) func(context.Context) error {
	if ln == nil {
		return func(context.Context) error { return nil }
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics server failed", "error", err.Error())
		}
	}()
	a.log.Info("metrics listening", "addr", ln.Addr().String())
	return func(ctx context.Context) error {
		err := srv.Shutdown(ctx)
		if err != nil {
			srv.Close()
			err = fmt.Errorf("metrics shutdown: %w", err)
		}
		<-done
		return err
	}
}
