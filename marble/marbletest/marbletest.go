// Package marbletest fakes a Coordinator's Marble API for tests of Marbles
// and premains: a real gRPC server over real TLS on a loopback port. It
// presents the certificates a Coordinator presents (the Marble Root, the
// intermediate and the root of a CA of its own, so that a Marble can pin
// it) or, for impostors, any certificate the test gives; asks for a client
// certificate, as a Coordinator does; records every activation request
// with the certificates the Marble presented; and answers through a
// function of the test.
package marbletest

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/ca"
)

// Request is one activation request as the Coordinator received it.
type Request struct {
	Quote      []byte
	CSR        []byte
	MarbleType string
	UUID       string
	// Peer holds the TLS client certificates the Marble presented, leaf
	// first.
	Peer []*x509.Certificate
}

// Handler answers an activation request: the parameters, or an error
// (status.Error for a gRPC code; other errors become Unknown).
type Handler func(Request) (*marblepb.Parameters, error)

// Coordinator is the fake Marble API.
type Coordinator struct {
	// Addr is the address to give the Marble (127.0.0.1:port).
	Addr string
	// Cert is the server's TLS certificate (the leaf it presents).
	Cert *x509.Certificate
	// CA is the Coordinator's certificate authority (nil for a server
	// started with a certificate of the test); CA.Root is what a Marble
	// pins.
	CA *ca.Authority

	handler Handler
	srv     *grpc.Server

	mu   sync.Mutex
	reqs []Request
}

// New serves h on a free loopback port until tb's cleanup.
func New(tb testing.TB, h Handler) *Coordinator {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return Serve(tb, ln, h)
}

// NewWithCertificate serves h on a free loopback port presenting cert
// (its chain and key), as an impostor of the Coordinator would.
func NewWithCertificate(tb testing.TB, cert tls.Certificate, h Handler) *Coordinator {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return serve(tb, ln, cert, nil, h)
}

// Serve serves h on ln until tb's cleanup (tests that start the
// Coordinator late listen on an address they reserved).
func Serve(tb testing.TB, ln net.Listener, h Handler) *Coordinator {
	tb.Helper()
	a, err := ca.New(rand.Reader, ca.Names{DNS: []string{"localhost"}}, time.Now())
	if err != nil {
		ln.Close()
		tb.Fatal(err)
	}
	return serve(tb, ln, *a.MarbleTLSCertificate(), a, h)
}

func serve(tb testing.TB, ln net.Listener, tlsCert tls.Certificate, a *ca.Authority, h Handler) *Coordinator {
	tb.Helper()
	leaf, err := x509.ParseCertificate(tlsCert.Certificate[0])
	if err != nil {
		ln.Close()
		tb.Fatal(err)
	}
	c := &Coordinator{Addr: ln.Addr().String(), Cert: leaf, CA: a, handler: h}
	c.srv = grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{tlsCert},
		ClientAuth:   tls.RequireAnyClientCert, // checked through the quote, as a Coordinator does
		MinVersion:   tls.VersionTLS12,
	})))
	marblepb.RegisterMarbleServer(c.srv, server{c: c})
	go c.srv.Serve(ln)
	tb.Cleanup(c.Close)
	return c
}

// Close stops the server at once.
func (c *Coordinator) Close() { c.srv.Stop() }

// Requests returns the requests received so far, oldest first.
func (c *Coordinator) Requests() []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Request(nil), c.reqs...)
}

// server implements the gRPC service.
type server struct {
	marblepb.UnimplementedMarbleServer
	c *Coordinator
}

func (s server) Activate(ctx context.Context, in *marblepb.ActivationReq) (*marblepb.ActivationResp, error) {
	req := Request{Quote: in.GetQuote(), CSR: in.GetCSR(), MarbleType: in.GetMarbleType(), UUID: in.GetUUID()}
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			req.Peer = info.State.PeerCertificates
		}
	}
	s.c.mu.Lock()
	s.c.reqs = append(s.c.reqs, req)
	s.c.mu.Unlock()
	params, err := s.c.handler(req)
	if err != nil {
		return nil, err
	}
	return &marblepb.ActivationResp{Parameters: params}, nil
}

// Refuse returns a Handler that answers every request with code and msg.
func Refuse(code codes.Code, msg string) Handler {
	return func(Request) (*marblepb.Parameters, error) { return nil, status.Error(code, msg) }
}

// Check checks a request's credentials as a Coordinator would, and returns
// the parsed CSR: a client certificate was presented, the CSR parses, its
// signature is valid and its key is the client certificate's. The quote is
// not checked; it must carry r.ReportData().
func (r Request) Check() (*x509.CertificateRequest, error) {
	if len(r.Peer) == 0 {
		return nil, errors.New("no TLS client certificate")
	}
	csr, err := x509.ParseCertificateRequest(r.CSR)
	if err != nil {
		return nil, fmt.Errorf("parsing CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("CSR signature: %w", err)
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(r.Peer[0].PublicKey) {
		return nil, errors.New("the CSR's key is not the client certificate's")
	}
	return csr, nil
}

// ReportData returns the report data the request's quote must carry:
// SHA-256 of the TLS client certificate (zero without one).
func (r Request) ReportData() [64]byte {
	if len(r.Peer) == 0 {
		return [64]byte{}
	}
	return ReportData(r.Peer[0].Raw)
}

// ReportData is the report data a Marble's quote covers: SHA-256 of its
// TLS client certificate (DER) in the first 32 bytes.
func ReportData(certDER []byte) [64]byte {
	var rd [64]byte
	h := sha256.Sum256(certDER)
	copy(rd[:], h[:])
	return rd
}

// ReportDataIssuer is a quote issuer whose "quote" is the report data
// itself: such a request's Quote equals its ReportData().
type ReportDataIssuer struct{}

// Issue returns reportData.
func (ReportDataIssuer) Issue(_ context.Context, reportData [64]byte) ([]byte, error) {
	return reportData[:], nil
}
