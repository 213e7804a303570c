package peer

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/policy"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/limit"
)

// Bounds of the exchanges a server runs at once (docs/ha.md, "Limits of
// the peer key server"). A joiner runs one exchange at a time, and only
// starting instances join; a connection over a bound is closed at once,
// unless its source holds fewer exchanges than the heaviest source, whose
// oldest exchange then makes room (package limit).
const (
	DefaultMaxExchanges          = 32
	DefaultMaxExchangesPerSource = 4
)

// Keys gives the data key with a key ID and the seal mode of the state it
// opens (core.Core.PeerKey).
type Keys interface {
	PeerKey(keyID [32]byte) (dek []byte, mode string, ok bool)
}

// Result is one exchange the server had, for the caller's log.
type Result struct {
	Remote string
	KeyID  [32]byte
	// Err is nil when the key was given, else why it was not.
	Err error
}

// Server answers joining instances. Self is this instance's own enclave
// (the report body of its own quote), nil without an enclave; Verifier
// nil means no collateral source (every quote is refused). Issuer makes
// this instance's own quote for a joiner it accepted (needed with Self).
type Server struct {
	Keys        Keys
	Verifier    Verifier
	Issuer      attest.Issuer
	Self        *sgxquote.ReportBody
	Certificate tls.Certificate
	// InsecureTrust gives the key to joiners without a quote when this
	// instance has no enclave either (simulation, --insecure-peer-trust).
	InsecureTrust bool
	// Timeout bounds one exchange (DefaultTimeout when 0).
	Timeout time.Duration
	// MaxExchanges and MaxExchangesPerSource bound the exchanges at once,
	// in all and from one source (DefaultMaxExchanges and
	// DefaultMaxExchangesPerSource when 0).
	MaxExchanges, MaxExchangesPerSource int
	// OnResult, if set, is called after each exchange.
	OnResult func(Result)
	// OnRefuse, if set, is called for each connection refused or evicted
	// by the bounds.
	OnRefuse func(limit.Refusal)

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Serve accepts connections on ln until it is closed; it returns nil
// after Close. Each connection is one exchange.
func (s *Server) Serve(ln net.Listener) error {
	ln = limit.NewListener(ln, limit.Options{
		Max:       cmp.Or(s.MaxExchanges, DefaultMaxExchanges),
		PerSource: cmp.Or(s.MaxExchangesPerSource, DefaultMaxExchangesPerSource),
		OnRefuse:  s.OnRefuse,
	})
	cfg := &tls.Config{
		Certificates: []tls.Certificate{s.Certificate},
		ClientAuth:   tls.RequireAnyClientCert, // the quote, not a CA, vouches for it
		MinVersion:   tls.VersionTLS13,
	}
	defer s.wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return err
		}
		s.mu.Lock()
		if s.conns == nil {
			s.conns = map[net.Conn]struct{}{}
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				c.Close()
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
			s.serveConn(tls.Server(c, cfg))
		})
	}
}

// Close ends the exchanges still running (the caller closes the listener).
func (s *Server) Close() {
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
}

