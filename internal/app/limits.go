package app

import (
	"context"
	"math"
	"time"

	"github.com/quarry-cc/quarry/internal/admission"
	"github.com/quarry-cc/quarry/internal/config"
)

// Connection limits of the Client API derived from the file descriptor
// limit (docs/http.md, "Connections and sources").
const (
	// fdReserve is kept for every descriptor but the Client API's and
	// the Marble API's connections: the seal directory's files and lock,
	// the listeners, etcd and peer connections, metrics scrapes, logs.
	fdReserve = 64
	// maxAutoConns bounds the derived number of Client API connections:
	// each costs some tens of KiB while open.
	maxAutoConns = 4096
	// minAutoConns is the least the Client API gets whatever the limit.
	minAutoConns = 4
	// maxAutoPerSource bounds the derived connections and requests in
	// progress per source address.
	maxAutoPerSource = 64
	// admissionLogEvery is how often refused and evicted connections
	// are summed up in the log.
	admissionLogEvery = 30 * time.Second
)

// clientLimits returns the Client API's connection limits: the
// configured ones, or else derived from the file descriptor limit (nofile,
// 0: unknown): half of what is left after fdReserve (the other half is the
// Marble API's), within minAutoConns and maxAutoConns; per source a
// quarter of that, at most maxAutoPerSource.
func clientLimits(cfg config.ClientLimits, nofile uint64) admission.Limits {
	lim := admission.Limits{MaxConns: cfg.MaxConns, MaxPerSource: cfg.MaxPerSource}
	if lim.MaxConns == 0 {
		lim.MaxConns = maxAutoConns
		if nofile > 0 && nofile < math.MaxInt32 {
			lim.MaxConns = min(max((int(nofile)-fdReserve)/2, minAutoConns), maxAutoConns)
		}
	}
	if lim.MaxPerSource == 0 {
		lim.MaxPerSource = min(max(lim.MaxConns/4, 1), maxAutoPerSource)
	}
	lim.MaxPerSource = min(lim.MaxPerSource, lim.MaxConns)
	return lim
}

// admitClients raises the file descriptor limit to its hard limit, logs
// it, and returns the Client API's connection limits.
func (a *App) admitClients() admission.Limits {
	nofile, found, ok := raiseFileLimit()
	lim := clientLimits(a.cfg.Client, nofile)
	attrs := []any{"clientMaxConns", lim.MaxConns, "clientMaxPerSource", lim.MaxPerSource,
		"clientMinBodyRate", a.cfg.Client.MinBodyRate, "clientBodyGrace", a.cfg.Client.BodyGrace.String()}
	switch {
	case !ok:
		a.log.Info("file descriptor limit unknown", attrs...)
	case found < nofile:
		a.log.Info("file descriptor limit raised to the hard limit", append([]any{"limit", nofile, "was", found}, attrs...)...)
	default:
		a.log.Info("file descriptor limit", append([]any{"limit", nofile}, attrs...)...)
	}
	if ok && uint64(lim.MaxConns)+fdReserve > nofile {
		a.log.Warn("the Client API may have more connections than the file descriptor limit leaves room for; lower --client-max-conns or raise the limit (ulimit -n)",
			"limit", nofile, "clientMaxConns", lim.MaxConns)
	}
	return lim
}

// logAdmission logs, now and then, how many Client API connections the
// limits refused or evicted and how often accept ran out of file
// descriptors, until ctx ends.
func (a *App) logAdmission(ctx context.Context, l *admission.Listener) {
	t := time.NewTicker(admissionLogEvery)
	defer t.Stop()
	var last admission.Stats
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := l.Stats()
		if st.Refused == last.Refused && st.Evicted == last.Evicted && st.NoFiles == last.NoFiles {
			continue
		}
		a.log.Warn("client API connections refused or closed by the connection limits",
			"refused", st.Refused-last.Refused, "evictedIdle", st.Evicted-last.Evicted,
			"acceptOutOfFiles", st.NoFiles-last.NoFiles, "open", st.Open, "period", admissionLogEvery.String())
		last = st
	}
}
