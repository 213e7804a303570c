package peer

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/seal"
)

// world is one DCAP test PKI with one platform (the CPUs' quoting
// enclave) and the Coordinator's enclave identity.
type world struct {
	pl       *dcaptest.Platform
	verifier *dcap.Verifier
	self     dcaptest.Enclave
}

func newWorld(t testing.TB) *world {
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	w := &world{pl: pl, verifier: &dcap.Verifier{
		Collateral: collateral.Static{Collateral: pl.Collateral(t, dcaptest.CollateralOptions{})},
		RootCA:     p.Root, Now: func() time.Time { return p.Time },
	}, self: dcaptest.Enclave{ISVProdID: 7, ISVSVN: 4}}
	copy(w.self.MRENCLAVE[:], "coordinator enclave")
	copy(w.self.MRSIGNER[:], "coordinator signer")
	return w
}

func (w *world) selfBody(t testing.TB) *sgxquote.ReportBody {
	q, err := sgxquote.Parse(w.pl.Quote(t, dcaptest.QuoteOptions{Enclave: w.self}))
	if err != nil {
		t.Fatal(err)
	}
	return &q.Body
}

// issuer quotes as enclave e, after change (if set) alters the report data.
type issuer struct {
	t      testing.TB
	pl     *dcaptest.Platform
	e      dcaptest.Enclave
	change func(*[64]byte)
	replay []byte // if set, returned instead of a fresh quote
	mu     sync.Mutex
	last   []byte
}

func (i *issuer) Issue(_ context.Context, rd [64]byte) ([]byte, error) {
	if i.replay != nil {
		return i.replay, nil
	}
	if i.change != nil {
		i.change(&rd)
	}
	e := i.e
	e.ReportData = rd
	q := i.pl.Quote(i.t, dcaptest.QuoteOptions{Enclave: e})
	i.mu.Lock()
	i.last = q
	i.mu.Unlock()
	return q, nil
}

type keys map[[32]byte]struct {
	dek  []byte
	mode string
}

func (k keys) PeerKey(id [32]byte) ([]byte, string, bool) {
	v, ok := k[id]
	return v.dek, v.mode, ok
}

var dek = bytes.Repeat([]byte{0x42}, seal.KeySize)

func keysWith(mode string) keys {
	return keys{seal.KeyID(dek): {dek, mode}}
}

// recorder keeps the server's results.
type recorder struct {
	mu      sync.Mutex
	results []Result
}

func (r *recorder) all() []Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Result(nil), r.results...)
}

// serve starts s on a loopback port and returns its address.
func serve(t testing.TB, s *Server) (string, *recorder) {
	t.Helper()
	if s.Certificate.Certificate == nil {
		cert, err := NewCertificate()
		if err != nil {
			t.Fatal(err)
		}
		s.Certificate = cert
	}
	results := &recorder{}
	s.OnResult = func(r Result) {
		results.mu.Lock()
		results.results = append(results.results, r)
		results.mu.Unlock()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), results
}

func client(t testing.TB, iss attest.Issuer) *Client {
	cert, err := NewCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return &Client{Certificate: cert, Issuer: iss, Timeout: 5 * time.Second}
}

