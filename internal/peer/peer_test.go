package peer

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net"
	"strings"
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

// genuine returns a server of this world's enclave holding dek for a
// state with seal mode mode: it verifies joiners and quotes itself.
func (w *world) genuine(t testing.TB, mode string) *Server {
	return &Server{Keys: keysWith(mode), Verifier: w.verifier, Self: w.selfBody(t), Issuer: w.issuer(t, w.self)}
}

func (w *world) issuer(t testing.TB, e dcaptest.Enclave) *issuer {
	return &issuer{t: t, pl: w.pl, e: e}
}

// client returns a joiner of this world's enclave quoting with iss.
func (w *world) client(t testing.TB, iss attest.Issuer) *Client {
	c := client(t, iss)
	c.Self, c.Verifier = w.selfBody(t), w.verifier
	return c
}

// client returns a joiner without an enclave of its own (simulation).
func client(t testing.TB, iss attest.Issuer) *Client {
	cert, err := NewCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return &Client{Certificate: cert, Issuer: iss, Timeout: 5 * time.Second}
}

func bodyOf(t testing.TB, pl *dcaptest.Platform, e dcaptest.Enclave) *sgxquote.ReportBody {
	q, err := sgxquote.Parse(pl.Quote(t, dcaptest.QuoteOptions{Enclave: e}))
	if err != nil {
		t.Fatal(err)
	}
	return &q.Body
}

// TestTransfer: both sides verify each other. The peer (this world's
// enclave) refuses joiners that are not the same enclave for the state's
// seal mode; the joiner refuses a peer that is not (here: one with a lower
// ISVSVN than its own); a quote not bound to the session is refused.
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
		e      dcaptest.Enclave // the joiner's enclave
		change func(*[64]byte)
		want   error // nil: the key is given and accepted
	}{
		{"same enclave, ProductKey", "", enclave(nil), nil, nil},
		{"same enclave, UniqueKey", seal.ModeUniqueKey, enclave(nil), nil, nil},
		{"another build of the signer, ProductKey", seal.ModeProductKey, enclave(otherMR), nil, nil},
		{"wrong MRENCLAVE, UniqueKey", seal.ModeUniqueKey, enclave(otherMR), nil, ErrIdentity},
		{"lower SVN, ProductKey", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { e.ISVSVN = 3 }), nil, ErrIdentity},
		{"joiner with a higher SVN refuses the older peer", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { e.ISVSVN = 5 }), nil, ErrPeerIdentity},
		{"other product, ProductKey", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { e.ISVProdID = 8 }), nil, ErrIdentity},
		{"other signer, ProductKey", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { copy(e.MRSIGNER[:], "someone else") }), nil, ErrIdentity},
		{"debug enclave", seal.ModeProductKey, enclave(func(e *dcaptest.Enclave) { e.Debug = true }), nil, ErrIdentity},
		{"quote not binding the TLS key", "", enclave(nil), func(rd *[64]byte) { rd[0] ^= 1 }, ErrBinding},
		{"quote for another nonce", "", enclave(nil), func(rd *[64]byte) { rd[40] ^= 1 }, ErrStale},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, results := serve(t, w.genuine(t, tc.mode))
			c := client(t, &issuer{t: t, pl: w.pl, e: tc.e, change: tc.change})
			c.Self, c.Verifier = bodyOf(t, w.pl, tc.e), w.verifier
			got, err := c.Fetch(t.Context(), addr, seal.KeyID(dek))
			if tc.want == nil {
				if err != nil || !bytes.Equal(got.DEK, dek) || got.Peer == nil || got.Mode != PolicyMode(tc.mode) {
					t.Fatalf("Fetch = %+v, %v; want the key from a verified peer", got, err)
				}
				if err := got.Allows(tc.mode); err != nil {
					t.Fatalf("the peer is not allowed for the mode it stated: %v", err)
				}
				return
			}
			if got != nil {
				t.Fatal("a key came with the refusal")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Fetch error %v, want %v", err, tc.want)
			}
			var re *RefusedError
			if errors.As(err, &re) != (tc.want != ErrPeerIdentity) || err.Error() == "" {
				t.Fatalf("Fetch error %v (%T): the wrong side refused", err, err)
			}
			r := waitResults(t, results, 1)[0]
			if tc.want == ErrPeerIdentity {
				if r.Err != nil { // the peer gave the key; the joiner refused it
					t.Fatalf("the server reports %v, want the key given", r.Err)
				}
			} else if !errors.Is(r.Err, tc.want) {
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

// TestReplayedQuote: a joiner's quote recorded from one exchange is
// refused in the next one, even over the same TLS key: the session and
// the nonce differ.
func TestReplayedQuote(t *testing.T) {
	w := newWorld(t)
	addr, _ := serve(t, w.genuine(t, ""))
	iss := w.issuer(t, w.self)
	c := w.client(t, iss)
	if _, err := c.Fetch(t.Context(), addr, seal.KeyID(dek)); err != nil {
		t.Fatal(err)
	}
	iss.replay = iss.last
	if _, err := c.Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrStale) {
		t.Fatalf("replayed quote: %v, want ErrStale", err)
	}
	// Replayed with another TLS key: it binds the recorded one.
	if _, err := w.client(t, iss).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrBinding) {
		t.Fatalf("replayed quote with another TLS key: %v, want ErrBinding", err)
	}
}

