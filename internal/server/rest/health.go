package rest

import (
	"context"
	"errors"
	"net/http"

	"github.com/quarry-cc/quarry/internal/core"
)

// Paths of the health endpoints (no client certificate needed). They do
// not exist in MarbleRun, whose probes use GET /api/v2/status.
const (
	PathHealthz = "/api/v2/healthz"
	PathReadyz  = "/api/v2/readyz"
)

// Readiness tells whether the Coordinator serves (internal/metrics' Probe).
type Readiness interface {
	Ready(ctx context.Context) (core.State, error)
}

// notReady is implemented by readiness errors that carry a reason safe to
// show.
type notReady interface {
	error
	NotReadyReason() string
}

// HealthResponse is the data of GET /api/v2/healthz and /api/v2/readyz.
type HealthResponse struct {
	// Status is "alive" (healthz) or "ready" (readyz).
	Status string `json:"status"`
	// State is the Coordinator's state code (readyz).
	State int `json:"state,omitempty"`
}

// getHealthz answers while the process serves requests.
func (s *server) getHealthz(*http.Request) (any, error) { return HealthResponse{Status: "alive"}, nil }

// getReadyz answers 200 when the Coordinator serves (Options.Readiness),
// else 503 with the reason.
func (s *server) getReadyz(r *http.Request) (any, error) {
	if s.opts.Readiness == nil {
		return HealthResponse{Status: "ready", State: int(s.c.Status())}, nil
	}
	st, err := s.opts.Readiness.Ready(r.Context())
	if err != nil {
		msg := "not ready"
		var nr notReady
		if errors.As(err, &nr) {
			msg = "not ready: " + nr.NotReadyReason()
		}
		return nil, &unavailableError{msg: msg, retryAfter: 5, err: err}
	}
	return HealthResponse{Status: "ready", State: int(st)}, nil
}
