package marbleapi

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/limit"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

func okCoordinator() *fakeCoordinator {
	return &fakeCoordinator{answer: func(context.Context, core.ActivationRequest) (*core.Activation, error) {
		return &core.Activation{}, nil
	}}
}

// dialFrom connects to addr over TCP from the loopback address from
// (Linux routes all of 127.0.0.0/8 to lo).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialMarbleFrom is dial with the TCP connection made from the loopback
// address from.
func dialMarbleFrom(t *testing.T, from, addr string) marblepb.MarbleClient {
	t.Helper()
	cfg := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{selfSigned(t, "m", false)}, MinVersion: tls.VersionTLS12}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
			return d.DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return marblepb.NewMarbleClient(cc)
}

// TestConnectionsHeldFromOneSource: connections held open from one address
// (plain TCP, never a handshake) take at most MaxConnectionsPerSource
// places; a Marble from another address is served at once, also when the
// held connections fill every place. (Before the per-source limit, they
// kept every other Marble waiting in the accept queue.)
func TestConnectionsHeldFromOneSource(t *testing.T) {
	var refusals []limit.Refusal
	refused := make(chan limit.Refusal, 100)
	ts := startServer(t, okCoordinator(), Options{MaxConnections: 4, MaxConnectionsPerSource: 4,
		OnRefuse: func(r limit.Refusal) { refused <- r }})
	for range 8 {
		dialFrom(t, "127.0.0.2", ts.addr)
	}
	// The server closes the connections over the source's limit.
	deadline := time.After(5 * time.Second)
	for len(refusals) < 4 {
		select {
		case r := <-refused:
			if r.Source != "127.0.0.2" || !errors.Is(r.Reason, limit.ErrSourceFull) {
				t.Fatalf("refusal %+v, want ErrSourceFull for 127.0.0.2", r)
			}
			refusals = append(refusals, r)
		case <-deadline:
			t.Fatalf("%d refusals, want 4", len(refusals))
		}
	}
	start := time.Now()
	if _, err := activate(context.Background(), dialMarbleFrom(t, "127.0.0.3", ts.addr)); err != nil {
		t.Fatalf("a Marble from another address: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the activation from another address took %s", d)
	}
	select {
	case r := <-refused:
		if !errors.Is(r.Reason, limit.ErrEvicted) || r.Source != "127.0.0.2" {
			t.Fatalf("refusal %+v, want the held source's oldest connection evicted", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no connection of the full source was evicted")
	}
}

// rawH2 is an HTTP/2 connection to the Marble API driven frame by frame.
type rawH2 struct {
	t    *testing.T
	conn *tls.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
	hdec *hpack.Decoder // the connection's (its dynamic table spans frames)
}

func dialH2(t *testing.T, addr string) *rawH2 {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"},
		Certificates: []tls.Certificate{selfSigned(t, "m", false)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h := &rawH2{t: t, conn: conn, fr: http2.NewFramer(conn, conn)}
	h.henc = hpack.NewEncoder(&h.hbuf)
	h.hdec = hpack.NewDecoder(4096, nil)
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return h
}

// headers encodes an Activate call's request headers (plus extra fields).
func (h *rawH2) headers(extra ...hpack.HeaderField) []byte {
	h.hbuf.Reset()
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
		{Name: ":path", Value: marblepb.Marble_Activate_FullMethodName}, {Name: ":authority", Value: "coordinator"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		h.henc.WriteField(f)
	}
	return bytes.Clone(h.hbuf.Bytes())
}

// request sends a complete Activate call with an empty request on stream.
func (h *rawH2) request(stream uint32) {
	h.t.Helper()
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: h.headers(), EndHeaders: true}); err != nil {
		h.t.Fatal(err)
	}
	if err := h.fr.WriteData(stream, true, []byte{0, 0, 0, 0, 0}); err != nil { // uncompressed, length 0
		h.t.Fatal(err)
	}
}

// streamEnd reads frames until stream ends (trailers with END_STREAM, or
// RST_STREAM) and returns its grpc-status ("" after RST_STREAM); an error
// when the connection ends first or nothing comes within wait.
func (h *rawH2) streamEnd(stream uint32, wait time.Duration) (string, error) {
	h.conn.SetReadDeadline(time.Now().Add(wait))
	defer h.conn.SetReadDeadline(time.Time{})
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			return "", err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				h.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				h.fr.WritePing(true, f.Data)
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == stream {
				return "", nil
			}
		case *http2.GoAwayFrame:
			return "", fmt.Errorf("GOAWAY %v", f.ErrCode)
		case *http2.HeadersFrame:
			fields, err := h.hdec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				return "", err
			}
			if f.StreamID != stream || !f.StreamEnded() {
				continue
			}
			for _, hf := range fields {
				if hf.Name == "grpc-status" {
					return hf.Value, nil
				}
			}
			return "", errors.New("trailers without grpc-status")
		}
	}
}

// closedWithin reports whether the server closes conn within wait (frames
// it sends before are skipped).
func closedWithin(conn net.Conn, wait time.Duration) error {
	conn.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("still open after %s", wait)
			}
			return nil
		}
	}
}