func TestRefusals(t *testing.T) {
	w := newWorld(t)
	good := func(t *testing.T) *Client { return w.client(t, w.issuer(t, w.self)) }
	t.Run("peer without the key", func(t *testing.T) {
		s := w.genuine(t, "")
		s.Keys = keys{}
		addr, _ := serve(t, s)
		if _, err := good(t).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrNoKey) {
			t.Fatalf("%v, want ErrNoKey", err)
		}
	})
	t.Run("another key ID", func(t *testing.T) {
		addr, _ := serve(t, w.genuine(t, ""))
		if _, err := good(t).Fetch(t.Context(), addr, [32]byte{1}); !errors.Is(err, ErrNoKey) {
			t.Fatalf("%v, want ErrNoKey", err)
		}
	})
	t.Run("no collateral source", func(t *testing.T) {
		s := w.genuine(t, "")
		s.Verifier = nil
		addr, _ := serve(t, s)
		if _, err := good(t).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrUnverified) {
			t.Fatalf("%v, want ErrUnverified", err)
		}
	})
	t.Run("quote from another PKI", func(t *testing.T) {
		other := newWorld(t)
		addr, _ := serve(t, w.genuine(t, ""))
		if _, err := w.client(t, other.issuer(t, w.self)).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrUnverified) {
			t.Fatalf("%v, want ErrUnverified", err)
		}
	})
	t.Run("peer that cannot quote itself", func(t *testing.T) {
		s := w.genuine(t, "")
		s.Issuer = failingIssuer{}
		addr, results := serve(t, s)
		if _, err := good(t).Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrSelfQuote) {
			t.Fatalf("%v, want ErrSelfQuote", err)
		}
		if r := waitResults(t, results, 1)[0]; !errors.Is(r.Err, ErrSelfQuote) {
			t.Fatalf("the server reports %v", r.Err)
		}
	})
	t.Run("joiner without a quote, enclave server", func(t *testing.T) {
		addr, _ := serve(t, w.genuine(t, ""))
		sim := client(t, attest.SimulationIssuer{})
		sim.InsecureTrust = true
		if _, err := sim.Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrSimulation) {
			t.Fatalf("%v, want ErrSimulation", err)
		}
		s := w.genuine(t, "")
		s.InsecureTrust = true
		addr, _ = serve(t, s)
		if _, err := sim.Fetch(t.Context(), addr, seal.KeyID(dek)); !errors.Is(err, ErrIdentity) {
			t.Fatalf("an enclave with --insecure-peer-trust: %v, want ErrIdentity", err)
		}
	})
	t.Run("no server", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close()
		if _, err := good(t).Fetch(t.Context(), addr, seal.KeyID(dek)); err == nil {
			t.Fatal("no error without a server")
		}
	})
}

type failingIssuer struct{}

