// Package marble is Quarry's Marble runtime: it activates a Marble at the
// Coordinator and applies the parameters it hands out, as MarbleRun's
// premain does (docs/design/behaviour.md#marble-side), for Marbles written in Go and for
// premain binaries such as cmd/quarry-premain.
//
// Activate makes a fresh ECDSA P-256 key, a self-signed certificate and a
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
// After the activation, (*Parameters).Credentials (or CredentialsFromEnv
// in a program that quarry-premain started) gives the Marble's TLS
// credentials: ServerTLSConfig and ClientTLSConfig for mutual TLS with
// other Marbles, verified against the Marble Root and optionally
// restricted to Marble types; MarbleType and PeerMarbleType read a
// certificate's Marble type; MonotonicCounter and ReadMonotonicCounter use
// the Coordinator's counter. IsRefused and IsMaxActivations classify an
// activation error without gRPC codes. docs/marbles.md walks through two
// Marbles and is the reference for the manifest's templates.
//
// The package does not log; every failure is a returned error.
package marble

import (
	"context"
	"errors"
	"fmt"
	"strings"

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

// Is matches ErrRefused when the Coordinator refused the activation, and
// ErrMaxActivations when it refused it because the Marble type reached its
// MaxActivations.
func (e *CoordinatorError) Is(target error) bool {
	switch target {
	case ErrRefused:
		return !retryable(e.Code)
	case ErrMaxActivations:
		return e.Code == codes.PermissionDenied && strings.Contains(e.Message, maxActivationsText)
	}
	return false
}

// Sentinels for the Coordinator's answers; match them with errors.Is, or
// with IsRefused and IsMaxActivations, without importing gRPC's codes.
var (
	// ErrRefused: the Coordinator decided against the activation (unknown
	// Marble type, invalid quote, MaxActivations reached, a template that
	// cannot be rendered, ...). Activate does not retry it; starting again
	// with the same settings gets the same answer. Not a refusal: the
	// Coordinator unreachable or not yet accepting Marbles after the last
	// attempt.
	ErrRefused = errors.New("activation refused by the Coordinator")
	// ErrMaxActivations: the Marble type has MaxActivations and was
	// activated that many times. Every activation counts, a restart with
	// the same UUID too, and no update resets the count (MarbleRun's
	// rule; docs/marbles.md).
	ErrMaxActivations = errors.New("the Marble type reached its MaxActivations")
)

// maxActivationsText is the Coordinator's message (MarbleRun's and
// Quarry's) for a Marble type that reached MaxActivations.
const maxActivationsText = "reached max activations count"

// IsRefused reports whether err is a refusal of the activation by the
// Coordinator (ErrRefused).
func IsRefused(err error) bool { return errors.Is(err, ErrRefused) }

// IsMaxActivations reports whether the Coordinator refused the activation
// because the Marble type reached its MaxActivations (ErrMaxActivations).
func IsMaxActivations(err error) bool { return errors.Is(err, ErrMaxActivations) }

// errNoMarbleType is returned when Options.MarbleType is empty.
var errNoMarbleType = errors.New("marble: no Marble type given")
