package app

import (
	"context"
	"net/http"
	"time"

	"github.com/quarry-cc/quarry/internal/console"
)

// consoleStoreTimeout bounds the etcd status a console page asks for.
const consoleStoreTimeout = 2 * time.Second

// consoleHandler returns the operator console (docs/console.md), or nil
// when --console is off.
func (a *App) consoleHandler() http.Handler {
	if !a.cfg.Console {
		return nil
	}
	version, commit := buildVersion()
	if commit != "" {
		version += " (" + commit + ")"
	}
	opts := console.Options{Version: version, Counts: &a.hooks.counts}
	if a.collateral != nil {
		opts.CollateralNextUpdate = a.collateral.NextUpdate
	}
	opts.Cluster = func(ctx context.Context) console.Cluster {
		if a.etcd == nil {
			return console.Cluster{}
		}
		ctx, cancel := context.WithTimeout(ctx, consoleStoreTimeout)
		defer cancel()
		c := console.Cluster{Shared: true}
		for _, s := range a.etcd.Status(ctx) {
			c.Members = append(c.Members, console.Member{Endpoint: s.Endpoint, OK: s.Err == nil, DBSize: s.DBSize})
		}
		return c
	}
	return console.New(a.core, opts)
}