func (failingIssuer) Issue(context.Context, [64]byte) ([]byte, error) {
	return nil, errors.New("the quoting enclave is gone")
}

// TestSimulation: without an enclave on both sides the key passes only
// with --insecure-peer-trust on both; an enclave joiner never accepts a key
// without a verified quote, whatever it is told to trust.
func TestSimulation(t *testing.T) {
	w := newWorld(t)
	simServer := func(t *testing.T, trust bool) string {
		addr, _ := serve(t, &Server{Keys: keysWith(""), InsecureTrust: trust})
		return addr
	}
	simClient := func(t *testing.T, trust bool) *Client {
		c := client(t, attest.SimulationIssuer{})
		c.InsecureTrust = trust
		return c
	}
	t.Run("both trusted", func(t *testing.T) {
		got, err := simClient(t, true).Fetch(t.Context(), simServer(t, true), seal.KeyID(dek))
		if err != nil || !bytes.Equal(got.DEK, dek) || got.Peer != nil {
			t.Fatalf("simulation with --insecure-peer-trust: %+v, %v", got, err)
		}
		if err := got.Allows(seal.ModeUniqueKey); err != nil {
			t.Fatalf("an unattested key in simulation: Allows = %v", err)
		}
	})
	t.Run("server not trusting", func(t *testing.T) {
		var re *RefusedError
		if _, err := simClient(t, true).Fetch(t.Context(), simServer(t, false), seal.KeyID(dek)); !errors.Is(err, ErrSimulation) || !errors.As(err, &re) {
			t.Fatalf("simulation server without --insecure-peer-trust: %v, want its refusal ErrSimulation", err)
		}
	})
	t.Run("joiner not trusting", func(t *testing.T) {
		var re *RefusedError
		_, err := simClient(t, false).Fetch(t.Context(), simServer(t, true), seal.KeyID(dek))
		if !errors.Is(err, ErrSimulation) || errors.As(err, &re) {
			t.Fatalf("simulation joiner without --insecure-peer-trust: %v, want its own ErrSimulation", err)
		}
	})
	t.Run("enclave joiner, simulation peer", func(t *testing.T) {
		// The peer trusts anyone and hands out the key without a quote;
		// the enclave joiner refuses it even with InsecureTrust set.
		c := w.client(t, w.issuer(t, w.self))
		c.InsecureTrust = true
		got, err := c.Fetch(t.Context(), simServer(t, true), seal.KeyID(dek))
		if !errors.Is(err, ErrPeerUnattested) || got != nil {
			t.Fatalf("enclave joiner, key without a quote: %+v, %v; want ErrPeerUnattested", got, err)
		}
	})
	t.Run("enclave joiner without a collateral source", func(t *testing.T) {
		addr, _ := serve(t, w.genuine(t, ""))
		c := w.client(t, w.issuer(t, w.self))
		c.Verifier, c.InsecureTrust = nil, true
		got, err := c.Fetch(t.Context(), addr, seal.KeyID(dek))
		if !errors.Is(err, ErrPeerUnverified) || got != nil || !strings.Contains(err.Error(), "--collateral-file or --pccs-url") {
			t.Fatalf("enclave joiner without a verifier: %+v, %v; want ErrPeerUnverified naming the settings", got, err)
		}
	})
}

// impostor is a TLS server speaking the protocol by hand, as someone who
// can write etcd's members/ would run one: after its hello it answers each
// request with answer(request, this session's exporter value, its own
// certificate).
func impostor(t *testing.T, version int, answer func(req request, exporter []byte, cert *x509.Certificate) response) string {
	t.Helper()
	cert, err := NewCertificate()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			c := nc.(*tls.Conn)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if c.Handshake() != nil {
				c.Close()
				continue
			}
			exporter, _ := Exporter(c.ConnectionState())
			writeMsg(c, hello{Version: version, Nonce: bytes.Repeat([]byte{7}, nonceSize)})
			var req request
			if readMsg(c, &req, ErrBadRequest) == nil {
				writeMsg(c, answer(req, exporter, cert.Leaf))
			}
			c.Close()
		}
	})
	return ln.Addr().String()
}

