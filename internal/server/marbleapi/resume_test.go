package marbleapi

import (
	"bytes"
	"crypto/tls"
	"net"
	"sync/atomic"
	"testing"
)

// resumeHandshake connects to a server with cfg and returns the client's
// view, after reading the server's first byte (TLS 1.3 tickets arrive
// after the handshake).
func resumeHandshake(t *testing.T, cfg, client *tls.Config) tls.ConnectionState {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer s.Close()
		sc := tls.Server(s, cfg)
		err = sc.Handshake()
		if err == nil {
			_, err = sc.Write([]byte{1})
		}
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc := tls.Client(c, client)
	err = cc.Handshake()
	if err == nil {
		_, err = cc.Read(make([]byte, 1))
	}
	if serr := <-done; err == nil {
		err = serr
	}
	if err != nil {
		t.Fatal(err)
	}
	return cc.ConnectionState()
}

// TestResumptionFollowsTheMarbleRoot: a returning Marble resumes while the
// Marble Root stays; after it changed (an update, a recovery, another
// instance's change), the same Marble gets a full handshake with the new
// Marble Root. Every handshake, resumed or not, asks for the current
// certificate (with a shared store that is where the instance syncs).
func TestResumptionFollowsTheMarbleRoot(t *testing.T) {
	var cur atomic.Pointer[tls.Certificate]
	var asked atomic.Int64
	first := selfSigned(t, "MarbleRun Coordinator - Intermediate CA", true)
	cur.Store(&first)
	cfg := TLSConfig(func() *tls.Certificate { asked.Add(1); return cur.Load() })
	client := &tls.Config{InsecureSkipVerify: true, ServerName: "coordinator", ClientSessionCache: tls.NewLRUClientSessionCache(2),
		Certificates: []tls.Certificate{selfSigned(t, "MarbleRun Marble", false)}}

	resumeHandshake(t, cfg, client)
	if st := resumeHandshake(t, cfg, client); !st.DidResume {
		t.Fatal("a returning Marble did not resume while the Marble Root stayed")
	}
	next := selfSigned(t, "MarbleRun Coordinator - Intermediate CA", true)
	cur.Store(&next)
	st := resumeHandshake(t, cfg, client)
	if st.DidResume || !bytes.Equal(st.PeerCertificates[0].Raw, next.Certificate[0]) {
		t.Fatalf("after the Marble Root changed: resumed %v, the new Marble Root presented %v", st.DidResume,
			len(st.PeerCertificates) > 0 && bytes.Equal(st.PeerCertificates[0].Raw, next.Certificate[0]))
	}
	if asked.Load() != 3 {
		t.Fatalf("3 handshakes asked for the certificate %d times", asked.Load())
	}
}
