package app

import (
	"time"

	"github.com/quarry-cc/quarry/internal/limit"
)

// refusalLogInterval is the shortest time between two log lines about
// connections or exchanges refused by a server's limits: a flood must not
// flood the log (docs/operations.md, "Logs of refused connections").
const refusalLogInterval = 10 * time.Second

// refusalLog returns the callback that logs connections refused by the
// connection limits of server, at most one line per refusalLogInterval
// with the number of refusals left out before it.
func (a *App) refusalLog(server string) func(limit.Refusal) {
	s := &limit.Sampler{Every: refusalLogInterval}
	return func(r limit.Refusal) {
		ok, left := s.Allow(time.Now())
		if !ok {
			return
		}
		a.log.Warn("connection refused by the connection limits", "server", server, "remote", r.Remote,
			"source", r.Source, "reason", r.Reason.Error(), "refusalsNotLogged", left)
	}
}