func (s *Server) serveConn(c *tls.Conn) {
	timeout := s.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	c.SetDeadline(deadline)
	res := Result{Remote: c.RemoteAddr().String()}
	defer func() {
		if s.OnResult != nil {
			s.OnResult(res)
		}
	}()
	if err := c.Handshake(); err != nil {
		res.Err = fmt.Errorf("%w: TLS handshake: %v", ErrBadRequest, err)
		return
	}
	cs := c.ConnectionState()
	exporter, err := Exporter(cs)
	if err != nil {
		res.Err = fmt.Errorf("%w: TLS exporter: %v", ErrBadRequest, err)
		return
	}
	nonce := make([]byte, nonceSize)
	rand.Read(nonce)
	if err := writeMsg(c, hello{Version: ProtocolVersion, Nonce: nonce}); err != nil {
		res.Err = err
		return
	}
	var req request
	if err := readMsg(c, &req, ErrBadRequest); err != nil {
		res.Err = err
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := s.decide(ctx, cs.PeerCertificates[0], exporter, nonce, req, &res)
	if err != nil {
		res.Err = err
		writeMsg(c, response{Refused: codeOf(err), Reason: err.Error()})
		return
	}
	if err := writeMsg(c, resp); err != nil {
		res.Err = err
	}
}

// decide checks a request and returns the answer with the key, or why
// not.
func (s *Server) decide(ctx context.Context, cert *x509.Certificate, exporter, nonce []byte, req request, res *Result) (response, error) {
	if req.Version != ProtocolVersion {
		return response{}, fmt.Errorf("%w: the joiner speaks protocol version %d, this instance %d (mutual attestation); run one Coordinator version on all instances", ErrVersion, req.Version, ProtocolVersion)
	}
	if len(req.KeyID) != len(res.KeyID) {
		return response{}, fmt.Errorf("%w: a key ID of %d bytes", ErrBadRequest, len(req.KeyID))
	}
	if len(req.Nonce) != nonceSize {
		return response{}, fmt.Errorf("%w: a nonce of %d bytes, want %d", ErrBadRequest, len(req.Nonce), nonceSize)
	}
	copy(res.KeyID[:], req.KeyID)
	dek, mode, ok := s.Keys.PeerKey(res.KeyID)
	if !ok {
		return response{}, fmt.Errorf("%w: no data key with ID %x here (recovery mode, or another state)", ErrNoKey, res.KeyID[:8])
	}
	mode = PolicyMode(mode)
	if s.Self == nil || len(req.Quote) == 0 {
		if !s.InsecureTrust {
			if s.Self == nil {
				return response{}, fmt.Errorf("%w: this instance runs without an enclave and cannot tell a joiner's identity", ErrSimulation)
			}
			return response{}, fmt.Errorf("%w: the joiner sent no quote", ErrSimulation)
		}
		if s.Self != nil {
			// An enclave never gives its key to a joiner without a quote.
			return response{}, fmt.Errorf("%w: the joiner sent no quote, and this instance runs in an enclave", ErrIdentity)
		}
		// Simulation on this side, explicitly trusted: no quote to send.
		return response{Key: dek, Mode: mode}, nil
	}
	if s.Verifier == nil {
		return response{}, fmt.Errorf("%w: this instance has no collateral source (--collateral-file or --pccs-url)", ErrUnverified)
	}
	vr, err := s.Verifier.Verify(ctx, req.Quote)
	if err != nil {
		return response{}, fmt.Errorf("%w: %v", ErrUnverified, err)
	}
	if err := checkBinding(vr, JoinerReportData(cert, exporter, nonce, res.KeyID), ErrBinding, ErrStale); err != nil {
		return response{}, err
	}
	if err := policy.Check(vr, samePackage(s.Self, mode)); err != nil {
		return response{}, fmt.Errorf("%w (seal mode %s): %v", ErrIdentity, mode, err)
	}
	// The joiner is the same enclave: quote this one for it.
	leaf, err := leafOf(s.Certificate)
	if err != nil {
		return response{}, fmt.Errorf("%w: %v", ErrSelfQuote, err)
	}
	if s.Issuer == nil {
		return response{}, fmt.Errorf("%w: no quote issuer", ErrSelfQuote)
	}
	quote, err := s.Issuer.Issue(ctx, PeerReportData(leaf, exporter, req.Nonce, res.KeyID, mode))
	if err != nil {
		return response{}, fmt.Errorf("%w: %v", ErrSelfQuote, err)
	}
	return response{Key: dek, Mode: mode, Quote: quote}, nil
}

// leafOf returns the parsed leaf of a TLS certificate.
func leafOf(c tls.Certificate) (*x509.Certificate, error) {
	if c.Leaf != nil {
		return c.Leaf, nil
	}
	if len(c.Certificate) == 0 {
		return nil, errors.New("no TLS certificate")
	}
	return x509.ParseCertificate(c.Certificate[0])
}
