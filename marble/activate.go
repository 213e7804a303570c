package marble

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
)

// Defaults of Options (docs/design/behaviour.md#marble-side for the MarbleRun ones).
const (
	DefaultCoordinatorAddr = "localhost:2001"
	DefaultDNSName         = "localhost"
	DefaultUUIDFile        = "uuid" // in the working directory
	DefaultAttempts        = 10
	DefaultRetryDelay      = time.Second
)

// MaxRetryDelay caps the delay between two attempts, which doubles after
// each failed one.
const MaxRetryDelay = 10 * time.Second

// MaxResponseSize bounds the Coordinator's answer (the rendered Files and
// Env). gRPC's default of 4 MiB is too small for large manifests.
const MaxResponseSize = 128 << 20

// attemptTimeout bounds one attempt: connecting and the Coordinator's
// answer.
const attemptTimeout = time.Minute

// Options configure Activate. Only MarbleType is required.
type Options struct {
	// MarbleType names the Marble in the manifest (EDG_MARBLE_TYPE).
	MarbleType string
	// CoordinatorAddr is the Coordinator's Marble API address, host:port
	// (EDG_MARBLE_COORDINATOR_ADDR); default "localhost:2001".
	CoordinatorAddr string
	// DNSNames are the Marble's names for its certificate and CSR
	// (EDG_MARBLE_DNS_NAMES); default ["localhost"]. Entries that parse as
	// IP addresses become IP SANs; 127.0.0.1 and ::1 are always added.
	DNSNames []string
	// UUIDFile holds the Marble's UUID (EDG_MARBLE_UUID_FILE); default
	// "uuid" in the working directory. If it does not exist, a random
	// (version 4) UUID is written to it with mode 0600; its directory must
	// exist.
	UUIDFile string
	// Issuer produces the quote. nil, or an Issuer failing with
	// ErrUnsupported, means simulation: the quote is empty. Any other
	// Issuer failure fails Activate.
	Issuer Issuer
	// CoordinatorRoot, if not nil, pins the Coordinator (docs/trust.md):
	// the Coordinator root certificate, which stays the same through
	// package and full updates and recovery. A Marble gets it in
	// MARBLE_PREDEFINED_COORDINATOR_ROOT_CA; operators get it as the last
	// certificate of GET /api/v2/quote, verified through the Coordinator's
	// quote. The server must prove in the TLS handshake that it holds a
	// key the root certified as the Coordinator's CA (its intermediate);
	// a Marble certificate or a certificate secret, whoever holds it,
	// cannot. Host names are not checked. A Marble Root is refused
	// (ErrMarbleRootPin).
	//
	// With neither CoordinatorRoot nor CoordinatorRootSHA256 (the default,
	// as MarbleRun's premain) the Marble accepts whoever answers at
	// CoordinatorAddr: its certificate, Files, Env and Argv.
	CoordinatorRoot *x509.Certificate
	// CoordinatorRootSHA256, if not nil, pins the Coordinator by the
	// SHA-256 of its root certificate (DER) instead (ParseFingerprint
	// reads the usual notations); the server presents the root with its
	// chain. Set at most one of the two.
	CoordinatorRootSHA256 []byte
	// FileRoots are the directories (absolute paths) under which the
	// Parameters' WriteFiles writes files with absolute paths; relative
	// paths are always written beneath the working directory. If empty,
	// Activate with a pin allows every absolute path ("/", as MarbleRun's
	// premain), and without a pin none. See (*Parameters).WriteFiles.
	FileRoots []string
	// RootCAs once pinned the Coordinator to the Marble Root, which is no
	// proof of identity (every Marble certificate and certificate secret
	// chains to it) and which changes with every package update.
	//
	// Deprecated: Activate refuses Options with RootCAs set
	// (ErrMarbleRootPin); set CoordinatorRoot to the Coordinator root
	// (MARBLE_PREDEFINED_COORDINATOR_ROOT_CA) instead.
	RootCAs *x509.CertPool
	// Attempts bounds how often the activation is tried while the
	// Coordinator is unreachable (gRPC Unavailable, DeadlineExceeded), not
	// yet ready for Marbles (FailedPrecondition), asks for a new attempt
	// because its state changed during the activation (Aborted), or, for a
	// pinned Marble, does not prove to be the pinned Coordinator
	// (ErrNotCoordinator: a Coordinator in recovery mode presents a
	// temporary root until it is recovered); default 10. 1 tries once, as
	// MarbleRun's premain does. Refusals end Activate at once.
	Attempts int
	// RetryDelay is the wait after the first failed attempt; it doubles
	// after each further one, up to MaxRetryDelay. Default one second.
	RetryDelay time.Duration
}

