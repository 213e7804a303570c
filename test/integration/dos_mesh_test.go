package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

var (
	dosMeshConns = flag.Int("dos.mesh.conns", 50, "TestDenialOfService: hostile connections of each kind held at once (1000 gives the figures in docs/http.md)")
	dosMeshWait  = flag.Bool("dos.mesh.wait", false, "TestDenialOfService: also wait out the Marble API's 10 s request read timeout and check that the server closed the held connections")
)

// The bounds the DoS suite checks while the hostile connections are held.
const (
	dosLatency = time.Second
	dosMaxRSS  = 300 << 20
	// dosOpenWait bounds the wait for the hostile connections to open.
	dosOpenWait = 5 * time.Second
	// The per-source limits of the Marble API and the peer key server
	// (their defaults).
	dosMeshPerSource = 32
	dosPeerPerSource = 4
)

// raiseNoFile raises the soft RLIMIT_NOFILE of the test process to its
// hard limit (the coordinator, started afterwards, inherits it) and fails
// when that is below need.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	if lim.Cur < need {
		t.Fatalf("RLIMIT_NOFILE is %d (hard %d); -dos.mesh.conns %d needs %d file descriptors: raise the hard limit (ulimit -Hn) or lower -dos.mesh.conns", lim.Cur, lim.Max, *dosMeshConns, need)
	}
}

// hostile holds connections of one kind open from one loopback address
// and counts those the server let through (those that got as far as the
// kind needs). The genuine clients come from 127.0.0.1.
type hostile struct {
	name     string
	source   string
	mu       sync.Mutex
	conns    []net.Conn
	admitted atomic.Int64
	took     time.Duration // to open them
}

func (h *hostile) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
}

// open makes n connections with dial, 32 at a time; dial returns the
// connection and whether the server let it through.
func (h *hostile) open(n int, dial func() (net.Conn, bool)) {
	start := time.Now()
	defer func() { h.took = time.Since(start) }()
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, ok := dial()
			if c == nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			if ok {
				h.admitted.Add(1)
			}
		})
	}
	wg.Wait()
}

// stillOpen counts the held connections the server has not closed (a
// read within 200 ms neither ends in EOF nor in an error other than the
// timeout; frames the server sent before are read over).
func (h *hostile) stillOpen() int {
	h.mu.Lock()
	conns := h.conns
	h.mu.Unlock()
	var open atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			buf := make([]byte, 4096)
			for {
				_, err := c.Read(buf)
				if err == nil {
					continue
				}
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					open.Add(1)
				}
				return
			}
		})
	}
	wg.Wait()
	return int(open.Load())
}

// dial opens a TCP connection from the hostile source.
func (h *hostile) dial(addr string) net.Conn {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(h.source)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil
	}
	return c
}

// meshTLS opens a TLS connection to the Marble API from the hostile
// source with a throwaway certificate, speaking HTTP/2 up to its SETTINGS;
// ok when the server completed the handshake.
func (h *hostile) meshTLS(addr string, cert tls.Certificate) (*tls.Conn, bool) {
	raw := h.dial(addr)
	if raw == nil {
		return nil, false
	}
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{cert}})
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		return c, false
	}
	c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return c, false
	}
	if err := http2.NewFramer(c, nil).WriteSettings(); err != nil {
		return c, false
	}
	return c, true
}

// activateHeaders is the header block of an Activate call, with a header
// of pad bytes if pad > 0.
func activateHeaders(pad int) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
		{Name: ":path", Value: marblepb.Marble_Activate_FullMethodName}, {Name: ":authority", Value: "coordinator"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		enc.WriteField(f)
	}
	if pad > 0 {
		enc.WriteField(hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("a", pad)})
	}
	return buf.Bytes()
}

// writeUnfinished sends block as a HEADERS frame and CONTINUATION frames
// of 16 KiB, never ending it; false when the server stopped it.
func writeUnfinished(c net.Conn, block []byte) bool {
	fr := http2.NewFramer(c, nil)
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	defer c.SetWriteDeadline(time.Time{})
	const frame = 16 << 10
	if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:frame]}) != nil {
		return false
	}
	for off := frame; off+frame < len(block); off += frame {
		if fr.WriteContinuation(1, false, block[off:off+frame]) != nil {
			return false
		}
	}
	return true
}

