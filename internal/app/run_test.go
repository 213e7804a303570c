package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/testpki"
)

// logBuffer collects log lines for a test (written from the app's
// goroutines).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// addr returns the address logged with msg, waiting for it.
func (l *logBuffer) addr(t *testing.T, msg string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		lines := strings.Split(l.buf.String(), "\n")
		l.mu.Unlock()
		for _, line := range lines {
			var e struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == msg {
				return e.Addr
			}
		}
	}
	t.Fatalf("no %q in the log", msg)
	return ""
}

func testConfig(t *testing.T, env map[string]string) config.Config {
	t.Helper()
	all := map[string]string{
		"EDG_COORDINATOR_CLIENT_ADDR": "127.0.0.1:0",
		"EDG_COORDINATOR_MESH_ADDR":   "127.0.0.1:0",
		"EDG_COORDINATOR_SEAL_DIR":    t.TempDir(),
	}
	for k, v := range env {
		all[k] = v
	}
	cfg, err := config.Load(func(k string) string { return all[k] }, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func clientCert(t *testing.T) tls.Certificate {
	t.Helper()
	return testpki.SelfSigned(t, "marble", testpki.Serial(1)).TLS()
}

// TestRunServesBothAPIs checks that Run serves the Client API and the
// Marble API (presenting the Marble Root) and stops both on cancel.
func TestRunServesBothAPIs(t *testing.T) {
	var logs logBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := New(ctx, testConfig(t, nil), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	meshAddr := logs.addr(t, "marble API listening")
	clientAddr := logs.addr(t, "client API listening")

	conn, err := tls.Dial("tcp", meshAddr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"},
		Certificates: []tls.Certificate{clientCert(t)}})
	if err != nil {
		t.Fatalf("marble API handshake: %v", err)
	}
	got := conn.ConnectionState().PeerCertificates
	conn.Close()
	if want := a.core.MarbleTLSCertificate().Leaf; len(got) != 4 || !got[0].Equal(want) || got[1].Subject.CommonName != "MarbleRun Coordinator - Intermediate CA" {
		t.Fatal("the marble API does not present its serving certificate and the Marble Root with its chain")
	}
	conn, err = tls.Dial("tcp", clientAddr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("client API handshake: %v", err)
	}
	conn.Close()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	for _, addr := range []string{meshAddr, clientAddr} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Run returned", addr)
		}
	}
}

// TestRunMeshAddressInUse checks that a Marble API that cannot listen stops
// the app, and that the Client API's port is released.
func TestRunMeshAddressInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	clientAddr := free.Addr().String()
	free.Close()
	cfg := testConfig(t, map[string]string{"EDG_COORDINATOR_CLIENT_ADDR": clientAddr, "EDG_COORDINATOR_MESH_ADDR": busy.Addr().String()})
	a, err := New(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "marble API") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Run with the mesh address in use: %v", err)
	}
	ln, err := net.Listen("tcp", clientAddr)
	if err != nil {
		t.Fatalf("the client API's port was not released: %v", err)
	}
	ln.Close()
}

func TestActivationEventsOption(t *testing.T) {
	for in, want := range map[int]int{0: -1, 1: 1, 10_000: 10_000} {
		if got := activationEvents(in); got != want {
			t.Errorf("activationEvents(%d) = %d, want %d", in, got, want)
		}
	}
}
