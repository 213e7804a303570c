package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
)

// ProbeTimeout bounds one readiness check (a store that hangs is not
// ready).
const ProbeTimeout = 5 * time.Second

// StateChecker is what the readiness probe asks the Coordinator.
type StateChecker interface {
	Status() core.State
	CheckStore(ctx context.Context) error
}

// Probe answers liveness and readiness.
type Probe struct {
	c StateChecker
	// readyInRecovery counts recovery mode as ready.
	readyInRecovery bool
	// extra are further checks (the seal directory, ...).
	extra []func(context.Context) error
}

// NewProbe returns the probe of c. With readyInRecovery, recovery mode
// (state 1) is ready (the Client API serves recovery); extra checks run
// after the store check.
func NewProbe(c StateChecker, readyInRecovery bool, extra ...func(context.Context) error) *Probe {
	return &Probe{c: c, readyInRecovery: readyInRecovery, extra: extra}
}

// NotReadyError says why the Coordinator is not ready. Reason is safe to
// show to anyone (the health endpoints need no authentication); the cause
// is for the log.
type NotReadyError struct {
	Reason string
	State  core.State
	Err    error
}

func (e *NotReadyError) Error() string {
	if e.Err != nil {
		return "not ready: " + e.Reason + ": " + e.Err.Error()
	}
	return "not ready: " + e.Reason
}

func (e *NotReadyError) Unwrap() error { return e.Err }

// Ready returns nil when the Coordinator serves: state 2 or 3 (or 1 when
// configured), and its store can be read back; otherwise a *NotReadyError.
func (p *Probe) Ready(ctx context.Context) (core.State, error) {
	st := p.c.Status()
	switch st {
	case core.StateAcceptingManifest, core.StateAcceptingMarbles:
	case core.StateRecovery:
		if !p.readyInRecovery {
			return st, &NotReadyError{State: st, Reason: "the Coordinator is in recovery mode (state 1): upload the recovery secrets or set a new manifest"}
		}
	default:
		return st, &NotReadyError{State: st, Reason: fmt.Sprintf("the Coordinator is in state %d", st)}
	}
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	if err := p.c.CheckStore(ctx); err != nil {
		return st, &NotReadyError{State: st, Reason: "the sealed state cannot be read back from the store", Err: err}
	}
	for _, check := range p.extra {
		if err := check(ctx); err != nil {
			return st, &NotReadyError{State: st, Reason: "the sealed state cannot be read back from the store", Err: err}
		}
	}
	return st, nil
}

// NotReadyReason returns the reason, safe to show.
func (e *NotReadyError) NotReadyReason() string { return e.Reason }
