package marbleapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/testpki"
)

// fakeCoordinator answers activations with a function and records the
// requests it got.
type fakeCoordinator struct {
	mu       sync.Mutex
	requests []core.ActivationRequest
	answer   func(ctx context.Context, req core.ActivationRequest) (*core.Activation, error)
}

var _ Coordinator = (*fakeCoordinator)(nil)

func (f *fakeCoordinator) Activate(ctx context.Context, req core.ActivationRequest) (*core.Activation, error) {
	f.mu.Lock()
	f.requests = append(f.requests, req)
	f.mu.Unlock()
	return f.answer(ctx, req)
}

func (f *fakeCoordinator) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

// selfSigned makes a self-signed P-256 certificate with its key.
func selfSigned(t testing.TB, cn string, isCA bool) tls.Certificate {
	t.Helper()
	return testpki.SelfSigned(t, cn, testpki.Usage(x509.KeyUsageDigitalSignature|x509.KeyUsageCertSign),
		testpki.ServerAuth(), testpki.ClientAuth(),
		testpki.Template(func(c *x509.Certificate) { c.IsCA, c.BasicConstraintsValid = isCA, true })).TLS()
}

// testServer is a Marble API server on a loopback port whose server
// certificate can be changed.
type testServer struct {
	*Server
	addr string
	cert atomic.Pointer[tls.Certificate]
	done chan error
}

func startServer(t *testing.T, c Coordinator, opts Options) *testServer {
	t.Helper()
	ts := &testServer{done: make(chan error, 1)}
	root := selfSigned(t, "MarbleRun Coordinator - Intermediate CA", true)
	ts.cert.Store(&root)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = ln.Addr().String()
	ts.Server = New(c, ts.cert.Load, opts)
	go func() { ts.done <- ts.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ts.Shutdown(ctx)
		if err := <-ts.done; err != nil {
			t.Errorf("Serve returned %v after Shutdown", err)
		}
	})
	return ts
}

// dial connects as a Marble does: TLS without verifying the server, with
// the given client certificates.
func dial(t *testing.T, addr string, certs ...tls.Certificate) marblepb.MarbleClient {
	t.Helper()
	cfg := &tls.Config{InsecureSkipVerify: true, Certificates: certs, MinVersion: tls.VersionTLS12}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(128<<20), grpc.MaxCallSendMsgSize(128<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return marblepb.NewMarbleClient(cc)
}

func activate(ctx context.Context, c marblepb.MarbleClient, opts ...grpc.CallOption) (*marblepb.ActivationResp, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.Activate(ctx, &marblepb.ActivationReq{Quote: []byte("quote"), CSR: []byte("csr"), MarbleType: "backend", UUID: "uuid"}, opts...)
}

func expectStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code || (msg != "" && st.Message() != msg) {
		t.Fatalf("error = %v, want code %v with message %q", err, code, msg)
	}
}

func TestActivatePassesRequestAndPeer(t *testing.T) {
	want := &core.Activation{
		Files: map[string][]byte{"/etc/app.conf": []byte("conf"), "/empty": {}},
		Env:   map[string][]byte{"A": []byte("1"), "MARBLE_PREDEFINED_ROOT_CA": []byte("pem")},
		Argv:  []string{"./app", "--flag"},
	}
	fake := &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) { return want, nil }}
	ts := startServer(t, fake, Options{})
	client := selfSigned(t, "MarbleRun Marble", false)
	other := selfSigned(t, "second", false)
	resp, err := activate(context.Background(), dial(t, ts.addr, tls.Certificate{
		Certificate: [][]byte{client.Certificate[0], other.Certificate[0]}, PrivateKey: client.PrivateKey}))
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetParameters()
	if fmt.Sprint(p.GetFiles()) != fmt.Sprint(want.Files) || fmt.Sprint(p.GetEnv()) != fmt.Sprint(want.Env) || fmt.Sprint(p.GetArgv()) != fmt.Sprint(want.Argv) {
		t.Fatalf("parameters = %v, want %+v", p, want)
	}
	req := fake.requests[0]
	if string(req.Quote) != "quote" || string(req.CSR) != "csr" || req.MarbleType != "backend" || req.UUID != "uuid" {
		t.Fatalf("request = %+v", req)
	}
	// The whole chain as presented, leaf first (the core uses the leaf only).
	if len(req.Peer) != 2 || !bytes.Equal(req.Peer[0].Raw, client.Certificate[0]) || !bytes.Equal(req.Peer[1].Raw, other.Certificate[0]) {
		t.Fatalf("peer chain not passed on: %d certificates", len(req.Peer))
	}
}