// activateWithin activates m as "backend" with uuid over the Marble API,
// giving up after timeout.
func activateWithin(t *testing.T, c *coordinator, m *testMarble, uuid string, timeout time.Duration) (*marblepb.Parameters, error) {
	t.Helper()
	cfg := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{m.cert}, MinVersion: tls.VersionTLS12}
	cc, err := grpc.NewClient("passthrough:///"+c.meshAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := marblepb.NewMarbleClient(cc).Activate(ctx, &marblepb.ActivationReq{CSR: m.csr, MarbleType: "backend", UUID: uuid})
	return resp.GetParameters(), err
}

// peerFlood opens a TLS 1.3 session to the peer key server from the
// hostile source, reads its hello and claims a message of 256 KiB: what
// anyone who reaches the port can do before any attestation.
func (h *hostile) peerFlood(addr string, cert tls.Certificate) (net.Conn, bool) {
	raw := h.dial(addr)
	if raw == nil {
		return nil, false
	}
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}})
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return c, false
	}
	if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[:]))); err != nil {
		return c, false
	}
	if _, err := c.Write(binary.BigEndian.AppendUint32(nil, 256<<10)); err != nil {
		return c, false
	}
	return c, true
}

// TestDenialOfService holds hostile connections from one loopback address
// against the real binary — plain TCP on the Marble API, TLS holding an
// Activate stream without its request, unfinished header blocks, and
// peer key server sessions claiming a 256 KiB message, each kind from its
// own address — plus /events
// requests that never read their answer. Meanwhile a Marble from another
// address activates and GET /api/v2/status answers, each within a second;
// the hostile source holds no more than its per-source share of either
// server; the refusals take a few log lines, not one each; and the
// Coordinator's peak RSS stays under 300 MiB. -dos.conns sets how many of
// each kind (1000 for the figures in docs/http.md); -dos.wait also waits
// out the request read timeout.
func TestDenialOfService(t *testing.T) {
	n := *dosMeshConns
	raiseNoFile(t, uint64(4*n+512))
	cluster := etcdtest.Start(t, 1)
	peerAddr := freeLoopbackAddr(t)
	c := startCoordinator(t, "", append(haEnv(cluster.Endpoints(), newPrefix()), envMetrics, "QUARRY_PEER_ADDR="+peerAddr)...)
	hc := c.client(nil, nil)
	_, adminPEM := newUserCert(t, "admin")
	expect(t, setManifest(t, c, hc, marbleManifest(t, adminPEM)), http.StatusOK, "success")
	m := newTestMarble(t)
	m.mustActivate(t, c, "backend", marbleUUIDA)
	// --insecure-peer-trust is named on the listening line too.
	for line := range strings.SplitSeq(c.Logs(), "\n") {
		if strings.Contains(line, "peer key server listening") && !strings.Contains(line, "INSECURE") {
			t.Errorf("the peer key server's listening line does not say INSECURE with --insecure-peer-trust: %s", line)
		}
	}
	throwaway, _ := newUserCert(t, "throwaway")

	start := time.Now()
	tcp := &hostile{name: "TCP only", source: "127.0.0.2"}
	stream := &hostile{name: "TLS holding an Activate stream", source: "127.0.0.3"}
	partial := &hostile{name: "unfinished header block of 64 KiB", source: "127.0.0.4"}
	flood := &hostile{name: "peer key server, 256 KiB claimed", source: "127.0.0.5"}
	block := activateHeaders(64 << 10)
	var opening sync.WaitGroup
	opening.Go(func() {
		tcp.open(n, func() (net.Conn, bool) {
			c := tcp.dial(c.meshAddr)
			return c, c != nil
		})
	})
	opening.Go(func() {
		stream.open(n, func() (net.Conn, bool) {
			tc, ok := stream.meshTLS(c.meshAddr, throwaway)
			if ok {
				ok = http2.NewFramer(tc, nil).WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: activateHeaders(0), EndHeaders: true}) == nil
			}
			if tc == nil {
				return nil, false
			}
			return tc, ok
		})
	})
	opening.Go(func() {
		partial.open(n, func() (net.Conn, bool) {
			tc, ok := partial.meshTLS(c.meshAddr, throwaway)
			if ok {
				ok = writeUnfinished(tc, block)
			}
			if tc == nil {
				return nil, false
			}
			return tc, ok
		})
	})
	opening.Go(func() {
		flood.open(n, func() (net.Conn, bool) {
			pc, ok := flood.peerFlood(peerAddr, throwaway)
			if pc == nil {
				return nil, false
			}
			return pc, ok
		})
	})
	defer func() {
		opening.Wait()
		for _, h := range []*hostile{tcp, stream, partial, flood} {
			h.closeAll()
		}
	}()
	// The genuine clients go when the hostile ones are open, or after
	// dosOpenWait at the latest (a server that makes them queue must not
	// stall the test until they have gone through).
	opened := make(chan struct{})
	go func() { opening.Wait(); close(opened) }()
	select {
	case <-opened:
	case <-time.After(dosOpenWait):
	}
	// /events clients that never read their answer.
	metrics := metricsAddr(t, c)
	for range 16 {
		ec, err := net.Dial("tcp", metrics)
		if err != nil {
			t.Fatal(err)
		}
		defer ec.Close()
		fmt.Fprintf(ec, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	openTime := time.Since(start)

	// The genuine clients, from 127.0.0.1.
	t0 := time.Now()
	if _, err := activateWithin(t, c, m, marbleUUIDB, 5*time.Second); err != nil {
		t.Fatalf("a genuine activation while the hostile connections are held: %v (after %s)", err, time.Since(t0))
	}
	activation := time.Since(t0)
	t0 = time.Now()
	expect(t, do(t, hc, http.MethodGet, c.url("/api/v2/status"), nil), http.StatusOK, "success")
	status := time.Since(t0)
	t0 = time.Now()
	code, _, _ := plainGet(t, http.MethodGet, "http://"+metrics+"/events")
	events := time.Since(t0)
	if code != http.StatusOK && code != http.StatusServiceUnavailable {
		t.Errorf("/events: %d, want 200, or 503 while busy", code)
	}
	rss := peakRSS(t, c)
	t.Logf("%d connections of each kind held, each kind from its own address (the genuine clients went after %s); activation from 127.0.0.1 %s, GET /api/v2/status %s, GET /events %s (%d); coordinator peak RSS (VmHWM) %d MiB",
		n, openTime.Round(time.Millisecond), activation.Round(time.Millisecond), status.Round(time.Millisecond), events.Round(time.Millisecond), code, rss>>20)
	if activation > dosLatency || status > dosLatency || events > dosLatency {
		t.Errorf("while the hostile connections are held: activation %s, status %s, /events %s; want each within %s", activation, status, events, dosLatency)
	}
	if rss > dosMaxRSS {
		t.Errorf("the coordinator's peak RSS is %d MiB, want under %d MiB", rss>>20, dosMaxRSS>>20)
	}
	opening.Wait()
	for _, h := range []*hostile{tcp, stream, partial, flood} {
		t.Logf("%s from %s: %d of %d got as far as they try (opened in %s)", h.name, h.source, h.admitted.Load(), n, h.took.Round(time.Millisecond))
	}
	// One source holds no more than its share of each server: the server
	// closes the rest at once (an unfinished header block as soon as it
	// passes the header list limit).
	for _, h := range []*hostile{tcp, stream, partial, flood} {
		limit := dosMeshPerSource
		if h == flood {
			limit = dosPeerPerSource
		}
		if open := h.stillOpen(); open > limit {
			t.Errorf("%s: %d connections from %s held open, want at most %d (the per-source limit)", h.name, open, h.source, limit)
		}
	}
	// A refusal is logged at most once per 10 s per server, with a count.
	logs := c.Logs()
	lines := strings.Count(logs, "connection refused by the connection limits") + strings.Count(logs, "peer key request refused")
	t.Logf("%d log lines about refused connections", lines)
	if lines > 6 {
		t.Errorf("%d log lines about refused connections, want a few (rate-limited)", lines)
	}
	if !strings.Contains(logs, "refusalsNotLogged") {
		t.Error("no refusal was logged")
	}

	if !*dosMeshWait {
		return
	}
	// The Marble API closes connections without a complete request after
	// its request read timeout (10 s from the connection's start).
	time.Sleep(time.Until(start.Add(12 * time.Second)))
	for _, h := range []*hostile{tcp, stream, partial} {
		if open := h.stillOpen(); open > 0 {
			t.Errorf("%s: %d connections still open after the request read timeout", h.name, open)
		}
	}
}
