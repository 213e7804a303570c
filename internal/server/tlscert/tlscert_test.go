package tlscert

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

func selfSigned(t *testing.T, cn string) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// fixture is a server configuration whose certificate the test changes,
// counting how often it was asked for.
type fixture struct {
	cur   atomic.Pointer[tls.Certificate]
	asked atomic.Int64
	cfg   *tls.Config
}

func newFixture(t *testing.T, clientAuth tls.ClientAuthType) *fixture {
	f := &fixture{}
	f.cur.Store(selfSigned(t, "first"))
	f.cfg = Server(&tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: clientAuth}, func() *tls.Certificate {
		f.asked.Add(1)
		return f.cur.Load()
	})
	return f
}

// handshake connects with client and returns the client's view.
func handshake(t *testing.T, server, client *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	done := make(chan error, 1)
	go func() {
		sc := tls.Server(s, server)
		err := sc.Handshake()
		if err == nil {
			// TLS 1.3 sends its tickets after the handshake: let the
			// client read them.
			_, err = sc.Write([]byte{1})
		}
		done <- err
	}()
	cc := tls.Client(c, client)
	err := cc.Handshake()
	if err == nil {
		_, err = cc.Read(make([]byte, 1))
	}
	if serr := <-done; err == nil {
		err = serr
	}
	return cc.ConnectionState(), err
}

func clientConfig(t *testing.T, version uint16) *tls.Config {
	return &tls.Config{
		InsecureSkipVerify: true, MinVersion: version, MaxVersion: version,
		ClientSessionCache: tls.NewLRUClientSessionCache(4),
		Certificates:       []tls.Certificate{*selfSigned(t, "client")},
	}
}

var versions = map[string]uint16{"TLS 1.2": tls.VersionTLS12, "TLS 1.3": tls.VersionTLS13}

// TestResumesWhileTheCertificateStays: a returning client resumes, also
// when the certificate is the same one in a new value (a reloaded state),
// and keeps its client certificate.
func TestResumesWhileTheCertificateStays(t *testing.T) {
	for name, v := range versions {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tls.RequireAnyClientCert)
			client := clientConfig(t, v)
			first, err := handshake(t, f.cfg, client)
			if err != nil || first.DidResume {
				t.Fatalf("first handshake: resumed %v, %v", first.DidResume, err)
			}
			same := *f.cur.Load()
			f.cur.Store(&same)
			st, err := handshake(t, f.cfg, client)
			if err != nil {
				t.Fatal(err)
			}
			if !st.DidResume {
				t.Fatal("a returning client with the certificate unchanged did not resume")
			}
		})
	}
}

// TestChangeEndsResumption: after the certificate changed, a client with a
// session from before gets a full handshake that presents the new
// certificate, never the old session.
func TestChangeEndsResumption(t *testing.T) {
	for name, v := range versions {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tls.RequireAnyClientCert)
			client := clientConfig(t, v)
			if _, err := handshake(t, f.cfg, client); err != nil {
				t.Fatal(err)
			}
			next := selfSigned(t, "second")
			f.cur.Store(next)
			st, err := handshake(t, f.cfg, client)
			if err != nil {
				t.Fatal(err)
			}
			if st.DidResume {
				t.Fatal("a session made under the old certificate resumed after the change")
			}
			if len(st.PeerCertificates) == 0 || !bytes.Equal(st.PeerCertificates[0].Raw, next.Certificate[0]) {
				t.Fatal("the handshake after the change did not present the new certificate")
			}
		})
	}
}

// TestEveryHandshakeAsksForTheCertificate: a resuming handshake asks for
// the current certificate too (with a shared store that is where the
// instance syncs with the stored state).
func TestEveryHandshakeAsksForTheCertificate(t *testing.T) {
	f := newFixture(t, tls.RequireAnyClientCert)
	client := clientConfig(t, tls.VersionTLS13)
	for i := range 3 {
		if _, err := handshake(t, f.cfg, client); err != nil {
			t.Fatal(err)
		}
		if got := f.asked.Load(); got != int64(i+1) {
			t.Fatalf("after %d handshakes the certificate was asked for %d times", i+1, got)
		}
	}
}

// TestTicketKeyLifetime: a session older than the ticket key's lifetime
// does not resume.
func TestTicketKeyLifetime(t *testing.T) {
	f := &fixture{}
	f.cur.Store(selfSigned(t, "first"))
	now := time.Now()
	s := &server{base: &tls.Config{ClientAuth: tls.RequireAnyClientCert}, cert: f.cur.Load, now: func() time.Time { return now }}
	cfg := &tls.Config{GetConfigForClient: s.configFor}
	client := clientConfig(t, tls.VersionTLS13)
	if _, err := handshake(t, cfg, client); err != nil {
		t.Fatal(err)
	}
	now = now.Add(TicketKeyLifetime)
	st, err := handshake(t, cfg, client)
	if err != nil {
		t.Fatal(err)
	}
	if st.DidResume {
		t.Fatal("a session older than the ticket key's lifetime resumed")
	}
}

// TestNoCertificate: without a certificate the handshake fails with
// ErrNoCertificate instead of panicking.
func TestNoCertificate(t *testing.T) {
	cfg := Server(&tls.Config{}, func() *tls.Certificate { return nil })
	_, err := cfg.GetConfigForClient(&tls.ClientHelloInfo{})
	if !errors.Is(err, ErrNoCertificate) {
		t.Fatalf("error = %v, want ErrNoCertificate", err)
	}
}