// TestRefusalCodes checks every class of refusal (docs/design/behaviour.md#activation-checks) and
// that an unclassified failure shows nothing of its cause.
func TestRefusalCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"wrong state", fmt.Errorf("%w: cannot accept marbles in current state", core.ErrWrongState), codes.FailedPrecondition,
			"server is not in expected state: cannot accept marbles in current state"},
		{"wrong state error", &core.WrongStateError{State: core.StateAcceptingManifest, Op: "activate"}, codes.FailedPrecondition, ""},
		{"unauthenticated", fmt.Errorf("couldn't get marble TLS certificate: %w", core.ErrUnauthenticated), codes.Unauthenticated,
			"couldn't get marble TLS certificate: unauthorized user"},
		{"forbidden", fmt.Errorf("%w: marble verification failed: unknown marble type requested", core.ErrForbidden), codes.PermissionDenied, ""},
		{"invalid", fmt.Errorf("%w: invalid UUID: bad length", core.ErrInvalidRequest), codes.InvalidArgument, "invalid request: invalid UUID: bad length"},
		{"conflict", fmt.Errorf("%w: the manifest changed during the activation; activate again", core.ErrConflict), codes.Aborted, ""},
		{"unclassified", errors.New("disk on fire: /secret/path"), codes.Internal, "internal error; see the Coordinator's log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) { return nil, tc.err }}
			ts := startServer(t, fake, Options{})
			_, err := activate(context.Background(), dial(t, ts.addr, selfSigned(t, "m", false)))
			expectStatus(t, err, tc.code, tc.msg)
			if tc.code != codes.Internal && status.Convert(err).Message() != tc.err.Error() {
				t.Fatalf("message = %q, want the core's %q", status.Convert(err).Message(), tc.err.Error())
			}
		})
	}
}

func TestPanicIsInternalAndServerGoesOn(t *testing.T) {
	var n atomic.Int32
	fake := &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) {
		if n.Add(1) == 1 {
			panic("boom")
		}
		return &core.Activation{Argv: []string{"ok"}}, nil
	}}
	ts := startServer(t, fake, Options{})
	c := dial(t, ts.addr, selfSigned(t, "m", false))
	_, err := activate(context.Background(), c)
	expectStatus(t, err, codes.Internal, "internal error; see the Coordinator's log")
	resp, err := activate(context.Background(), c)
	if err != nil || resp.GetParameters().GetArgv()[0] != "ok" {
		t.Fatalf("after a panic: %v %v", resp, err)
	}
}

func TestRequestTooLarge(t *testing.T) {
	fake := &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) {
		return &core.Activation{}, nil
	}}
	ts := startServer(t, fake, Options{})
	c := dial(t, ts.addr, selfSigned(t, "m", false))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Activate(ctx, &marblepb.ActivationReq{Quote: make([]byte, DefaultMaxRecvBytes), MarbleType: "backend"})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized request: %v, want ResourceExhausted", err)
	}
	if fake.calls() != 0 {
		t.Fatal("the oversized request reached the Coordinator")
	}
	// Just under the limit passes.
	if _, err := c.Activate(ctx, &marblepb.ActivationReq{Quote: make([]byte, DefaultMaxRecvBytes-64)}); err != nil {
		t.Fatalf("request under the limit: %v", err)
	}
}

func TestAnswerTooLarge(t *testing.T) {
	fake := &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) {
		return &core.Activation{Files: map[string][]byte{"/big": make([]byte, 2<<20)}}, nil
	}}
	ts := startServer(t, fake, Options{MaxSendBytes: 1 << 20})
	_, err := activate(context.Background(), dial(t, ts.addr, selfSigned(t, "m", false)))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized answer: %v, want ResourceExhausted", err)
	}
}

func TestMaxSendBytesFor(t *testing.T) {
	if got := MaxSendBytesFor(8 << 20); got != DefaultMaxSendBytes || DefaultMaxSendBytes != 76<<20 {
		t.Fatalf("MaxSendBytesFor(8 MiB) = %d, want %d", got, DefaultMaxSendBytes)
	}
	if got := MaxSendBytesFor(1 << 40); got != 1<<31-1 {
		t.Fatalf("MaxSendBytesFor(1 TiB) = %d, want the int32 maximum gRPC can frame", got)
	}
}

func TestNoClientCertificate(t *testing.T) {
	fake := &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) {
		return &core.Activation{}, nil
	}}
	ts := startServer(t, fake, Options{})
	_, err := activate(context.Background(), dial(t, ts.addr))
	if c := status.Code(err); c != codes.Unavailable && c != codes.Unauthenticated {
		t.Fatalf("without a client certificate: %v, want the handshake to fail", err)
	}
	// The raw handshake: the server demands a certificate.
	conn, err := tls.Dial("tcp", ts.addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err == nil {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("handshake without a client certificate: %v, want 'certificate required'", err)
	}
	if fake.calls() != 0 {
		t.Fatal("a request without a client certificate reached the Coordinator")
	}
}

func TestOldTLSRefused(t *testing.T) {
	ts := startServer(t, &fakeCoordinator{}, Options{})
	conn, err := tls.Dial("tcp", ts.addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11,
		Certificates: []tls.Certificate{selfSigned(t, "m", false)}})
	if err == nil {
		conn.Close()
		t.Fatal("TLS 1.1 accepted")
	}
}

