package integration

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// rawAnswer is one answer of the Client API with its headers and how long
// it took.
type rawAnswer struct {
	code       int
	header     http.Header
	status     string // JSend status (v2) or Status (v1)
	message    string
	data       json.RawMessage
	took       time.Duration
	serverCert []byte // the leaf the TLS handshake presented
}

// ask sends one request over a new connection that verifies nothing and
// returns the answer.
func ask(t *testing.T, method, url string, body []byte) rawAnswer {
	t.Helper()
	var leaf []byte
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			leaf = cs.PeerCertificates[0].Raw
			return nil
		}}}
	defer tr.CloseIdleConnections()
	hc := newHTTPClient(tr, 30*time.Second)
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		Status, Message string
		Data            json.RawMessage
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatalf("%s %s: body is not JSON: %q", method, url, raw)
	}
	return rawAnswer{code: resp.StatusCode, header: resp.Header, status: env.Status, message: env.Message, data: env.Data, took: took, serverCert: leaf}
}

// failedAttempts returns the highest attempt number the process logged as
// failed ("etcd does not answer yet; retrying").
func failedAttempts(c *coordinator) int {
	n := 0
	for line := range strings.SplitSeq(c.Logs(), "\n") {
		var e struct {
			Msg     string `json:"msg"`
			Attempt int    `json:"attempt"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "etcd does not answer yet; retrying" {
			n = max(n, e.Attempt)
		}
	}
	return n
}

// TestHAEtcdUnreachableAtStart: an instance started while etcd does not
// answer listens within seconds (Client API, Marble API, metrics), is
// alive but not ready with a reason naming etcd, answers every other
// Client API request with 503 and Retry-After at once under a temporary
// certificate that is not a CA, and refuses Marble activations as
// Unavailable; it keeps trying past the 8 attempts after which it used to
// exit. When etcd answers again the same process (never restarted) joins,
// loads the state another instance set and serves it with that root, and
// a write through it reaches the other instance.
func TestHAEtcdUnreachableAtStart(t *testing.T) {
	t.Parallel() // most of it is the wait past 8 attempts (about a minute)
	cluster := etcdtest.Start(t, 1)
	prefix := newPrefix()
	other := startCoordinator(t, "", haEnv(cluster.Endpoints(), prefix)...)
	f := newFixture(t)
	expect(t, setManifest(t, other, other.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	_, root := getChain(t, other, other.client(nil, nil))

	proxy := etcdtest.NewProxy(t, strings.TrimPrefix(cluster.Endpoints()[0], "http://"))
	proxy.DropRequests(true)
	start := time.Now()
	c := startListening(t, "", append(haEnv([]string{"http://" + proxy.Addr()}, prefix), envMetrics)...)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the APIs listened %v after the start, want within 5 s", took)
	}
	pid := c.cmd.Process.Pid
	metricsURL := "http://" + metricsAddr(t, c)

	// Alive, not ready, and the reason names etcd, on both listeners.
	if a := ask(t, http.MethodGet, c.url("/api/v2/healthz"), nil); a.code != http.StatusOK || a.status != "success" {
		t.Fatalf("healthz while waiting for etcd: %d %s %s", a.code, a.status, a.message)
	}
	if code, body, _ := plainGet(t, http.MethodGet, metricsURL+"/healthz"); code != http.StatusOK {
		t.Fatalf("metrics /healthz while waiting for etcd: %d %s", code, body)
	}
	a := ask(t, http.MethodGet, c.url("/api/v2/readyz"), nil)
	if a.code != http.StatusServiceUnavailable || a.status != "error" || !strings.HasPrefix(a.message, "not ready: ") ||
		!strings.Contains(a.message, "etcd") || a.header.Get("Retry-After") == "" {
		t.Fatalf("readyz while waiting for etcd: %d %s %q (Retry-After %q)", a.code, a.status, a.message, a.header.Get("Retry-After"))
	}
	if code, body, _ := plainGet(t, http.MethodGet, metricsURL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "etcd") {
		t.Fatalf("metrics /readyz while waiting for etcd: %d %s", code, body)
	}
	if code, body, _ := plainGet(t, http.MethodGet, metricsURL+"/metrics"); code != http.StatusOK || strings.Contains(string(body), "coordinator_state") {
		t.Fatalf("metrics while waiting for etcd: %d, want 200 without a state:\n%s", code, body)
	}

	// Every Client API request: 503 with Retry-After, saying that the
	// Coordinator is starting, within the store timeout (2 s), and no
	// state, quote or root in sight.
	for _, req := range []struct {
		method, path string
		body         []byte
	}{
		{http.MethodGet, "/api/v2/status", nil},
		{http.MethodGet, "/api/v2/quote", nil},
		{http.MethodGet, "/api/v2/manifest", nil},
		{http.MethodPost, "/api/v2/manifest", f.bytes(t)},
		{http.MethodGet, "/api/v2/secrets?s=userkey", nil},
		{http.MethodGet, "/status", nil},
		{http.MethodGet, "/quote", nil},
	} {
		a := ask(t, req.method, c.url(req.path), req.body)
		if a.code != http.StatusServiceUnavailable || a.status != "error" || a.header.Get("Retry-After") == "" ||
			!strings.Contains(a.message, "starting") || !strings.Contains(a.message, "etcd") {
			t.Fatalf("%s %s while waiting for etcd: %d %s %q (Retry-After %q)", req.method, req.path, a.code, a.status, a.message, a.header.Get("Retry-After"))
		}
		if a.took > 2*time.Second {
			t.Errorf("%s %s took %v, want within the store timeout (2 s)", req.method, req.path, a.took)
		}
		if len(a.data) > 0 && string(a.data) != "null" {
			t.Errorf("%s %s: data %s while starting", req.method, req.path, a.data)
		}
		if bytes.Equal(a.serverCert, root.Raw) {
			t.Fatalf("%s %s: the handshake presented the root before the state was loaded", req.method, req.path)
		}
		leaf := mustParseCert(t, a.serverCert)
		if leaf.IsCA || leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature) != nil || !strings.Contains(leaf.Subject.CommonName, "temporary") {
			t.Fatalf("%s %s: the certificate while starting is %q (CA %v), want a temporary self-signed leaf", req.method, req.path, leaf.Subject, leaf.IsCA)
		}
	}

	// A Marble activation: Unavailable, which a Marble retries.
	m := newTestMarble(t)
	_, err := m.activate(t, c, "backend", marbleUUIDA)
	expectCode(t, err, codes.Unavailable, "")

	// It keeps trying past the 8 attempts after which it used to exit,
	// and readiness says where it stands.
	attempt := regexp.MustCompile(`^not ready: waiting for etcd: [^;]+; attempt (\d+), `)
	for {
		a := ask(t, http.MethodGet, c.url("/api/v2/readyz"), nil)
		if a.code != http.StatusServiceUnavailable {
			t.Fatalf("readyz while waiting for etcd: %d %q", a.code, a.message)
		}
		if m := attempt.FindStringSubmatch(a.message); m != nil && atoi(t, m[1]) >= 9 {
			t.Logf("waiting: %s", a.message)
			break
		}
		select {
		case <-c.exited:
			t.Fatalf("the coordinator exited while waiting for etcd: %v\n%s", c.err, c.Logs())
		case <-time.After(250 * time.Millisecond):
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("still at %q after %v\n%s", a.message, time.Since(start), c.Logs())
		}
	}

	// etcd answers again: the same process becomes ready and serves the
	// shared state with the other instance's root.
	proxy.DropRequests(false)
	proxy.Cut()
	back := time.Now()
	for {
		a := ask(t, http.MethodGet, c.url("/api/v2/readyz"), nil)
		if a.code == http.StatusOK {
			break
		}
		if time.Since(back) > 30*time.Second {
			t.Fatalf("not ready 30 s after etcd came back: %d %q\n%s", a.code, a.message, c.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("ready %v after etcd came back", time.Since(back))
	select {
	case <-c.exited:
		t.Fatalf("the coordinator exited: %v", c.err)
	default:
	}
	if c.cmd.Process.Pid != pid || strings.Count(c.Logs(), `"msg":"client API listening"`) != 1 {
		t.Fatal("the coordinator was restarted")
	}
	alice := f.users["alice"].cert
	hc := c.client(root, &alice) // verifies the other instance's root
	expectState(t, c, hc, 3, "Coordinator is running correctly and ready to accept marbles.")
	if _, got := getChain(t, c, hc); !got.Equal(root) {
		t.Fatal("the instance serves another root than the one set through the other instance")
	}
	checkManifest(t, c, hc, root, f.bytes(t))
	secret := bytes.Repeat([]byte{0x5a}, 32)
	expect(t, postSecrets(t, c, hc, map[string]any{"userkey": map[string]any{"key": secret}}), http.StatusOK, "success")
	if got := getSecrets(t, other, other.client(root, &alice), "userkey")["userkey"]; !bytes.Equal(got.Private, secret) {
		t.Fatalf("the other instance reads %x after the write through the started one", got.Private)
	}
	if fams := scrape(t, c); !hasValue(fams, "coordinator_state", 3) {
		t.Error("coordinator_state is not 3 once the state is loaded")
	}
	if strings.Contains(c.Logs(), "DATA RACE") { // a -race build: the switch from starting to serving
		t.Fatalf("data race in the coordinator:\n%s", c.Logs())
	}
}

func hasValue(f families, name string, want float64) bool {
	v, ok := f.value(name)
	return ok && v == want
}

// TestHAEtcdUnreachableSIGTERM: SIGTERM while an instance waits for etcd
// stops it at once, cleanly (exit 0).
func TestHAEtcdUnreachableSIGTERM(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	proxy := etcdtest.NewProxy(t, strings.TrimPrefix(cluster.Endpoints()[0], "http://"))
	proxy.DropRequests(true)
	c := startListening(t, "", haEnv([]string{"http://" + proxy.Addr()}, newPrefix())...)
	for deadline := time.Now().Add(20 * time.Second); failedAttempts(c) < 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no failed attempt logged\n%s", c.Logs())
		}
	}
	start := time.Now()
	if err := c.stop(); err != nil {
		t.Fatalf("SIGTERM while waiting for etcd: %v, want exit 0\n%s", err, c.Logs())
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("stopped %v after SIGTERM, want within 5 s", took)
	}
	if !strings.Contains(c.Logs(), `"msg":"stopped"`) || strings.Contains(c.Logs(), "DATA RACE") {
		t.Errorf("no clean stop in the log:\n%s", c.Logs())
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mustParseCert parses a DER certificate.
func mustParseCert(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
