package integration

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"testing"

	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// presented returns the certificates addr presents in a TLS handshake
// (the Marble API asks for a client certificate only after the server's
// Finished in TLS 1.3, so none is needed to see its certificate).
func presented(t *testing.T, addr string) []*x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates
}

// presentedRoot is the root the Client API at addr presents (its only
// certificate).
func presentedRoot(t *testing.T, addr string) []byte {
	t.Helper()
	return presented(t, addr)[0].Raw
}

// presentedMarbleRoot is the Marble Root the Marble API at addr presents:
// the certificate after the serving certificate (each instance makes its
// own) that the root certifies as a CA.
func presentedMarbleRoot(t *testing.T, addr string) []byte {
	t.Helper()
	chain := presented(t, addr)
	if len(chain) != 4 || !chain[0].IsCA || chain[0].CheckSignatureFrom(chain[3]) != nil || chain[1].Subject.CommonName != "MarbleRun Coordinator - Intermediate CA" {
		t.Fatalf("the Marble API at %s presents %d certificates, want its serving certificate (a CA certified by the root), the Marble Root, the intermediate and the root", addr, len(chain))
	}
	return chain[1].Raw
}

// TestHAHandshakePresentsTheNewestState: right after a change acknowledged
// by one instance, the very first TLS handshake with another instance (Client
// API and Marble API) presents the certificates of that state, not the
// ones it had before its background watch caught up (docs/ha.md).
func TestHAHandshakePresentsTheNewestState(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	env := haEnv(cluster.Endpoints(), newPrefix())
	a, b := startCoordinator(t, "", env...), startCoordinator(t, "", env...)
	s := &updateSetup{c: a, f: newFixture(t), clients: map[string]*http.Client{}}
	s.raw = s.f.bytes(t)
	before := presentedRoot(t, b.addr)
	expect(t, setManifest(t, a, a.client(nil, nil), s.raw), http.StatusOK, "success")
	if got := presentedRoot(t, b.addr); string(got) != string(presentedRoot(t, a.addr)) {
		t.Fatalf("right after the manifest set on A, B presents another root (its own from before: %v)", string(got) == string(before))
	}
	alice := s.f.users["alice"].cert
	s.clients["alice"] = a.client(nil, &alice)
	for svn := 3; svn < 11; svn++ {
		// A package update makes a new Marble Root, the Marble API's certificate.
		expect(t, s.post(t, "alice", "/api/v2/update", packageUpdate(svn)), http.StatusOK, "success")
		if got, want := presentedMarbleRoot(t, b.meshAddr), presentedMarbleRoot(t, a.meshAddr); string(got) != string(want) {
			t.Fatalf("right after package update %d on A, B's Marble API presents an older Marble Root", svn)
		}
	}
}