// attackerKey is the key an impostor hands out; its key ID is what the
// attacker put in the key record it planted.
var attackerKey = bytes.Repeat([]byte{0x66}, seal.KeySize)

// TestImpostor: a server that is not a verified instance of the same
// enclave never gets its key used, however it answers.
func TestImpostor(t *testing.T) {
	w := newWorld(t)
	id := seal.KeyID(attackerKey)
	// bound quotes as enclave e over this session, as an attacker with
	// its own enclave on a genuine CPU can make them.
	bound := func(e dcaptest.Enclave, mode string) func(request, []byte, *x509.Certificate) response {
		return func(req request, exporter []byte, cert *x509.Certificate) response {
			e.ReportData = PeerReportData(cert, exporter, req.Nonce, [32]byte(req.KeyID), mode)
			return response{Key: attackerKey, Mode: mode, Quote: w.pl.Quote(t, dcaptest.QuoteOptions{Enclave: e})}
		}
	}
	other := func(f func(*dcaptest.Enclave)) dcaptest.Enclave {
		e := w.self
		f(&e)
		return e
	}
	otherPKI := newWorld(t)
	cases := []struct {
		name   string
		answer func(request, []byte, *x509.Certificate) response
		want   error
	}{
		{"no quote", func(request, []byte, *x509.Certificate) response {
			return response{Key: attackerKey, Mode: seal.ModeProductKey}
		}, ErrPeerUnattested},
		{"garbage quote", func(request, []byte, *x509.Certificate) response {
			return response{Key: attackerKey, Mode: seal.ModeProductKey, Quote: []byte("trust me")}
		}, ErrPeerUnverified},
		{"quote from another PKI", func(req request, exporter []byte, cert *x509.Certificate) response {
			e := w.self
			e.ReportData = PeerReportData(cert, exporter, req.Nonce, id, seal.ModeProductKey)
			return response{Key: attackerKey, Mode: seal.ModeProductKey, Quote: otherPKI.pl.Quote(t, dcaptest.QuoteOptions{Enclave: e})}
		}, ErrPeerUnverified},
		{"another signer's enclave", bound(other(func(e *dcaptest.Enclave) { copy(e.MRSIGNER[:], "attacker") }), seal.ModeProductKey), ErrPeerIdentity},
		{"another product", bound(other(func(e *dcaptest.Enclave) { e.ISVProdID = 9 }), seal.ModeProductKey), ErrPeerIdentity},
		{"lower ISVSVN", bound(other(func(e *dcaptest.Enclave) { e.ISVSVN = 3 }), seal.ModeProductKey), ErrPeerIdentity},
		{"debug enclave", bound(other(func(e *dcaptest.Enclave) { e.Debug = true }), seal.ModeProductKey), ErrPeerIdentity},
		{"another MRENCLAVE under UniqueKey", bound(other(func(e *dcaptest.Enclave) { copy(e.MRENCLAVE[:], "attacker enclave") }), seal.ModeUniqueKey), ErrPeerIdentity},
		{"quote binding another TLS key", func(req request, exporter []byte, _ *x509.Certificate) response {
			otherCert, _ := NewCertificate()
			return bound(w.self, seal.ModeProductKey)(req, exporter, otherCert.Leaf)
		}, ErrPeerBinding},
		{"quote binding another nonce", func(req request, exporter []byte, cert *x509.Certificate) response {
			req.Nonce = bytes.Repeat([]byte{1}, nonceSize)
			return bound(w.self, seal.ModeProductKey)(req, exporter, cert)
		}, ErrPeerStale},
		{"quote binding another session", func(req request, _ []byte, cert *x509.Certificate) response {
			return bound(w.self, seal.ModeProductKey)(req, make([]byte, 32), cert)
		}, ErrPeerStale},
		{"quote stating another seal mode", func(req request, exporter []byte, cert *x509.Certificate) response {
			r := bound(w.self, seal.ModeUniqueKey)(req, exporter, cert)
			r.Mode = seal.ModeProductKey
			return r
		}, ErrPeerStale},
		{"a joiner's quote passed off as a peer's", func(req request, exporter []byte, cert *x509.Certificate) response {
			e := w.self
			e.ReportData = JoinerReportData(cert, exporter, req.Nonce, id)
			return response{Key: attackerKey, Mode: seal.ModeProductKey, Quote: w.pl.Quote(t, dcaptest.QuoteOptions{Enclave: e})}
		}, ErrPeerStale},
	}
	// The control: with a correctly bound quote of the same enclave (which
	// only a genuine instance can make) the answer is accepted, so each
	// refusal above is for what its case changes.
	cases = append(cases, struct {
		name   string
		answer func(request, []byte, *x509.Certificate) response
		want   error
	}{"control: the same enclave, bound to the session", bound(w.self, seal.ModeProductKey), nil})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := impostor(t, ProtocolVersion, tc.answer)
			got, err := w.client(t, w.issuer(t, w.self)).Fetch(t.Context(), addr, id)
			if tc.want == nil {
				if err != nil || !bytes.Equal(got.DEK, attackerKey) {
					t.Fatalf("control: %+v, %v", got, err)
				}
				return
			}
			if got != nil || !errors.Is(err, tc.want) {
				t.Fatalf("Fetch = %+v, %v; want no key and %v", got, err, tc.want)
			}
		})
	}
	t.Run("simulation joiner without --insecure-peer-trust", func(t *testing.T) {
		addr := impostor(t, ProtocolVersion, cases[0].answer)
		if got, err := client(t, attest.SimulationIssuer{}).Fetch(t.Context(), addr, id); got != nil || !errors.Is(err, ErrSimulation) {
			t.Fatalf("Fetch = %+v, %v; want ErrSimulation", got, err)
		}
	})
}

