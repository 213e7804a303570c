package marble_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/marble"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// answer is a Handler that checks the request's credentials and returns
// params.
func answer(t *testing.T, params *marblepb.Parameters) marbletest.Handler {
	return func(req marbletest.Request) (*marblepb.Parameters, error) {
		if _, err := req.Check(); err != nil {
			t.Errorf("request: %v", err)
			return nil, status.Error(codes.PermissionDenied, err.Error())
		}
		// A quote comes from marbletest.ReportDataIssuer here.
		if rd := req.ReportData(); len(req.Quote) > 0 && !bytes.Equal(req.Quote, rd[:]) {
			t.Errorf("quote %x, want the report data %x", req.Quote, rd)
			return nil, status.Error(codes.PermissionDenied, "invalid quote")
		}
		return params, nil
	}
}

// options returns Options for coord with the UUID file in a temporary
// directory and fast retries.
func options(t *testing.T, coord *marbletest.Coordinator) marble.Options {
	return marble.Options{
		MarbleType:      "backend",
		CoordinatorAddr: coord.Addr,
		UUIDFile:        filepath.Join(t.TempDir(), "uuid"),
		RetryDelay:      10 * time.Millisecond,
	}
}

func TestActivateSimulation(t *testing.T) {
	want := &marblepb.Parameters{
		Files: map[string][]byte{"/etc/app/config": []byte("cfg")},
		Env:   map[string][]byte{"MARBLE_PREDEFINED_ROOT_CA": []byte("pem")},
		Argv:  []string{"app", "--flag"},
	}
	coord := marbletest.New(t, answer(t, want))
	opts := options(t, coord)
	opts.DNSNames = []string{"backend.example", "10.0.0.7", "::1"}
	got, err := marble.Activate(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Files["/etc/app/config"], []byte("cfg")) || string(got.Env["MARBLE_PREDEFINED_ROOT_CA"]) != "pem" ||
		!slices.Equal(got.Argv, want.Argv) || len(got.Files) != 1 || len(got.Env) != 1 {
		t.Errorf("parameters = %+v, want %+v", got, want)
	}

	reqs := coord.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	req := reqs[0]
	if len(req.Quote) != 0 {
		t.Errorf("quote = %x, want empty in simulation", req.Quote)
	}
	if req.MarbleType != "backend" {
		t.Errorf("MarbleType = %q", req.MarbleType)
	}
	fileUUID, err := os.ReadFile(opts.UUIDFile)
	if err != nil {
		t.Fatal(err)
	}
	u, err := uuid.Parse(req.UUID)
	if err != nil || u.String() != req.UUID || u.Version() != 4 || string(fileUUID) != req.UUID {
		t.Errorf("UUID %q (file %q): want the canonical v4 UUID of the file (err %v)", req.UUID, fileUUID, err)
	}

	csr, err := req.Check()
	if err != nil {
		t.Fatal(err)
	}
	cert := req.Peer[0]
	wantIPs := []string{"10.0.0.7", "127.0.0.1", "::1"}
	for name, sans := range map[string]struct {
		dns []string
		ips []net.IP
	}{"certificate": {cert.DNSNames, cert.IPAddresses}, "CSR": {csr.DNSNames, csr.IPAddresses}} {
		if !slices.Equal(sans.dns, []string{"backend.example"}) {
			t.Errorf("%s DNS SANs = %q", name, sans.dns)
		}
		var ips []string
		for _, ip := range sans.ips {
			ips = append(ips, ip.String())
		}
		slices.Sort(ips)
		if !slices.Equal(ips, wantIPs) {
			t.Errorf("%s IP SANs = %q, want %q", name, ips, wantIPs)
		}
	}
	if cert.Subject.CommonName != "MarbleRun Marble" || cert.Issuer.CommonName != "MarbleRun Marble" {
		t.Errorf("certificate subject %q issuer %q", cert.Subject, cert.Issuer)
	}
	if err := cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature); err != nil {
		t.Errorf("certificate is not self-signed: %v", err)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("certificate key %T, want ECDSA P-256", cert.PublicKey)
	}
	if now := time.Now(); now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		t.Errorf("certificate valid %s to %s", cert.NotBefore, cert.NotAfter)
	}
}

func TestActivateDefaultDNSName(t *testing.T) {
	coord := marbletest.New(t, answer(t, &marblepb.Parameters{}))
	if _, err := marble.Activate(context.Background(), options(t, coord)); err != nil {
		t.Fatal(err)
	}
	cert := coord.Requests()[0].Peer[0]
	if !slices.Equal(cert.DNSNames, []string{"localhost"}) || len(cert.IPAddresses) != 2 {
		t.Errorf("SANs %q %v, want localhost, 127.0.0.1, ::1", cert.DNSNames, cert.IPAddresses)
	}
}

