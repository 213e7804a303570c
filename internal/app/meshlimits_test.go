package app

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/peer"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// TestPeerRefusalsRateLimited: twenty refused peer key requests in a row
// (each from its own loopback address, so no connection limit applies;
// each speaks protocol version 1, refused at once) make one log line, not
// twenty: anyone who reaches the port could otherwise flood the log.
func TestPeerRefusalsRateLimited(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	w := newSGXWorld(t, cluster)
	in := w.start(t)
	addr := in.logs.addr(t, "peer key server listening")
	cert, err := peer.NewCertificate()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}, Timeout: 5 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatal(err)
		}
		io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[:])))
		req, _ := json.Marshal(map[string]any{"version": 1, "keyID": make([]byte, 32), "nonce": make([]byte, 32)})
		c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(req))), req...))
		io.Copy(io.Discard, c) // the refusal, then the server closes
		c.Close()
	}
	// The server reports each exchange after it closed it.
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(in.log(), "peer key request refused"); n != 1 {
		t.Fatalf("%d log lines for 20 refused peer key requests within 10 s, want 1\n%s", n, in.log())
	}
	if !strings.Contains(in.log(), "refusalsNotLogged") {
		t.Fatal("the refusal line does not say how many were left out")
	}
}

// TestInsecurePeerServerSaysSo: with --insecure-peer-trust in simulation
// the peer key server's listening line carries the INSECURE marker (it
// gives the data key to anyone who asks); under an enclave it does not.
func TestInsecurePeerServerSaysSo(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peerAddr := ln.Addr().String()
	ln.Close()
	cfg := testConfig(t, map[string]string{
		"QUARRY_STORE": "etcd", "QUARRY_ETCD_ENDPOINTS": strings.Join(cluster.Endpoints(), ","), "QUARRY_ETCD_PREFIX": "/insecure/",
		"QUARRY_PEER_ADDR": peerAddr, "QUARRY_INSECURE_PEER_TRUST": "1",
	})
	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := New(ctx, cfg, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	logs.addr(t, "state loaded; serving") // the peer key server listens once the state is loaded
	var line string
	logs.mu.Lock()
	all := logs.buf.String()
	logs.mu.Unlock()
	for l := range strings.SplitSeq(all, "\n") {
		if strings.Contains(l, "peer key server listening") {
			line = l
		}
	}
	if !strings.Contains(line, "INSECURE") || !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, peerAddr) {
		t.Fatalf("listening line %q, want a WARN with INSECURE and the address", line)
	}
	// Under the Gramine fake (an enclave) the line is plain.
	in := newSGXWorld(t, cluster).start(t)
	if strings.Contains(in.log(), "INSECURE") {
		t.Fatalf("INSECURE under an enclave:\n%s", in.log())
	}
}