func TestTransfer(t *testing.T) {
	w := newWorld(t)
	enclave := func(f func(*dcaptest.Enclave)) dcaptest.Enclave {
		e := w.self
		if f != nil {
			f(&e)
		}
		return e
	}
	otherMR := func(e *dcaptest.Enclave) { copy(e.MRENCLAVE[:], "another enclave") }
	cases := []struct {
		name   string
		mode   string
		e      dcaptest.Enclave
		change func(*[64]byte)
		want   error // nil: the key is given
	}{
		{"same enclave, ProductKey", "", enclave(nil), nil, nil},
		{"same enclave, UniqueKey", seal.ModeUniqueKey, enclave(nil), nil, nil},
		{"newer SVN, ProductKey", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { otherMR(e); e.ISVSVN = 5 }), nil, nil},
		{"wrong MRENCLAVE, UniqueKey", seal.ModeUniqueKey, enclave(otherMR), nil, ErrIdentity},
		{"lower SVN, ProductKey", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { e.ISVSVN = 3 }), nil, ErrIdentity},
		{"other product, ProductKey", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { e.ISVProdID = 8 }), nil, ErrIdentity},
		{"other signer, ProductKey", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { copy(e.MRSIGNER[:], "someone else") }), nil, ErrIdentity},
		{"debug enclave", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { e.Debug = true }), nil, ErrIdentity},
		{"quote not binding the TLS key", "", enclave(nil), func(rd *[64]byte) { rd[0] ^= 1 }, ErrBinding},
		{"quote for another nonce", "", enclave(nil), func(rd *[64]byte) { rd[40] ^= 1 }, ErrStale},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, results := serve(t, &Server{Keys: keysWith(tc.mode), Verifier: w.verifier, Self: w.selfBody(t)})
			c := client(t, &issuer{t: t, pl: w.pl, e: tc.e, change: tc.change})
			got, err := c.Fetch(t.Context(), addr, seal.KeyID(dek))
			if tc.want == nil {
				if err != nil || !bytes.Equal(got, dek) {
					t.Fatalf("Fetch = %x, %v; want the key", got, err)
				}
				return
			}
			var re *RefusedError
			if !errors.Is(err, tc.want) || !errors.As(err, &re) || re.Reason == "" {
				t.Fatalf("Fetch error %v, want %v with a reason", err, tc.want)
			}
			if got != nil {
				t.Fatal("a key came with the refusal")
			}
			if r := waitResults(t, results, 1)[0]; !errors.Is(r.Err, tc.want) {
				t.Fatalf("the server reports %v, want %v", r.Err, tc.want)
			}
		})
	}
}

func waitResults(t *testing.T, results *recorder, n int) []Result {
	t.Helper()
	for range 300 {
		if got := results.all(); len(got) >= n {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d results, want %d", len(results.all()), n)
	return nil
}

// TestReplayedQuote: a quote recorded from one exchange is refused in the
// next one, even over the same TLS key: the nonce differs.
func TestReplayedQuote(t *testing.T) {
	w := newWorld(t)
	addr, _ := serve(t, &Server{Keys: keysWith(""), Verifier: w.verifier, Self: w.selfBody(t)})
	iss := &issuer{t: t, pl: w.pl, e: w.self}
	c := client(t, iss)
	if _, err := c.Fetch(t.Context(), addr, seal.KeyID(dek)); err != nil {
		t.Fatal(err)
	}
	iss.replay = iss.last
	if _, err := c.Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrStale) {
		t.Fatalf("replayed quote: %v, want ErrStale", err)
	}
	// Replayed with another TLS key: it binds the recorded one.
	if _, err := client(t, iss).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrBinding) {
		t.Fatalf("replayed quote with another TLS key: %v, want ErrBinding", err)
	}
}