// TestServerPresentsCurrentMarbleRoot checks that every new connection gets
// the certificate the Coordinator has now (the Marble Root changes with
// updates and recovery).
func TestServerPresentsCurrentMarbleRoot(t *testing.T) {
	fake := &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) {
		return &core.Activation{}, nil
	}}
	ts := startServer(t, fake, Options{})
	presented := func() []byte {
		t.Helper()
		var p peer.Peer
		if _, err := activate(context.Background(), dial(t, ts.addr, selfSigned(t, "m", false)), grpc.Peer(&p)); err != nil {
			t.Fatal(err)
		}
		chain := p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates
		if len(chain) != 1 {
			t.Fatalf("server presented %d certificates, want the Marble Root alone", len(chain))
		}
		return chain[0].Raw
	}
	if got := presented(); !bytes.Equal(got, ts.cert.Load().Certificate[0]) {
		t.Fatal("server did not present the Marble Root")
	}
	next := selfSigned(t, "MarbleRun Coordinator - Intermediate CA", true)
	ts.cert.Store(&next)
	if got := presented(); !bytes.Equal(got, next.Certificate[0]) {
		t.Fatal("server did not present the new Marble Root")
	}
}

func TestDeadline(t *testing.T) {
	fake := &fakeCoordinator{answer: func(ctx context.Context, _ core.ActivationRequest) (*core.Activation, error) {
		<-ctx.Done()
		return nil, fmt.Errorf("storing the activation count: %w", ctx.Err())
	}}
	ts := startServer(t, fake, Options{RequestTimeout: 100 * time.Millisecond})
	_, err := activate(context.Background(), dial(t, ts.addr, selfSigned(t, "m", false)))
	expectStatus(t, err, codes.DeadlineExceeded, "the activation did not finish within 100ms and was abandoned; nothing was stored; activate again")
}

// TestShutdownWaitsForActivations checks the graceful stop: a running
// activation finishes and is answered; a stop whose time is up cuts it off.
func TestShutdownWaitsForActivations(t *testing.T) {
	for _, graceful := range []bool{true, false} {
		t.Run(fmt.Sprint("graceful=", graceful), func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			fake := &fakeCoordinator{answer: func(ctx context.Context, _ core.ActivationRequest) (*core.Activation, error) {
				close(started)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return &core.Activation{Argv: []string{"done"}}, nil
			}}
			ts := startServer(t, fake, Options{})
			errc := make(chan error, 1)
			go func() {
				_, err := activate(context.Background(), dial(t, ts.addr, selfSigned(t, "m", false)))
				errc <- err
			}()
			<-started
			ctx, cancel := context.WithCancel(context.Background())
			if graceful {
				time.AfterFunc(200*time.Millisecond, func() { close(release) })
			} else {
				cancel()
				defer close(release)
			}
			err := ts.Shutdown(ctx)
			cancel()
			got := <-errc
			if graceful && (err != nil || got != nil) {
				t.Fatalf("graceful: Shutdown %v, activation %v", err, got)
			}
			if !graceful && (err == nil || got == nil) {
				t.Fatalf("cut off: Shutdown %v, activation %v; want both to fail", err, got)
			}
		})
	}
}

// TestEveryCoreClassHasACode sends every error class of the core through the
// Marble API's one error→code map: none may become Internal, and an
// unavailable store is Unavailable (a Marble retries it) with a message
// that names no store detail.
func TestEveryCoreClassHasACode(t *testing.T) {
	want := map[error]codes.Code{
		core.ErrWrongState:      codes.FailedPrecondition,
		core.ErrInvalidRequest:  codes.InvalidArgument,
		core.ErrUnauthenticated: codes.Unauthenticated,
		core.ErrForbidden:       codes.PermissionDenied,
		core.ErrNotFound:        codes.NotFound,
		core.ErrConflict:        codes.Aborted,
		core.ErrUnavailable:     codes.Unavailable,
		core.ErrTooLarge:        codes.ResourceExhausted,
	}
	for _, class := range core.ErrorClasses() {
		code, ok := want[class]
		if !ok {
			t.Errorf("core class %q has no expected code in this test: decide its code, map it in codeOf and add it here", class)
			continue
		}
		if got := codeOf(fmt.Errorf("%w: detail", class)); got != code {
			t.Errorf("codeOf(%q) = %v, want %v", class, got, code)
		}
	}
	fake := &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) {
		return nil, fmt.Errorf("%w: context deadline exceeded (etcd 10.0.0.7:2379)", core.ErrUnavailable)
	}}
	ts := startServer(t, fake, Options{})
	_, err := activate(context.Background(), dial(t, ts.addr, selfSigned(t, "m", false)))
	expectStatus(t, err, codes.Unavailable, "the Coordinator cannot reach its state store; activate again")
}
