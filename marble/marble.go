// Package marble is Quarry's Marble runtime: it activates a Marble at the
// Coordinator and applies the parameters it hands out, as MarbleRun's
// premain does (behaviour.md §11.2), for Marbles written in Go and for
// premain binaries such as cmd/quarry-premain.
//
// Activate makes a fresh ECDSA P-384 key, a self-signed certificate and a
// CSR for it, obtains a quote over SHA-256 of the certificate from an
// Issuer (none in simulation), loads or creates the Marble's UUID, and asks
// the Coordinator over gRPC with TLS to activate the Marble, presenting the
// certificate as TLS client certificate. The Parameters it returns are
// applied with (*Parameters).Apply, or piecewise with WriteFiles, Environ and
// Args when the caller execs another program.
//
// Like MarbleRun's premain, Activate does not verify the Coordinator's
// certificate by default: the Coordinator verifies the Marble through its
// quote (which binds the TLS client certificate, so the request cannot be
// relayed), and the Marble learns the Coordinator's identity from the
// parameters (MARBLE_PREDEFINED_ROOT_CA, the Marble Root). Someone in the
// network path could therefore answer with parameters of their own. A
// caller that already knows the Marble Root (from an earlier activation or
// its deployment) should pin it with Options.RootCAs.
//
// The package does not log; every failure is a returned error.
package marble

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/quarry-cc/quarry/internal/attest"
)

// Issuer produces a quote (e.g. an SGX DCAP quote) whose report data is the
// given 64 bytes. An Issuer that cannot produce quotes here (simulation,
// no enclave) returns an error matching ErrUnsupported.
type Issuer interface {
	Issue(ctx context.Context, reportData [64]byte) ([]byte, error)
}

// ErrUnsupported is the error of an Issuer that cannot produce quotes here.
// Activate then sends an empty quote, which only a Coordinator in
// simulation mode accepts. It is the same error as the Coordinator's own
// simulation issuer returns ("OE_UNSUPPORTED").
var ErrUnsupported = attest.ErrUnsupported

// CoordinatorError is an activation that the Coordinator answered with a
// gRPC error: a refusal (PermissionDenied, InvalidArgument, Internal, ...)
// or, after the last attempt, a Coordinator that stayed unreachable
// (Unavailable) or not ready (FailedPrecondition).
type CoordinatorError struct {
	Code    codes.Code // the gRPC status code
	Message string     // the Coordinator's message
}

func (e *CoordinatorError) Error() string {
	return fmt.Sprintf("gRPC %s: %s", e.Code, e.Message)
}

// errNoMarbleType is returned when Options.MarbleType is empty.
var errNoMarbleType = errors.New("marble: no Marble type given")