// TestFirstRequestDeadline: a connection that sends no complete request —
// plain TCP, TLS only, the HTTP/2 preface only, or a stream's headers
// without its message — is closed after RequestReadTimeout; gRPC's own
// handshake timeout clears its deadline after the handshake and would
// have let them stay.
func TestFirstRequestDeadline(t *testing.T) {
	ts := startServer(t, okCoordinator(), Options{RequestReadTimeout: 300 * time.Millisecond})
	tcp := dialFrom(t, "127.0.0.1", ts.addr)
	tlsOnly, err := tls.Dial("tcp", ts.addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"},
		Certificates: []tls.Certificate{selfSigned(t, "m", false)}})
	if err != nil {
		t.Fatal(err)
	}
	defer tlsOnly.Close()
	preface := dialH2(t, ts.addr)
	headersOnly := dialH2(t, ts.addr)
	if err := headersOnly.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: headersOnly.headers(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"TCP": tcp, "TLS": tlsOnly, "preface": preface.conn, "headers": headersOnly.conn} {
		if err := closedWithin(c, 3*time.Second); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestStreamWithoutRequest: after a connection's first request, a further
// stream whose message never comes is ended after RequestReadTimeout
// (gRPC waits for it as long as the client likes), and the connection
// serves on.
func TestStreamWithoutRequest(t *testing.T) {
	fake := okCoordinator()
	ts := startServer(t, fake, Options{RequestReadTimeout: 300 * time.Millisecond})
	h := dialH2(t, ts.addr)
	h.request(1)
	if st, err := h.streamEnd(1, 5*time.Second); err != nil || st != "0" {
		t.Fatalf("first request: grpc-status %q, %v", st, err)
	}
	// Past the first-request deadline: the connection is still served.
	time.Sleep(500 * time.Millisecond)
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: h.headers(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	st, err := h.streamEnd(3, 5*time.Second)
	if err != nil {
		t.Fatalf("the stream without a message was not ended: %v", err)
	}
	if st == "0" {
		t.Fatal("the stream without a message succeeded")
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 3*time.Second {
		t.Fatalf("the stream was ended after %s, want about 300ms", d)
	}
	h.request(5)
	if st, err := h.streamEnd(5, 5*time.Second); err != nil || st != "0" {
		t.Fatalf("a request after the ended stream: grpc-status %q, %v", st, err)
	}
	if fake.calls() != 2 {
		t.Fatalf("%d activations reached the Coordinator, want 2", fake.calls())
	}
}

// TestHeaderListLimit: the server announces a small header list limit
// and closes a connection whose header block grows past it, instead of
// buffering up to gRPC's default 16 MiB per unfinished block.
func TestHeaderListLimit(t *testing.T) {
	ts := startServer(t, okCoordinator(), Options{RequestReadTimeout: time.Minute})
	h := dialH2(t, ts.addr)
	h.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := h.fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok {
		t.Fatalf("first frame %T, want SETTINGS", f)
	}
	if v, ok := sf.Value(http2.SettingMaxHeaderListSize); !ok || v != MaxHeaderListBytes {
		t.Fatalf("SETTINGS_MAX_HEADER_LIST_SIZE %d (announced %v), want %d", v, ok, MaxHeaderListBytes)
	}
	h.conn.SetReadDeadline(time.Time{})
	// An unfinished header block: one header of 64 KiB in pieces of
	// 16 KiB, never ended.
	block := h.headers(hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("a", 64<<10)})
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:16<<10]}); err != nil {
		t.Fatal(err)
	}
	for off := 16 << 10; off+16<<10 < len(block); off += 16 << 10 {
		if err := h.fr.WriteContinuation(1, false, block[off:off+16<<10]); err != nil {
			break // the server may already have closed
		}
	}
	if err := closedWithin(h.conn, 3*time.Second); err != nil {
		t.Fatalf("a 64 KiB header block: %v", err)
	}
}

// blockingStore is a store whose Save, once armed, waits for the deadline
// and fails, and whose Load then fails too (the read-back finds nothing
// out).
type blockingStore struct {
	store.Store
	armed chan struct{}
}

func (b *blockingStore) Save(ctx context.Context, blob []byte, rev store.Revision) (store.Revision, error) {
	select {
	case <-b.armed:
		<-ctx.Done()
		return "", ctx.Err()
	default:
		return b.Store.Save(ctx, blob, rev)
	}
}

func (b *blockingStore) Load(ctx context.Context) ([]byte, store.Revision, error) {
	select {
	case <-b.armed:
		return nil, "", errors.New("the disk is gone")
	default:
		return b.Store.Load(ctx)
	}
}

// TestDeadlineWhileStoring: an activation abandoned while the core stores
// its activation count does not claim that nothing was stored; it passes
// on what the store step found out (here: the outcome could not be read
// back).
func TestDeadlineWhileStoring(t *testing.T) {
	ctx := context.Background()
	data := &blockingStore{Store: memstore.New(), armed: make(chan struct{})}
	c, err := core.New(ctx, core.Options{Data: data, Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	manifest := `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p","MaxActivations":1,"Parameters":{}}}}`
	if _, err := c.SetManifest(ctx, []byte(manifest)); err != nil {
		t.Fatal(err)
	}
	close(data.armed)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(c, c.MarbleTLSCertificate, Options{RequestTimeout: 300 * time.Millisecond})
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(ctx) })
	csr := newCSR(t)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = dial(t, ln.Addr().String(), selfSigned(t, "m", false)).Activate(cctx,
		&marblepb.ActivationReq{CSR: csr, MarbleType: "m", UUID: "6ba7b810-9dad-41d1-80b4-00c04fd430c8"})
	st, _ := status.FromError(err)
	if st.Code() != codes.DeadlineExceeded {
		t.Fatalf("error %v, want DeadlineExceeded", err)
	}
	for _, want := range []string{"abandoned while storing its activation count", "reading it back", "the disk is gone"} {
		if !strings.Contains(st.Message(), want) {
			t.Errorf("message %q does not say %q", st.Message(), want)
		}
	}
	if strings.Contains(st.Message(), "nothing was stored") {
		t.Errorf("message %q claims nothing was stored, which the Coordinator does not know", st.Message())
	}
}

// newCSR returns a CSR with a fresh P-384 key.
func newCSR(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "MarbleRun Marble"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}
