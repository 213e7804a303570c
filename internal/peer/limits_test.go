package peer

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/limit"
	"github.com/quarry-cc/quarry/internal/seal"
)

// TestMessageBufferGrowsWithData: a message header claiming MaxMessage
// bytes followed by a few makes the reader hold about what arrived, not
// the claimed size (a peer server reads the request before anyone is
// authenticated).
func TestMessageBufferGrowsWithData(t *testing.T) {
	msg := binary.BigEndian.AppendUint32(nil, MaxMessage)
	msg = append(msg, `{"version":2`...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var req request
	err := readMsg(bytes.NewReader(msg), &req, ErrBadRequest)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a message cut short: %v, want io.ErrUnexpectedEOF", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Fatalf("reading 12 bytes of a message claiming %d allocated %d bytes", MaxMessage, got)
	}
	// A whole message of the largest size still reads.
	big := `{"version":2,"quote":"` + string(bytes.Repeat([]byte("A"), MaxMessage-40)) + `"}`
	full := append(binary.BigEndian.AppendUint32(nil, uint32(len(big))), big...)
	if err := readMsg(bytes.NewReader(full), &req, ErrBadRequest); err != nil || req.Version != 2 {
		t.Fatalf("a message of %d bytes: %v", len(big), err)
	}
}

// holdExchange opens a TLS session to the peer server from the loopback
// address from, reads the hello and sends a header claiming MaxMessage
// bytes, then nothing: what an unauthenticated flood does.
func holdExchange(t *testing.T, from, addr string) (net.Conn, error) {
	t.Helper()
	cert, err := NewCertificate()
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var h hello
	if err := readMsg(c, &h, ErrBadResponse); err != nil {
		return nil, err
	}
	if _, err := c.Write(binary.BigEndian.AppendUint32(nil, MaxMessage)); err != nil {
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// TestExchangesBounded: exchanges held open from one address take at most
// MaxExchangesPerSource places; the rest are closed at once and reported,
// and a joiner from another address is served while they are held.
func TestExchangesBounded(t *testing.T) {
	w := newWorld(t)
	s := w.genuine(t, "")
	s.MaxExchanges, s.MaxExchangesPerSource = 4, 2
	refused := make(chan limit.Refusal, 16)
	s.OnRefuse = func(r limit.Refusal) { refused <- r }
	addr, _ := serve(t, s)
	held := 0
	for range 10 {
		if _, err := holdExchange(t, "127.0.0.2", addr); err == nil {
			held++
		}
	}
	if held != 2 {
		t.Fatalf("%d exchanges held from one address, want 2", held)
	}
	// A refusal is reported after its connection is closed: the client
	// may see the close first.
	for n := range 8 {
		select {
		case r := <-refused:
			if r.Source != "127.0.0.2" || !errors.Is(r.Reason, limit.ErrSourceFull) {
				t.Errorf("refusal %+v", r)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d refusals reported, want 8", n)
		}
	}
	c := w.client(t, w.issuer(t, w.self))
	start := time.Now()
	if _, err := c.Fetch(t.Context(), addr, seal.KeyID(dek)); err != nil {
		t.Fatalf("a joiner while exchanges are held: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the joiner took %s", d)
	}
}
