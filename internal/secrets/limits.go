package secrets

import (
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/manifest"
)

// Default generation limits of one manifest set or update.
const (
	// DefaultMaxSecrets bounds the number of secrets a manifest defines.
	DefaultMaxSecrets = 10_000
	// DefaultMaxWork bounds the estimated single-core time to generate a
	// manifest's shared secrets. It is well below the Client API's write
	// timeout (2 minutes), so that a manifest set is answered — with its
	// recovery secrets — long before the connection is given up.
	DefaultMaxWork = 60 * time.Second
)

// Limits bound the secret generation of one manifest set or update, so that
// a request is refused up front instead of running longer than its client
// waits. Zero fields mean no limit.
type Limits struct {
	// MaxSecrets is the most secrets (of any kind) a manifest may define.
	MaxSecrets int
	// MaxWork is the most estimated single-core generation time (see
	// EstimateWork) of the secrets generated at once.
	MaxWork time.Duration
}

// DefaultLimits returns the default limits.
func DefaultLimits() Limits {
	return Limits{MaxSecrets: DefaultMaxSecrets, MaxWork: DefaultMaxWork}
}

// Per-secret work estimates, measured on one core of a 2-core x86-64 VM
// (see docs/performance.md); RSA key generation grows with
// about the fourth power of the modulus size.
const (
	workRSA2048   = 40 * time.Millisecond
	workECDSA     = 2 * time.Millisecond
	workEd25519   = 2 * time.Millisecond
	workSymmetric = 20 * time.Microsecond
)

// EstimateWork estimates the single-core time Generate needs for the
// secrets generated at a manifest set: shared, not user-defined ones.
// Per-Marble secrets are made at activation and are not counted.
func EstimateWork(defs map[string]manifest.Secret) time.Duration {
	var total time.Duration
	for _, def := range defs {
		if def.UserDefined || !def.Shared {
			continue
		}
		total += estimateOne(def)
	}
	return total
}

func estimateOne(def manifest.Secret) time.Duration {
	switch def.Type {
	case manifest.SecretTypeCertRSA:
		bits := def.Size
		if bits == 0 {
			bits = 2048
		}
		r := float64(bits) / 2048
		return time.Duration(float64(workRSA2048) * r * r * r * r)
	case manifest.SecretTypeCertECDSA:
		return workECDSA
	case manifest.SecretTypeCertED25519:
		return workEd25519
	}
	return workSymmetric
}

// Check refuses defs when they break the limits. The error wraps ErrInvalid
// (the client's manifest is at fault) and says which limit and how to
// raise it.
func (l Limits) Check(defs map[string]manifest.Secret) error {
	if l.MaxSecrets > 0 && len(defs) > l.MaxSecrets {
		return &Error{kind: ErrInvalid, msg: fmt.Sprintf(
			"the manifest defines %d secrets; this Coordinator accepts at most %d (QUARRY_MAX_SECRETS)", len(defs), l.MaxSecrets)}
	}
	if l.MaxWork > 0 {
		if w := EstimateWork(defs); w > l.MaxWork {
			return &Error{kind: ErrInvalid, msg: fmt.Sprintf(
				"generating the manifest's secrets would take about %s of CPU time; this Coordinator accepts at most %s (QUARRY_MAX_SECRET_GENERATION); use fewer or smaller RSA keys",
				w.Round(time.Second), l.MaxWork)}
		}
	}
	return nil
}