func TestActivateQuote(t *testing.T) {
	coord := marbletest.New(t, answer(t, &marblepb.Parameters{}))
	opts := options(t, coord)
	opts.Issuer = marbletest.ReportDataIssuer{}
	if _, err := marble.Activate(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	req := coord.Requests()[0]
	want := marbletest.ReportData(req.Peer[0].Raw)
	if !bytes.Equal(req.Quote, want[:]) {
		t.Fatalf("quote %x, want %x", req.Quote, want)
	}
}

// issuerFunc adapts a function to marble.Issuer.
type issuerFunc func(context.Context, [64]byte) ([]byte, error)

func (f issuerFunc) Issue(ctx context.Context, rd [64]byte) ([]byte, error) { return f(ctx, rd) }

func TestActivateIssuerFailures(t *testing.T) {
	t.Run("unsupported means simulation", func(t *testing.T) {
		coord := marbletest.New(t, answer(t, &marblepb.Parameters{}))
		opts := options(t, coord)
		opts.Issuer = attest.SimulationIssuer{}
		if _, err := marble.Activate(context.Background(), opts); err != nil {
			t.Fatal(err)
		}
		if q := coord.Requests()[0].Quote; len(q) != 0 {
			t.Errorf("quote %x, want empty", q)
		}
	})
	t.Run("other errors fail", func(t *testing.T) {
		coord := marbletest.New(t, answer(t, &marblepb.Parameters{}))
		opts := options(t, coord)
		boom := errors.New("quoting device broken")
		opts.Issuer = issuerFunc(func(context.Context, [64]byte) ([]byte, error) { return nil, boom })
		_, err := marble.Activate(context.Background(), opts)
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v, want the issuer's", err)
		}
		if n := len(coord.Requests()); n != 0 {
			t.Errorf("%d requests sent after a failed quote", n)
		}
	})
}

func TestActivateUUIDFile(t *testing.T) {
	coord := marbletest.New(t, answer(t, &marblepb.Parameters{}))
	opts := options(t, coord)
	for range 2 {
		if _, err := marble.Activate(context.Background(), opts); err != nil {
			t.Fatal(err)
		}
	}
	reqs := coord.Requests()
	if reqs[0].UUID != reqs[1].UUID {
		t.Errorf("UUIDs %s and %s differ; the file should be reused", reqs[0].UUID, reqs[1].UUID)
	}
	if bytes.Equal(reqs[0].Peer[0].Raw, reqs[1].Peer[0].Raw) {
		t.Error("both activations used the same certificate; each needs a fresh key")
	}
	fi, err := os.Stat(opts.UUIDFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("UUID file mode %v, want 0600", fi.Mode().Perm())
	}

	// Other forms are accepted and sent canonically.
	const given = "{6BA7B810-9DAD-11D1-80B4-00C04FD430C8}\n"
	if err := os.WriteFile(opts.UUIDFile, []byte(given), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := marble.Activate(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	if got := coord.Requests()[2].UUID; got != "6ba7b810-9dad-11d1-80b4-00c04fd430c8" {
		t.Errorf("UUID sent %q, want the canonical form", got)
	}

	// A broken file fails before anything is sent.
	if err := os.WriteFile(opts.UUIDFile, []byte("not a uuid"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := marble.Activate(context.Background(), opts); err == nil || !strings.Contains(err.Error(), opts.UUIDFile) {
		t.Errorf("err = %v, want one naming the UUID file", err)
	}
	// So does a missing directory.
	opts.UUIDFile = filepath.Join(t.TempDir(), "missing", "uuid")
	if _, err := marble.Activate(context.Background(), opts); err == nil {
		t.Error("no error for a UUID file in a missing directory")
	}
	if n := len(coord.Requests()); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}
}

func TestActivateRetries(t *testing.T) {
	var calls atomic.Int32
	coord := marbletest.New(t, func(req marbletest.Request) (*marblepb.Parameters, error) {
		switch calls.Add(1) {
		case 1, 2:
			return nil, status.Error(codes.Unavailable, "busy")
		case 3:
			return nil, status.Error(codes.FailedPrecondition, "cannot accept marbles in current state")
		}
		return &marblepb.Parameters{Argv: []string{"ok"}}, nil
	})
	p, err := marble.Activate(context.Background(), options(t, coord))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Argv, []string{"ok"}) || calls.Load() != 4 {
		t.Errorf("Argv %q after %d calls, want ok after 4", p.Argv, calls.Load())
	}
	// The same credentials are sent every time.
	reqs := coord.Requests()
	for _, r := range reqs[1:] {
		if !bytes.Equal(r.CSR, reqs[0].CSR) || !bytes.Equal(r.Peer[0].Raw, reqs[0].Peer[0].Raw) || r.UUID != reqs[0].UUID {
			t.Error("a retry sent other credentials")
		}
	}
}

func TestActivateGivesUp(t *testing.T) {
	coord := marbletest.New(t, marbletest.Refuse(codes.FailedPrecondition, "cannot accept marbles in current state"))
	opts := options(t, coord)
	opts.Attempts = 3
	_, err := marble.Activate(context.Background(), opts)
	var ce *marble.CoordinatorError
	if !errors.As(err, &ce) || ce.Code != codes.FailedPrecondition || ce.Message != "cannot accept marbles in current state" {
		t.Fatalf("err = %v, want the Coordinator's FailedPrecondition", err)
	}
	if !strings.Contains(err.Error(), "3 attempts") {
		t.Errorf("err = %v, want it to count the attempts", err)
	}
	if n := len(coord.Requests()); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}
}

func TestActivateWaitsForCoordinator(t *testing.T) {
	// Reserve a port, close it, and start the Coordinator there late.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	opts := marble.Options{MarbleType: "backend", CoordinatorAddr: addr,
		UUIDFile: filepath.Join(t.TempDir(), "uuid"), RetryDelay: 20 * time.Millisecond, Attempts: 50}
	type result struct {
		p   *marble.Parameters
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := marble.Activate(context.Background(), opts)
		done <- result{p, err}
	}()
	time.Sleep(150 * time.Millisecond)
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	marbletest.Serve(t, ln, answer(t, &marblepb.Parameters{Argv: []string{"late"}}))
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !slices.Equal(r.p.Argv, []string{"late"}) {
		t.Errorf("Argv %q", r.p.Argv)
	}
}

func TestActivateUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	opts := marble.Options{MarbleType: "backend", CoordinatorAddr: addr,
		UUIDFile: filepath.Join(t.TempDir(), "uuid"), RetryDelay: time.Millisecond, Attempts: 2}
	_, err = marble.Activate(context.Background(), opts)
	var ce *marble.CoordinatorError
	if !errors.As(err, &ce) || ce.Code != codes.Unavailable || !strings.Contains(err.Error(), addr) {
		t.Fatalf("err = %v, want Unavailable naming %s", err, addr)
	}
}

func TestActivateRefusals(t *testing.T) {
	for _, code := range []codes.Code{codes.PermissionDenied, codes.InvalidArgument, codes.Internal, codes.Unauthenticated} {
		t.Run(code.String(), func(t *testing.T) {
			const msg = "marble verification failed: unknown marble type requested"
			coord := marbletest.New(t, marbletest.Refuse(code, msg))
			start := time.Now()
			_, err := marble.Activate(context.Background(), options(t, coord))
			var ce *marble.CoordinatorError
			if !errors.As(err, &ce) || ce.Code != code || ce.Message != msg {
				t.Fatalf("err = %v, want %s %q", err, code, msg)
			}
			if !strings.Contains(err.Error(), msg) {
				t.Errorf("err %q does not carry the message", err)
			}
			if n := len(coord.Requests()); n != 1 || time.Since(start) > 5*time.Second {
				t.Errorf("%d requests, want 1 (no retry)", n)
			}
		})
	}
}

func TestActivateCancelled(t *testing.T) {
	coord := marbletest.New(t, marbletest.Refuse(codes.Unavailable, "not yet"))
	opts := options(t, coord)
	opts.RetryDelay = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := marble.Activate(ctx, opts)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Error("Activate did not end with its context")
	}
}

func TestActivateLargeResponse(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 6<<20) // above gRPC's default 4 MiB
	coord := marbletest.New(t, answer(t, &marblepb.Parameters{Files: map[string][]byte{"big": big}}))
	p, err := marble.Activate(context.Background(), options(t, coord))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Files["big"]) != len(big) {
		t.Errorf("file of %d bytes, want %d", len(p.Files["big"]), len(big))
	}
}

func TestActivateOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts marble.Options
		want string
	}{
		{"no type", marble.Options{}, "no Marble type"},
		{"negative attempts", marble.Options{MarbleType: "a", Attempts: -1}, "attempts"},
		{"negative delay", marble.Options{MarbleType: "a", RetryDelay: -time.Second}, "delay"},
		{"empty DNS name", marble.Options{MarbleType: "a", DNSNames: []string{"a", ""}}, "empty DNS name"},
		{"bad address", marble.Options{MarbleType: "a", CoordinatorAddr: "bad://%zz", UUIDFile: filepath.Join(t.TempDir(), "uuid")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := marble.Activate(context.Background(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
