package client_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/quarry-cc/quarry/api/jsend"
	"github.com/quarry-cc/quarry/internal/testpki"
)

// pki is a Coordinator-like root and intermediate CA.
type pki struct {
	rootKey, interKey *ecdsa.PrivateKey
	root, inter       *x509.Certificate
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	p := &pki{}
	var err error
	if p.rootKey, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if p.interKey, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	p.root = createCert(t, "Test Coordinator", nil, nil, p.rootKey)
	p.inter = createCert(t, "Test Coordinator - Intermediate CA", p.root, p.rootKey, p.interKey)
	return p
}

// createCert creates a CA certificate valid for loopback for self's key;
// self-signed if parent is nil.
func createCert(t testing.TB, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, self *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	opts := []testpki.Option{testpki.Key(self), testpki.Loopback(), testpki.ServerAuth(), testpki.ClientAuth()}
	if parent == nil {
		return testpki.NewCA(t, cn, opts...).Cert
	}
	issuer := &testpki.Cert{Cert: parent, Key: parentKey}
	return issuer.Issue(t, cn, append(opts, testpki.CA())...).Cert
}

func certPEM(certs ...*x509.Certificate) string {
	var b strings.Builder
	for _, c := range certs {
		b.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	return b.String()
}

// fake is a Coordinator speaking the v2 wire contract on loopback, serving
// its root certificate as the TLS certificate (as the real one does).
type fake struct {
	*pki
	srv *httptest.Server

	mu       sync.Mutex
	handlers map[string]http.HandlerFunc // "GET /api/v2/status"
	requests []recorded
}

// recorded is one request the fake received.
type recorded struct {
	Method, Path string
	Query        map[string][]string
	Body         []byte
	PeerCerts    []*x509.Certificate
}

func newFake(t *testing.T) *fake {
	return newFakeWithTLSCert(t, newPKI(t), nil)
}

// newFakeWithTLSCert starts a fake for p; tlsCert overrides the served
// certificate (default: p's root).
func newFakeWithTLSCert(t testing.TB, p *pki, tlsCert *tls.Certificate) *fake {
	t.Helper()
	return newFakeServer(t, p, tlsCert, true)
}

// newFakeServer starts a fake for p, speaking HTTP/2 if h2 (else HTTP/1.1
// only); tlsCert overrides the served certificate (default: p's root).
func newFakeServer(t testing.TB, p *pki, tlsCert *tls.Certificate, h2 bool) *fake {
	t.Helper()
	f := &fake{pki: p, handlers: map[string]http.HandlerFunc{}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	if tlsCert == nil {
		tlsCert = &tls.Certificate{Certificate: [][]byte{p.root.Raw}, PrivateKey: p.rootKey}
	}
	f.srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{*tlsCert},
		ClientAuth:   tls.RequestClientCert,
	}
	f.srv.EnableHTTP2 = h2
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

// endpoint returns the fake's host:port.
func (f *fake) endpoint() string { return strings.TrimPrefix(f.srv.URL, "https://") }

// handle sets the handler of "METHOD /path".
func (f *fake) handle(route string, h http.HandlerFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlers[route] = h
}

// count returns how many requests with method the fake received.
func (f *fake) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.requests {
		if r.Method == method {
			n++
		}
	}
	return n
}

// total returns how many requests the fake received.
func (f *fake) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

func (f *fake) last() recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		return recorded{}
	}
	return f.requests[len(f.requests)-1]
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec := recorded{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Body: body}
	if r.TLS != nil {
		rec.PeerCerts = r.TLS.PeerCertificates
	}
	f.mu.Lock()
	f.requests = append(f.requests, rec)
	h := f.handlers[r.Method+" "+r.URL.Path]
	f.mu.Unlock()
	if h == nil {
		reply(w, http.StatusNotFound, jsend.StatusFail, nil, "unknown path: "+r.URL.Path)
		return
	}
	h(w, r)
}

// reply writes a JSend response.
func reply(w http.ResponseWriter, status int, jsendStatus string, data any, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(jsend.Response[any]{Status: jsendStatus, Data: data, Message: msg})
}

// success returns a handler answering data.
func success(data any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { reply(w, http.StatusOK, jsend.StatusSuccess, data, "") }
}

// failure returns a handler answering fail (4xx) or error (5xx).
func failure(status int, msg string, data any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := jsend.StatusFail
		if status >= 500 {
			s = jsend.StatusError
		}
		reply(w, status, s, data, msg)
	}
}