// withDefaults returns o with defaults filled in and its pin, or an error
// for invalid settings.
func (o Options) withDefaults() (Options, *pin, error) {
	if o.MarbleType == "" {
		return o, nil, errNoMarbleType
	}
	if o.RootCAs != nil {
		return o, nil, fmt.Errorf("marble: Options.RootCAs is no longer supported; it pinned the Marble Root, which every Marble certificate and certificate secret chains to: %w", ErrMarbleRootPin)
	}
	p, err := newPin(o.CoordinatorRoot, o.CoordinatorRootSHA256)
	if err != nil {
		return o, nil, err
	}
	if err := checkFileRoots(o.FileRoots); err != nil {
		return o, nil, fmt.Errorf("marble: Options.FileRoots: %w", err)
	}
	if o.CoordinatorAddr == "" {
		o.CoordinatorAddr = DefaultCoordinatorAddr
	}
	if len(o.DNSNames) == 0 {
		o.DNSNames = []string{DefaultDNSName}
	}
	if o.UUIDFile == "" {
		o.UUIDFile = DefaultUUIDFile
	}
	switch {
	case o.Attempts < 0:
		return o, nil, fmt.Errorf("marble: negative number of attempts %d", o.Attempts)
	case o.Attempts == 0:
		o.Attempts = DefaultAttempts
	}
	switch {
	case o.RetryDelay < 0:
		return o, nil, fmt.Errorf("marble: negative retry delay %s", o.RetryDelay)
	case o.RetryDelay == 0:
		o.RetryDelay = DefaultRetryDelay
	}
	return o, p, nil
}

