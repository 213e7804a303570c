// Package marble is Quarry's Marble runtime: it activates a Marble at the
// Coordinator and applies the parameters it hands out, as MarbleRun's
// premain does (docs/design/behaviour.md#marble-side), for Marbles written in Go and for
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
// A Marble that pins the Coordinator (Options.CoordinatorRoot or
// CoordinatorRootSHA256: the Coordinator root, which survives updates and
// recovery) accepts an answer only from a server that proves in the TLS
// handshake to hold the Coordinator's key: a key the pinned root certified
// as a CA, which no Marble certificate or certificate secret is. Like
// MarbleRun's premain, an unpinned Marble verifies nothing: whoever answers
// at the Coordinator's address chooses its Files, Env and Argv, and can
// issue it credentials of their own. The Coordinator does not depend on
// this: it verifies the Marble through its quote, which binds the TLS
// client certificate, so the request cannot be relayed. docs/trust.md
// describes what each mode trusts.
//
// (*Parameters).WriteFiles never follows a symbolic link, refuses "..",
// and writes absolute paths only beneath the file roots: by default "/"
// (every absolute path) for a pinned Marble and none for an unpinned one.
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
