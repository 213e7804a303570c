package dcap

import "errors"

// Sentinel errors: every error Verify returns is an *Error whose Kind is one
// of these, so callers branch with errors.Is.
var (
	// ErrFormat: the quote or a part of it (certificate chain, PCK
	// extension, attestation key) is malformed.
	ErrFormat = errors.New("malformed input")
	// ErrUnsupported: well-formed but not supported (quote version, TDX,
	// key type, certification data type, QE vendor, key algorithm).
	ErrUnsupported = errors.New("unsupported")
	// ErrUntrustedRoot: a certificate chain does not end in the trusted
	// Intel SGX Root CA (or the configured root).
	ErrUntrustedRoot = errors.New("untrusted root CA")
	// ErrBadChain: a certificate chain is invalid at the verification time
	// or has the wrong shape or names.
	ErrBadChain = errors.New("invalid certificate chain")
	// ErrBadSignature: a signature does not verify.
	ErrBadSignature = errors.New("bad signature")
	// ErrBinding: the QE report data does not bind the attestation key and
	// QE authentication data.
	ErrBinding = errors.New("QE report data does not bind the attestation key")
	// ErrBadCRL: a CRL has the wrong issuer or a bad signature.
	ErrBadCRL = errors.New("invalid CRL")
	// ErrRevoked: a certificate is revoked by a CRL.
	ErrRevoked = errors.New("certificate revoked")
	// ErrCollateralUnavailable: the collateral provider failed.
	ErrCollateralUnavailable = errors.New("collateral unavailable")
	// ErrCollateral: collateral is missing a part, malformed, of the wrong
	// kind or version, or for another platform (FMSPC, PCE-ID).
	ErrCollateral = errors.New("invalid collateral")
	// ErrCollateralExpired: the verification time lies outside the validity
	// of the TCB info, the QE identity or a CRL. Verify returns the complete
	// Result together with this error; every other check passed.
	ErrCollateralExpired = errors.New("collateral expired or not yet valid")
	// ErrQEIdentity: the quoting enclave does not match its QE identity.
	ErrQEIdentity = errors.New("quoting enclave does not match the QE identity")
	// ErrTCBNotSupported: no TCB level of the TCB info (or of the QE
	// identity) applies to the platform (or the QE's ISVSVN).
	ErrTCBNotSupported = errors.New("TCB level not supported")
)

// Step names a step of quote verification.
type Step string

// The verification steps, in the order Verify runs them.
const (
	StepParse           Step = "parse quote"
	StepPCKChain        Step = "PCK certificate chain"
	StepRootCA          Step = "root CA"
	StepQEReportSig     Step = "QE report signature"
	StepQEBinding       Step = "QE report data binding"
	StepISVSignature    Step = "ISV enclave report signature"
	StepFetchCollateral Step = "fetch collateral"
	StepRootCACRL       Step = "root CA CRL"
	StepPCKCRL          Step = "PCK CRL"
	StepTCBInfo         Step = "TCB info"
	StepQEIdentity      Step = "QE identity"
	StepQEMatch         Step = "QE identity match"
	StepTCBLevel        Step = "platform TCB level"
	StepCollateralTime  Step = "collateral validity"
)

// Error is a verification failure: the step that failed, the kind of
// failure (one of the ErrX sentinels) and an optional cause.
type Error struct {
	Step Step
	Kind error
	Err  error
}

func (e *Error) Error() string {
	s := "dcap: " + string(e.Step) + ": " + e.Kind.Error()
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the kind and the cause, so errors.Is matches both.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

func fail(step Step, kind, err error) *Error { return &Error{Step: step, Kind: kind, Err: err} }
