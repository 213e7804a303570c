package peer

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/policy"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/manifest"
)

// Keys gives the data key with a key ID and the seal mode of the state it
// opens (core.Core.PeerKey).
type Keys interface {
	PeerKey(keyID [32]byte) (dek []byte, mode string, ok bool)
}

// Verifier verifies a DCAP quote (core.QuoteVerifier, dcap.Verifier).
type Verifier interface {
	Verify(ctx context.Context, quote []byte) (*dcap.Result, error)
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
// nil means no collateral source (every quote is refused).
type Server struct {
	Keys        Keys
	Verifier    Verifier
	Self        *sgxquote.ReportBody
	Certificate tls.Certificate
	// InsecureTrust gives the key to joiners without a quote when this
	// instance has no enclave either (simulation, --insecure-peer-trust).
	InsecureTrust bool
	// Timeout bounds one exchange (DefaultTimeout when 0).
	Timeout time.Duration
	// OnResult, if set, is called after each exchange.
	OnResult func(Result)

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Serve accepts connections on ln until it is closed; it returns nil
// after Close. Each connection is one exchange.
func (s *Server) Serve(ln net.Listener) error {
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
	nonce := make([]byte, 32)
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
	key, err := s.decide(ctx, c.ConnectionState().PeerCertificates[0], nonce, req, &res)
	if err != nil {
		res.Err = err
		writeMsg(c, response{Refused: codeOf(err), Reason: err.Error()})
		return
	}
	writeMsg(c, response{Key: key})
}

// decide checks a request and returns the key to give, or why not.
func (s *Server) decide(ctx context.Context, cert *x509.Certificate, nonce []byte, req request, res *Result) ([]byte, error) {
	if len(req.KeyID) != len(res.KeyID) {
		return nil, fmt.Errorf("%w: a key ID of %d bytes", ErrBadRequest, len(req.KeyID))
	}
	copy(res.KeyID[:], req.KeyID)
	dek, mode, ok := s.Keys.PeerKey(res.KeyID)
	if !ok {
		return nil, fmt.Errorf("%w: no data key with ID %x here (recovery mode, or another state)", ErrNoKey, res.KeyID[:8])
	}
	if s.Self == nil || len(req.Quote) == 0 {
		if !s.InsecureTrust {
			if s.Self == nil {
				return nil, fmt.Errorf("%w: this instance runs without an enclave and cannot tell a joiner's identity", ErrSimulation)
			}
			return nil, fmt.Errorf("%w: the joiner sent no quote", ErrSimulation)
		}
		if s.Self != nil {
			// An enclave never gives its key to a joiner without a quote.
			return nil, fmt.Errorf("%w: the joiner sent no quote, and this instance runs in an enclave", ErrIdentity)
		}
		return dek, nil // simulation on both sides, explicitly trusted
	}
	if s.Verifier == nil {
		return nil, fmt.Errorf("%w: this instance has no collateral source (--collateral-file or --pccs-url)", ErrUnverified)
	}
	vr, err := s.Verifier.Verify(ctx, req.Quote)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnverified, err)
	}
	rd := vr.Report.ReportData()
	want := ReportData(cert, nonce, res.KeyID)
	if !bytes.Equal(rd[:32], want[:32]) {
		return nil, fmt.Errorf("%w: the quote's report data binds %x, the TLS key is %x", ErrBinding, rd[:8], want[:8])
	}
	if !bytes.Equal(rd[32:], want[32:]) {
		return nil, ErrStale
	}
	if err := policy.Check(vr, samePackage(s.Self, mode)); err != nil {
		return nil, fmt.Errorf("%w (seal mode %s): %v", ErrIdentity, modeName(mode), err)
	}
	return dek, nil
}

func modeName(mode string) string {
	if mode == seal.ModeUniqueKey {
		return mode
	}
	return seal.ModeProductKey
}

// samePackage is the manifest package a joiner must satisfy: this
// enclave's MRENCLAVE (UniqueKey), or its MRSIGNER and ProductID with an
// ISVSVN at least its own (ProductKey, and any other mode); the debug
// attribute as its own.
func samePackage(self *sgxquote.ReportBody, mode string) manifest.Package {
	pkg := manifest.Package{Debug: self.Debug()}
	if mode == seal.ModeUniqueKey {
		mr := self.MRENCLAVE()
		pkg.UniqueID = hex.EncodeToString(mr[:])
		return pkg
	}
	signer := self.MRSIGNER()
	prod, svn := uint64(self.ISVProdID()), uint(self.ISVSVN())
	pkg.SignerID = hex.EncodeToString(signer[:])
	pkg.ProductID, pkg.SecurityVersion = &prod, &svn
	return pkg
}
