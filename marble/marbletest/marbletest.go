// Package marbletest fakes a Coordinator's Marble API for tests of Marbles
// and premains: a real gRPC server over real TLS on a loopback port. It
// asks for a client certificate, as a Coordinator does, records every
// activation request with the certificates the Marble presented, and
// answers through a function of the test.
package marbletest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
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
	// Cert is the server's self-signed TLS certificate.
	Cert *x509.Certificate

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

// Serve serves h on ln until tb's cleanup (tests that start the
// Coordinator late listen on an address they reserved).
func Serve(tb testing.TB, ln net.Listener, h Handler) *Coordinator {
	tb.Helper()
	cert, tlsCert, err := serverCert()
	if err != nil {
		ln.Close()
		tb.Fatal(err)
	}
	c := &Coordinator{Addr: ln.Addr().String(), Cert: cert, handler: h}
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

// serverCert makes the fake Coordinator's self-signed certificate.
func serverCert() (*x509.Certificate, tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "marbletest Coordinator"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return cert, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, nil
}