func TestRefusals(t *testing.T) {
	w := newWorld(t)
	good := func(t *testing.T) *issuer { return &issuer{t: t, pl: w.pl, e: w.self} }
	t.Run("peer without the key", func(t *testing.T) {
		addr, _ := serve(t, &Server{Keys: keys{}, Verifier: w.verifier, Self: w.selfBody(t)})
		if _, err := client(t, good(t)).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrNoKey) {
			t.Fatalf("%v, want ErrNoKey", err)
		}
	})
	t.Run("another key ID", func(t *testing.T) {
		addr, _ := serve(t, &Server{Keys: keysWith(""), Verifier: w.verifier, Self: w.selfBody(t)})
		if _, err := client(t, good(t)).Fetch(t.Context(), addr, [32]byte{1}); !errors.Is(err, ErrNoKey) {
			t.Fatalf("%v, want ErrNoKey", err)
		}
	})
	t.Run("no collateral source", func(t *testing.T) {
		addr, _ := serve(t, &Server{Keys: keysWith(""), Self: w.selfBody(t)})
		if _, err := client(t, good(t)).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrUnverified) {
			t.Fatalf("%v, want ErrUnverified", err)
		}
	})
	t.Run("quote from another PKI", func(t *testing.T) {
		other := newWorld(t)
		addr, _ := serve(t, &Server{Keys: keysWith(""), Verifier: w.verifier, Self: w.selfBody(t)})
		if _, err := client(t, &issuer{t: t, pl: other.pl, e: w.self}).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrUnverified) {
			t.Fatalf("%v, want ErrUnverified", err)
		}
	})
	t.Run("joiner without a quote, enclave server", func(t *testing.T) {
		addr, _ := serve(t, &Server{Keys: keysWith(""), Verifier: w.verifier, Self: w.selfBody(t)})
		if _, err := client(t, attest.SimulationIssuer{}).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrSimulation) {
			t.Fatalf("%v, want ErrSimulation", err)
		}
		addr, _ = serve(t, &Server{Keys: keysWith(""), Verifier: w.verifier, Self: w.selfBody(t), InsecureTrust: true})
		if _, err := client(t, attest.SimulationIssuer{}).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrIdentity) {
			t.Fatalf("an enclave with --insecure-peer-trust: %v, want ErrIdentity", err)
		}
	})
	t.Run("simulation", func(t *testing.T) {
		addr, _ := serve(t, &Server{Keys: keysWith("")})
		if _, err := client(t, attest.SimulationIssuer{}).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrSimulation) {
			t.Fatalf("simulation without --insecure-peer-trust: %v, want ErrSimulation", err)
		}
		addr, _ = serve(t, &Server{Keys: keysWith(""), InsecureTrust: true})
		got, err := client(t, attest.SimulationIssuer{}).Fetch(t.Context(), addr, seal.KeyID(dek))
		if err != nil || !bytes.Equal(got, dek) {
			t.Fatalf("simulation with --insecure-peer-trust: %v", err)
		}
	})
	t.Run("no server", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close()
		if _, err := client(t, good(t)).Fetch(t.Context(), addr, seal.KeyID(dek)); err == nil {
			t.Fatal("no error without a server")
		}
	})
}

// TestMalformedRequests: oversized, garbled or missing messages and a
// client without a certificate are refused; the server goes on serving.
func TestMalformedRequests(t *testing.T) {
	w := newWorld(t)
	addr, results := serve(t, &Server{Keys: keysWith(""), Verifier: w.verifier, Self: w.selfBody(t), Timeout: time.Second})
	cert, _ := NewCertificate()
	send := func(t *testing.T, withCert bool, raw []byte) {
		cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
		if withCert {
			cfg.Certificates = []tls.Certificate{cert}
		}
		c, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			return // a handshake refused outright
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		var h hello
		if err := readMsg(c, &h, ErrBadResponse); err != nil {
			return
		}
		c.Write(raw)
		var resp response
		readMsg(c, &resp, ErrBadResponse)
		if len(resp.Key) != 0 {
			t.Fatal("a key for a malformed request")
		}
	}
	huge := binary.BigEndian.AppendUint32(nil, MaxMessage+1)
	garbled := append(binary.BigEndian.AppendUint32(nil, 5), "{{{{{"...)
	shortID := append(binary.BigEndian.AppendUint32(nil, 14), `{"keyID":"AA"}`...)
	n := 0
	for _, raw := range [][]byte{huge, garbled, shortID, nil} {
		send(t, true, raw)
		n++
	}
	send(t, false, shortID)
	n++
	for i, r := range waitResults(t, results, n) {
		if r.Err == nil {
			t.Errorf("exchange %d: no error", i)
		}
	}
	// Still serving.
	if _, err := client(t, &issuer{t: t, pl: w.pl, e: w.self}).Fetch(t.Context(), addr, seal.KeyID(dek)); err != nil {
		t.Fatalf("after malformed requests: %v", err)
	}
}

func FuzzRequest(f *testing.F) {
	f.Add(append(binary.BigEndian.AppendUint32(nil, 14), `{"keyID":"AA"}`...))
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req request
		err := readMsg(bytes.NewReader(b), &req, ErrBadRequest)
		if err == nil && len(b) < 4 {
			t.Fatal("a message shorter than its header accepted")
		}
	})
}