// TestRelayedQuote: an impostor in the middle relays the joiner's request
// (with the joiner's nonce) to a genuine peer over its own session and
// hands the genuine peer's answer back. Even with a genuine joiner quote
// of its own — so that the genuine peer answers — the joiner refuses: the
// peer's quote binds the genuine peer's TLS key and session, not the
// impostor's.
func TestRelayedQuote(t *testing.T) {
	w := newWorld(t)
	genuineAddr, _ := serve(t, w.genuine(t, ""))
	relayCert, _ := NewCertificate()
	relay := func(req request, _ []byte, _ *x509.Certificate) response {
		c, err := tls.Dial("tcp", genuineAddr, &tls.Config{Certificates: []tls.Certificate{relayCert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		if err != nil {
			return response{}
		}
		defer c.Close()
		exporter, _ := Exporter(c.ConnectionState())
		var h hello
		if readMsg(c, &h, ErrBadResponse) != nil {
			return response{}
		}
		q, _ := w.issuer(t, w.self).Issue(t.Context(), JoinerReportData(relayCert.Leaf, exporter, h.Nonce, [32]byte(req.KeyID)))
		writeMsg(c, request{Version: ProtocolVersion, KeyID: req.KeyID, Nonce: req.Nonce, Quote: q})
		var resp response
		readMsg(c, &resp, ErrBadResponse)
		if len(resp.Quote) == 0 {
			t.Error("the genuine peer did not answer the relay")
		}
		return resp
	}
	addr := impostor(t, ProtocolVersion, relay)
	got, err := w.client(t, w.issuer(t, w.self)).Fetch(t.Context(), addr, seal.KeyID(dek))
	if got != nil || !errors.Is(err, ErrPeerBinding) {
		t.Fatalf("relayed answer: %+v, %v; want ErrPeerBinding", got, err)
	}
}

// TestReplayedPeerQuote: a peer's quote recorded from one exchange does
// not vouch for a later one, even from a server with the same TLS key.
func TestReplayedPeerQuote(t *testing.T) {
	w := newWorld(t)
	s := w.genuine(t, "")
	iss := s.Issuer.(*issuer)
	addr, _ := serve(t, s)
	c := w.client(t, w.issuer(t, w.self))
	if _, err := c.Fetch(t.Context(), addr, seal.KeyID(dek)); err != nil {
		t.Fatal(err)
	}
	iss.replay = iss.last
	if got, err := c.Fetch(t.Context(), addr, seal.KeyID(dek)); got != nil || !errors.Is(err, ErrPeerStale) {
		t.Fatalf("replayed peer quote: %+v, %v; want ErrPeerStale", got, err)
	}
}

// TestOldPeer: a peer of protocol version 1 (only the joiner quoted) is
// refused with a reason naming the versions; a joiner of version 1 is
// refused by the peer.
func TestOldPeer(t *testing.T) {
	w := newWorld(t)
	addr := impostor(t, 1, func(request, []byte, *x509.Certificate) response { return response{Key: dek} })
	got, err := w.client(t, w.issuer(t, w.self)).Fetch(t.Context(), addr, seal.KeyID(dek))
	if got != nil || !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "protocol version 1") {
		t.Fatalf("version 1 peer: %+v, %v; want ErrVersion naming version 1", got, err)
	}

	// A version 1 joiner sends no version (and no nonce).
	gaddr, results := serve(t, w.genuine(t, ""))
	cert, _ := NewCertificate()
	c, err := tls.Dial("tcp", gaddr, &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var h hello
	if err := readMsg(c, &h, ErrBadResponse); err != nil || h.Version != ProtocolVersion {
		t.Fatalf("hello %+v, %v", h, err)
	}
	id := seal.KeyID(dek)
	writeMsg(c, struct {
		KeyID []byte `json:"keyID"`
	}{id[:]})
	var resp response
	if err := readMsg(c, &resp, ErrBadResponse); err != nil || len(resp.Key) != 0 || resp.Refused != "version" {
		t.Fatalf("version 1 joiner: %+v, %v; want a refusal with code version", resp, err)
	}
	if r := waitResults(t, results, 1)[0]; !errors.Is(r.Err, ErrVersion) {
		t.Fatalf("the server reports %v", r.Err)
	}
}

// TestAllows: once the key opened the state, the peer is checked against
// the state's own seal mode: a peer of another build of the signer passes
// for ProductKey, not for UniqueKey.
func TestAllows(t *testing.T) {
	w := newWorld(t)
	peerEnclave := w.self
	copy(peerEnclave.MRENCLAVE[:], "another build")
	s := w.genuine(t, seal.ModeProductKey)
	s.Self, s.Issuer = bodyOf(t, w.pl, peerEnclave), w.issuer(t, peerEnclave)
	addr, _ := serve(t, s)
	got, err := w.client(t, w.issuer(t, w.self)).Fetch(t.Context(), addr, seal.KeyID(dek))
	if err != nil {
		t.Fatal(err)
	}
	if err := got.Allows(""); err != nil {
		t.Fatalf("default mode: %v", err)
	}
	if err := got.Allows(seal.ModeProductKey); err != nil {
		t.Fatalf("ProductKey: %v", err)
	}
	if err := got.Allows(seal.ModeUniqueKey); !errors.Is(err, ErrPeerIdentity) {
		t.Fatalf("UniqueKey with another MRENCLAVE: %v, want ErrPeerIdentity", err)
	}
}

// TestMalformedRequests: oversized, garbled or missing messages and a
// client without a certificate are refused; the server goes on serving.
func TestMalformedRequests(t *testing.T) {
	w := newWorld(t)
	s := w.genuine(t, "")
	s.Timeout = time.Second
	addr, results := serve(t, s)
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
	msg := func(s string) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...) }
	huge := binary.BigEndian.AppendUint32(nil, MaxMessage+1)
	garbled := msg("{{{{{")
	shortID := msg(`{"version":2,"keyID":"AA","nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`)
	id := seal.KeyID(dek)
	shortNonce := msg(`{"version":2,"keyID":"` + base64.StdEncoding.EncodeToString(id[:]) + `","nonce":"AA"}`)
	n := 0
	for _, raw := range [][]byte{huge, garbled, shortID, shortNonce, nil} {
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
	if _, err := w.client(t, w.issuer(t, w.self)).Fetch(t.Context(), addr, seal.KeyID(dek)); err != nil {
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