// Activate activates the Marble at the Coordinator and returns its
// parameters (docs/design/behaviour.md#marble-side). It does not apply them.
//
// The key, certificate, CSR and quote are made once; only the request is
// repeated while the Coordinator is unreachable or not yet ready, up to
// Options.Attempts times with a growing delay, and never beyond ctx. A
// refusal returns at once. Errors from the Coordinator match
// *CoordinatorError (errors.As) and carry its gRPC code and message; a
// server that is not the pinned Coordinator matches ErrNotCoordinator.
//
// The Parameters' FileRoots are Options.FileRoots, or, if that is empty,
// "/" when the Coordinator is pinned and none otherwise.
func Activate(ctx context.Context, opts Options) (*Parameters, error) {
	opts, pin, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	sans, err := newSANs(opts.DNSNames)
	if err != nil {
		return nil, err
	}
	id, err := loadOrCreateUUID(opts.UUIDFile)
	if err != nil {
		return nil, err
	}
	// P-256, not the P-384 of MarbleRun's premain: the key only proves
	// the Marble's TLS connection (its certificate is what the quote
	// covers; the Coordinator makes the Marble's certificate key itself),
	// and a P-256 signature costs the Marble and the Coordinator's check
	// of it a fraction of a P-384 one (docs/performance.md).
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("marble: generating the key: %w", err)
	}
	cert, err := selfSignedCert(key, sans, time.Now())
	if err != nil {
		return nil, err
	}
	csr, err := certificateRequest(key, sans)
	if err != nil {
		return nil, err
	}
	quote, err := issueQuote(ctx, opts.Issuer, cert.Raw)
	if err != nil {
		return nil, err
	}
	req := &marblepb.ActivationReq{Quote: quote, CSR: csr, MarbleType: opts.MarbleType, UUID: id}
	clientCert := tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}

	delay := opts.RetryDelay
	for attempt := 1; ; attempt++ {
		params, err := activateOnce(ctx, opts, pin, clientCert, req)
		if err == nil {
			params.UUID = id
			params.FileRoots = slices.Clone(opts.FileRoots)
			if len(params.FileRoots) == 0 && pin != nil {
				params.FileRoots = []string{"/"}
			}
			return params, nil
		}
		var ce *CoordinatorError
		retry := (errors.As(err, &ce) && retryable(ce.Code) || errors.Is(err, ErrNotCoordinator)) && ctx.Err() == nil
		if !retry {
			return nil, fmt.Errorf("marble: activating %q at %s: %w", opts.MarbleType, opts.CoordinatorAddr, err)
		}
		if attempt >= opts.Attempts {
			return nil, fmt.Errorf("marble: activating %q at %s: giving up after %s: %w", opts.MarbleType, opts.CoordinatorAddr, attempts(attempt), err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("marble: activating %q at %s: %w (last attempt: %v)", opts.MarbleType, opts.CoordinatorAddr, ctx.Err(), err)
		case <-t.C:
		}
		delay = min(2*delay, MaxRetryDelay)
	}
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// retryable reports whether an activation answered with code may succeed
// later: the Coordinator is unreachable, slow, or not yet accepting Marbles.
func retryable(code codes.Code) bool {
	return code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.FailedPrecondition || code == codes.Aborted
}

// issueQuote returns the quote over SHA-256(certDER), empty in simulation.
func issueQuote(ctx context.Context, is Issuer, certDER []byte) ([]byte, error) {
	if is == nil {
		return []byte{}, nil
	}
	var rd [64]byte
	h := sha256.Sum256(certDER)
	copy(rd[:], h[:])
	q, err := is.Issue(ctx, rd)
	switch {
	case errors.Is(err, ErrUnsupported):
		return []byte{}, nil
	case err != nil:
		return nil, fmt.Errorf("marble: obtaining a quote: %w", err)
	}
	return q, nil
}

// activateOnce makes one connection to the Coordinator and sends req.
func activateOnce(ctx context.Context, opts Options, pin *pin, clientCert tls.Certificate, req *marblepb.ActivationReq) (*Parameters, error) {
	// The Coordinator's certificate is checked (if pinned) in
	// VerifyConnection, which records a failure so that it is reported as
	// such instead of as an unreachable Coordinator. The handshake fails
	// before the request is sent.
	var verify verifyResult
	cfg := &tls.Config{
		Certificates:       []tls.Certificate{clientCert},
		InsecureSkipVerify: true, // the chain is checked below against the pin; unpinned, nothing is (package doc)
		MinVersion:         tls.VersionTLS12,
	}
	if pin != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if err := pin.verify(cs.PeerCertificates); err != nil {
				verify.set(err)
				return err
			}
			return nil
		}
	}
	conn, err := grpc.NewClient(opts.CoordinatorAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxResponseSize)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()

	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	resp, err := marblepb.NewMarbleClient(conn).Activate(actx, req)
	if err != nil {
		// The handshake ran in this attempt and has ended with the RPC.
		if verr := verify.get(); verr != nil {
			return nil, verr
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s := status.Convert(err)
		return nil, &CoordinatorError{Code: s.Code(), Message: s.Message()}
	}
	return fromWire(resp.GetParameters()), nil
}

// verifyResult records a failed verification of the Coordinator's
// certificate; the handshake runs on a goroutine of gRPC.
type verifyResult struct {
	mu  sync.Mutex
	err error
}

func (v *verifyResult) set(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.err = err
}

func (v *verifyResult) get() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err
}
