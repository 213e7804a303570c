package integration

import (
	"bufio"
	"bytes"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// impostor returns a client certificate whose chain is the attacker's own
// self-signed leaf (with its private key) followed by a victim's public
// certificate: what anybody can build from GET /api/v2/manifest.
func impostor(t *testing.T, victim tls.Certificate) tls.Certificate {
	t.Helper()
	own, _ := newUserCert(t, "mallory")
	return tls.Certificate{
		Certificate: [][]byte{own.Certificate[0], victim.Certificate[0]},
		PrivateKey:  own.PrivateKey,
	}
}

// userEndpoint is a request to an endpoint that needs a manifest user.
type userEndpoint struct {
	method, path string
	body         any
	v1           bool
}

// userEndpoints lists every endpoint that needs a user, in both
// generations, each with a body it would accept from an authorised user.
func userEndpoints() []userEndpoint {
	secret := map[string]any{"userkey": map[string]any{"key": make([]byte, 32)}}
	return []userEndpoint{
		{method: http.MethodGet, path: "/api/v2/secrets?s=symkey"},
		{method: http.MethodPost, path: "/api/v2/secrets", body: map[string]any{"secrets": secret}},
		{method: http.MethodPost, path: "/api/v2/update", body: map[string][]byte{"manifest": packageUpdate(2)}},
		{method: http.MethodPost, path: "/api/v2/update-manifest", body: map[string][]byte{"manifest": packageUpdate(2)}},
		{method: http.MethodPost, path: "/api/v2/update-cancel"},
		{method: http.MethodGet, path: "/api/v2/recover/secrets"},
		{method: http.MethodGet, path: "/secrets?s=symkey", v1: true},
		{method: http.MethodPost, path: "/secrets", body: map[string]any{"userkey": map[string]any{"Key": make([]byte, 32)}}, v1: true},
		{method: http.MethodPost, path: "/update", body: packageUpdate(2), v1: true},
		{method: http.MethodPost, path: "/update-manifest", body: packageUpdate(2), v1: true},
		{method: http.MethodPost, path: "/update-cancel", v1: true},
	}
}

// TestLeafOnlyIdentifiesUser: a chain whose leaf is nobody's is refused
// with 401 on every endpoint that needs a user, even when a user's public
// certificate follows it (docs/design/decisions.md#d14); the state does not change.
func TestLeafOnlyIdentifiesUser(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	f := newFixture(t)
	expect(t, setManifest(t, c, c.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	alice := f.users["alice"].cert
	for _, victim := range []string{"alice", "bob"} {
		fake := impostor(t, f.users[victim].cert)
		hc := c.client(nil, &fake)
		for _, ep := range userEndpoints() {
			t.Run(victim+" "+ep.method+" "+ep.path, func(t *testing.T) {
				r := do(t, hc, ep.method, c.url(ep.path), ep.body)
				if ep.v1 {
					expectV1(t, r, http.StatusUnauthorized, "error")
				} else {
					expect(t, r, http.StatusUnauthorized, "fail")
				}
				if !strings.Contains(r.Message, "client certificate") {
					t.Fatalf("message %q does not name the client certificate", r.Message)
				}
			})
		}
	}
	// Nothing changed: the user-defined secret is still unset, the package
	// still at version 1, no update pending.
	ac := c.client(nil, &alice)
	if got := getSecrets(t, c, ac, "userkey")["userkey"]; len(got.Private) != 0 {
		t.Fatal("the impostor set a secret")
	}
	if entries := getLog(t, c, ac); len(entries) != 1 { // "Initial manifest set"
		t.Fatalf("the update log has entries: %+v", entries)
	}
	expect(t, do(t, ac, http.MethodGet, c.url("/api/v2/update-manifest"), nil), http.StatusNotFound, "fail")
	// The user's own leaf, followed by anything, still works.
	chain := tls.Certificate{Certificate: [][]byte{alice.Certificate[0], f.users["bob"].cert.Certificate[0]}, PrivateKey: alice.PrivateKey}
	getSecrets(t, c, c.client(nil, &chain), "symkey")
}

// TestV1RecoverOffByDefault: in recovery mode the unsigned v1 recover is
// refused with 403 naming the setting (docs/design/decisions.md#d11); the state stays in recovery,
// and the signed v2 recover still works.
func TestV1RecoverOffByDefault(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 1, 0)
	s.breakKey(t)
	anon := s.c.client(nil, nil)
	r := do(t, anon, http.MethodPost, s.c.url("/recover"), toInts(s.secrets["key1"]))
	expectV1(t, r, http.StatusForbidden, "error")
	for _, want := range []string{"--enable-v1-recover", "QUARRY_ENABLE_V1_RECOVER=1", "/api/v2/recover", "signature"} {
		if !strings.Contains(r.Message, want) {
			t.Errorf("message %q does not contain %q", r.Message, want)
		}
	}
	expectState(t, s.c, anon, 1, msgRecovery)
	s.upload(t, "key1", 0)
	s.checkRecovered(t)
}

// TestNewSettingsOnTheCommandLine: the new settings appear in --help (the
// v1 recover switch with its reason), bad values stop the Coordinator with
// exit code 2 naming the setting, and the secret limits reach the core.
func TestNewSettingsOnTheCommandLine(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(coordinatorBin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"-enable-v1-recover", "QUARRY_ENABLE_V1_RECOVER", "carries no signature",
		"-max-secrets", "QUARRY_MAX_SECRETS", "-max-secret-generation", "QUARRY_MAX_SECRET_GENERATION"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help does not mention %q", want)
		}
	}
	for _, tc := range []struct{ env, want string }{
		{"QUARRY_ENABLE_V1_RECOVER=yes", "enable-v1-recover [QUARRY_ENABLE_V1_RECOVER]"},
		{"QUARRY_MAX_SECRETS=-3", "max-secrets [QUARRY_MAX_SECRETS]"},
		{"QUARRY_MAX_SECRET_GENERATION=forever", "max-secret-generation [QUARRY_MAX_SECRET_GENERATION]"},
	} {
		code, log := runCoordinatorOnce(t, tc.env)
		if code != 2 || !strings.Contains(log, tc.want) {
			t.Errorf("%s: exit %d, want 2 naming %q\n%s", tc.env, code, tc.want, log)
		}
	}

	c := startCoordinator(t, "", "QUARRY_MAX_SECRETS=2")
	r := setManifest(t, c, c.client(nil, nil), newFixture(t).bytes(t)) // three secrets
	expect(t, r, http.StatusBadRequest, "fail")
	if !strings.Contains(r.Message, "at most 2 (QUARRY_MAX_SECRETS)") {
		t.Fatalf("message %q", r.Message)
	}
	c = startCoordinator(t, "", "QUARRY_MAX_SECRET_GENERATION=1ms")
	f := newFixture(t)
	f.set("Secrets.rsa", map[string]any{"Type": "cert-rsa", "Size": 2048, "Shared": true})
	r = setManifest(t, c, c.client(nil, nil), f.bytes(t))
	expect(t, r, http.StatusBadRequest, "fail")
	if !strings.Contains(r.Message, "QUARRY_MAX_SECRET_GENERATION") {
		t.Fatalf("message %q", r.Message)
	}
	// Without limits the same manifest is accepted.
	c = startCoordinator(t, "", "QUARRY_MAX_SECRETS=0", "QUARRY_MAX_SECRET_GENERATION=0")
	expect(t, setManifest(t, c, c.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
}

// rawConn is an HTTP/1.1 connection over TLS driven by hand, to send a
// request's headers and only part of its body.
type rawConn struct {
	*tls.Conn
	br *bufio.Reader
}

// dialRaw opens a TLS connection speaking HTTP/1.1, presenting cert if
// given. A read deadline of a minute guards against a hang (a failure,
// not a measured time).
func dialRaw(t *testing.T, c *coordinator, cert *tls.Certificate) *rawConn {
	t.Helper()
	return dialRawFrom(t, c, cert, "127.0.0.1")
}

// dialRawFrom is dialRaw from the loopback address src.
func dialRawFrom(t *testing.T, c *coordinator, cert *tls.Certificate, src string) *rawConn {
	t.Helper()
	cfg := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conn, err := tls.DialWithDialer(d, "tcp", c.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	return &rawConn{Conn: conn, br: bufio.NewReader(conn)}
}

// waitDelivered waits until the Coordinator's process has read every byte
// written on rc: rc's send queue and the server side's receive queue are
// empty (/proc/net/tcp, loopback). A Write returns once the bytes are in
// the kernel, which may be megabytes before the server has read them (and
// reserved their memory).
func (rc *rawConn) waitDelivered(t *testing.T) {
	t.Helper()
	local := rc.LocalAddr().(*net.TCPAddr)
	remote := rc.RemoteAddr().(*net.TCPAddr)
	hexAddr := func(a *net.TCPAddr) string {
		ip := a.IP.To4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
	}
	me, server := hexAddr(local), hexAddr(remote)
	deadline := time.Now().Add(30 * time.Second)
	for {
		raw, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			t.Fatal(err)
		}
		queued, seen := false, 0
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			if (f[1] == me && f[2] == server) || (f[1] == server && f[2] == me) {
				seen++
				queues := strings.SplitN(f[4], ":", 2)
				if f[1] == me && queues[0] != "00000000" || f[1] == server && queues[1] != "00000000" {
					queued = true
				}
			}
		}
		if seen < 2 {
			t.Fatalf("connection %s -> %s not found in /proc/net/tcp (%d sides)", me, server, seen)
		}
		if !queued {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Coordinator did not read the bytes sent on %s within 30 s", me)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startRequest writes a request's headers, declaring a body of length
// bytes, and the first bytes of the body.
func (rc *rawConn) startRequest(t *testing.T, method, path string, length int64, first []byte, header ...string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", method, path, length)
	for _, h := range header {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := rc.Write(append([]byte(b.String()), first...)); err != nil {
		t.Fatal(err)
	}
}

// readAnswer reads one response and decodes its JSend envelope.
func (rc *rawConn) readAnswer(t *testing.T, method string) (*http.Response, response) {
	t.Helper()
	resp, r, err := rc.readAnswerErr(method)
	if err != nil {
		t.Fatal(err)
	}
	return resp, r
}

// readAnswerErr is readAnswer for other goroutines than the test's.
func (rc *rawConn) readAnswerErr(method string) (*http.Response, response, error) {
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		return nil, response{}, fmt.Errorf("reading the answer: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, response{}, fmt.Errorf("reading the answer's body: %w", err)
	}
	r := response{HTTPStatus: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Raw: raw}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, response{}, fmt.Errorf("answer %d is not JSON: %q", resp.StatusCode, raw)
	}
	return resp, r, nil
}

// TestCheapChecksBeforeTheBody: the endpoints that need a user answer 401
// (no or unknown certificate) or 409 (wrong state), and the manifest set
// and recover 409 (wrong state), after the headers and a few bytes of an
// 8 MiB body, without waiting for the rest (docs/design/decisions.md#d16); a client that asks for
// "100 Continue" gets the final answer instead and never has to send the
// body.
func TestCheapChecksBeforeTheBody(t *testing.T) {
	t.Parallel()
	running := startCoordinator(t, "")
	f := newFixture(t)
	expect(t, setManifest(t, running, running.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	empty := startCoordinator(t, "") // state 2: no users yet
	alice := f.users["alice"].cert
	stranger, _ := newUserCert(t, "stranger")
	const length = 8 << 20
	for _, tc := range []struct {
		c      *coordinator
		who    string
		cert   *tls.Certificate
		path   string
		status int
	}{
		{running, "anonymous", nil, "/api/v2/update", http.StatusUnauthorized},
		{running, "stranger", &stranger, "/api/v2/update", http.StatusUnauthorized},
		{running, "anonymous", nil, "/api/v2/update-manifest", http.StatusUnauthorized},
		{running, "anonymous", nil, "/api/v2/update-cancel", http.StatusUnauthorized},
		{running, "stranger", &stranger, "/api/v2/secrets", http.StatusUnauthorized},
		{running, "anonymous", nil, "/update", http.StatusUnauthorized},
		{running, "anonymous", nil, "/update-manifest", http.StatusUnauthorized},
		{running, "anonymous", nil, "/update-cancel", http.StatusUnauthorized},
		{running, "stranger", &stranger, "/secrets", http.StatusUnauthorized},
		// No user needed, but the state is checked first: nobody can hold
		// body memory of a running Coordinator with a slow upload.
		{running, "anonymous", nil, "/api/v2/manifest", http.StatusConflict},
		{running, "anonymous", nil, "/manifest", http.StatusConflict},
		{running, "anonymous", nil, "/api/v2/recover", http.StatusConflict},
		{running, "anonymous", nil, "/recover", http.StatusForbidden}, // v1 recover is off
		// sign-quote needs no user: the feature gate comes first, in
		// every state (no manifest enables it here).
		{running, "anonymous", nil, "/api/v2/sign-quote", http.StatusForbidden},
		{empty, "anonymous", nil, "/api/v2/sign-quote", http.StatusForbidden},
		{empty, "anonymous", nil, "/api/v2/recover", http.StatusConflict},
		{empty, "alice", &alice, "/api/v2/update", http.StatusConflict},
		{empty, "alice", &alice, "/api/v2/secrets", http.StatusConflict},
		{empty, "alice", &alice, "/update", http.StatusConflict},
	} {
		name := fmt.Sprintf("%d %s %s", tc.status, tc.who, tc.path)
		t.Run(name, func(t *testing.T) {
			rc := dialRaw(t, tc.c, tc.cert)
			rc.startRequest(t, http.MethodPost, tc.path, length, []byte(`{"manifest":"AAAA`))
			resp, r := rc.readAnswer(t, http.MethodPost)
			if r.HTTPStatus != tc.status || r.ContentType != "application/json" || r.Message == "" {
				t.Fatalf("answer %d %q: %s", r.HTTPStatus, r.ContentType, r.Raw)
			}
			if !resp.Close {
				t.Error("the connection is kept open although the body was not read")
			}
		})
		t.Run(name+" expecting 100-continue", func(t *testing.T) {
			rc := dialRaw(t, tc.c, tc.cert)
			rc.startRequest(t, http.MethodPost, tc.path, length, nil, "Expect: 100-continue")
			_, r := rc.readAnswer(t, http.MethodPost)
			if r.HTTPStatus != tc.status {
				t.Fatalf("first answer %d (want %d without 100 Continue): %s", r.HTTPStatus, tc.status, r.Raw)
			}
		})
	}
}

// bigBody writes a file of about size bytes that starts like a manifest
// request and returns its path and content.
func bigBody(t *testing.T, size int) (string, []byte) {
	t.Helper()
	body := append([]byte(`{"manifest":"`), bytes.Repeat([]byte{'A'}, size)...)
	body = append(body, `"}`...)
	path := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(path, body, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, body
}

// TestTooLargeAnswerArrives: a body over the limit gets 413 with its JSend
// answer, which reaches the client before the connection closes, whether
// the client sends with a length or chunked, over HTTP/1.1 or HTTP/2, and
// also when curl sends it (docs/design/decisions.md#d13, #d16).
func TestTooLargeAnswerArrives(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", "QUARRY_MAX_MANIFEST_SIZE=4096")
	file, body := bigBody(t, 20<<20)
	for _, path := range []string{"/api/v2/manifest", "/manifest"} {
		for _, h2 := range []bool{false, true} {
			for _, chunked := range []bool{false, true} {
				t.Run(fmt.Sprintf("Go %s h2=%v chunked=%v", path, h2, chunked), func(t *testing.T) {
					tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: h2}
					if !h2 {
						tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
					}
					defer tr.CloseIdleConnections()
					var rd io.Reader = bytes.NewReader(body)
					if chunked {
						rd = io.MultiReader(rd) // no known length
					}
					req, _ := http.NewRequest(http.MethodPost, c.url(path), rd)
					resp, err := (&http.Client{Transport: tr}).Do(req)
					if err != nil {
						t.Fatalf("no answer: %v", err)
					}
					defer resp.Body.Close()
					raw, err := io.ReadAll(resp.Body)
					if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge || !json.Valid(raw) || !bytes.Contains(raw, []byte("too large")) {
						t.Fatalf("answer %d %q (%v)", resp.StatusCode, raw, err)
					}
				})
			}
		}
		curl, err := exec.LookPath("curl")
		if err != nil {
			continue
		}
		for _, opts := range [][]string{{"--http1.1"}, {"--http1.1", "-H", "Expect:"}, {"--http2"}} {
			t.Run("curl "+path+" "+strings.Join(opts, " "), func(t *testing.T) {
				args := append([]string{"-sS", "-k", "-w", "\n%{http_code}", "--data-binary", "@" + file}, opts...)
				out, err := exec.Command(curl, append(args, c.url(path))...).CombinedOutput()
				text := strings.TrimSpace(string(out))
				i := strings.LastIndexByte(text, '\n')
				answer, code := strings.TrimSpace(text[:max(i, 0)]), text[i+1:]
				if err != nil || code != "413" || !json.Valid([]byte(answer)) || !strings.Contains(answer, "too large") {
					t.Fatalf("curl: %v\n%s", err, out)
				}
			})
		}
	}
}

// TestBusyBodiesGet503: the memory for bodies being decoded is bounded
// (docs/http.md) and reserved as the bytes arrive. With a 64 MiB Go memory limit
// the budget is its smallest, two updates of the largest size (about
// 67 MiB), and one address may hold half of it; an update of 10 MiB takes
// about three times that while it is decoded. Requests that declare 10 MiB
// and send a few bytes take almost nothing: all are admitted. Once one of
// them has sent nearly all its body, a second from the same address that
// does the same is refused with 429 (its address holds its share); one from
// another address fits; one from a third does not fit the budget and gets
// 503. Every refusal is immediate, with Retry-After and a JSend answer.
// The admitted ones are answered once complete, and the memory is free
// again.
func TestBusyBodiesGet503(t *testing.T) {
	c := startCoordinator(t, "", "GOMEMLIMIT=64MiB", "QUARRY_CLIENT_MIN_BODY_RATE=0")
	f := newFixture(t)
	expect(t, setManifest(t, c, c.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	alice := f.users["alice"].cert
	first := []byte(`{"manifest":"`)
	rest := append(bytes.Repeat([]byte{'A'}, 10<<20-len(first)-2), `"}`...)
	length := int64(len(first) + len(rest))
	type answer struct {
		resp *http.Response
		r    response
		err  error
	}
	start := func(src string) (*rawConn, chan answer) {
		rc := dialRawFrom(t, c, &alice, src)
		rc.startRequest(t, http.MethodPost, "/api/v2/update", length, first)
		ch := make(chan answer, 1)
		go func() {
			resp, r, err := rc.readAnswerErr(http.MethodPost)
			ch <- answer{resp, r, err}
		}()
		return rc, ch
	}
	refused := func(what string, ch chan answer, status int, msg string) {
		t.Helper()
		select {
		case a := <-ch:
			if a.err != nil {
				t.Fatalf("%s: %v", what, a.err)
			}
			if a.r.HTTPStatus != status || a.resp.Header.Get("Retry-After") == "" || !strings.Contains(a.r.Message, msg) || a.r.ContentType != "application/json" {
				t.Fatalf("%s: answer %d Retry-After %q: %s", what, a.r.HTTPStatus, a.resp.Header.Get("Retry-After"), a.r.Raw)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no answer", what)
		}
	}
	pending := func(what string, ch chan answer) {
		t.Helper()
		select {
		case a := <-ch:
			t.Fatalf("%s was answered before its body was complete: %d %s %v", what, a.r.HTTPStatus, a.r.Raw, a.err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	for round := range 2 {
		// Four declared 10 MiB each from one address; a few bytes sent.
		conns := make([]*rawConn, 4)
		answers := make([]chan answer, 4)
		for i := range conns {
			conns[i], answers[i] = start("127.0.0.1")
		}
		for i := range conns {
			pending(fmt.Sprintf("round %d: declared request %d", round, i), answers[i])
		}
		// The first sends all but the last byte: it holds about 30 MiB.
		if _, err := conns[0].Write(rest[:len(rest)-1]); err != nil {
			t.Fatal(err)
		}
		conns[0].waitDelivered(t)
		pending("the first request", answers[0])
		// A second from the same address does not fit its share.
		conns[1].Write(rest)
		refused("a second large body from the same address", answers[1], http.StatusTooManyRequests, "your address")
		// One from another address fits the budget.
		other, otherAnswer := start("127.0.0.2")
		if _, err := other.Write(rest[:len(rest)-1]); err != nil {
			t.Fatal(err)
		}
		other.waitDelivered(t)
		pending("a large body from another address", otherAnswer)
		// A third address finds the budget taken.
		third, thirdAnswer := start("127.0.0.3")
		third.Write(rest)
		refused("a large body when the budget is taken", thirdAnswer, http.StatusServiceUnavailable, "busy")
		// The admitted ones complete: answered (not a manifest).
		for _, held := range []struct {
			rc *rawConn
			ch chan answer
		}{{conns[0], answers[0]}, {other, otherAnswer}} {
			held.rc.Write(rest[len(rest)-1:])
			if a := <-held.ch; a.err != nil || a.r.HTTPStatus != http.StatusBadRequest {
				t.Fatalf("round %d: an admitted request: %v %d %s", round, a.err, a.r.HTTPStatus, a.r.Raw)
			}
		}
		for _, rc := range append(conns, other, third) {
			rc.Close()
		}
	}
	expect(t, do(t, c.client(nil, &alice), http.MethodPost, c.url("/api/v2/update"), map[string][]byte{"manifest": packageUpdate(2)}), http.StatusOK, "success")
}

// TestSealDirPermissionsTightened: an existing seal directory open to group
// and others is set to 0700 at start, with a warning naming the old mode.
func TestSealDirPermissionsTightened(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "seal")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	c := startCoordinator(t, dir)
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o700 {
		t.Fatalf("seal directory mode %04o, want 0700", info.Mode().Perm())
	}
	found := false
	for _, line := range strings.Split(c.Logs(), "\n") {
		var entry struct {
			Level, Msg, Dir, OldMode string
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Level == "WARN" && strings.Contains(entry.Msg, "seal directory") &&
			entry.OldMode == "0755" && entry.Dir == dir {
			found = true
		}
	}
	if !found {
		t.Fatalf("no WARN line naming the old mode 0755:\n%s", c.Logs())
	}
	// A directory that is already private is left alone, silently.
	c.kill()
	c.start()
	if strings.Count(c.Logs(), "permissions tightened") != 1 {
		t.Fatalf("tightened again:\n%s", c.Logs())
	}
}

// TestNetHTTPEdgesAreJSend: answers that net/http would write itself (in
// plain text or HTML) or get wrong are JSend with the right status.
func TestNetHTTPEdgesAreJSend(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	// An escaped slash is not a path separator: no such path (not 405).
	r := do(t, hc, http.MethodGet, c.url("/api/v2%2Fstatus"), nil)
	expect(t, r, http.StatusNotFound, "fail")
	// Paths http.ServeMux would redirect (with an HTML body) do not exist.
	for _, p := range []string{"//api/v2/status", "/api/v2/./status", "/api/v2/x/../status", "/api/v2//status"} {
		rc := dialRaw(t, c, nil)
		rc.startRequest(t, http.MethodGet, p, 0, nil)
		resp, r := rc.readAnswer(t, http.MethodGet)
		if r.HTTPStatus != http.StatusNotFound || r.ContentType != "application/json" || resp.Header.Get("Location") != "" {
			t.Errorf("%s: answer %d %q Location %q: %s", p, r.HTTPStatus, r.ContentType, resp.Header.Get("Location"), r.Raw)
		}
	}
	// OPTIONS * goes to the handler.
	rc := dialRaw(t, c, nil)
	rc.startRequest(t, http.MethodOptions, "*", 0, nil)
	if _, r := rc.readAnswer(t, http.MethodOptions); r.HTTPStatus != http.StatusNotFound {
		t.Errorf("OPTIONS *: answer %d %s", r.HTTPStatus, r.Raw)
	}

	// Headers over the documented 64 KiB: JSend 431, over HTTP/1.1 and
	// HTTP/2.
	for _, h2 := range []bool{false, true} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		req, _ := http.NewRequest(http.MethodGet, c.url("/api/v2/status"), nil)
		req.Header.Set("X-Big", strings.Repeat("a", 70<<10))
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("h2=%v: %v", h2, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || resp.Header.Get("Content-Type") != "application/json" ||
			!json.Valid(raw) || !strings.Contains(string(raw), "65536") {
			t.Errorf("h2=%v: answer %d %q: %s", h2, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
		}
		tr.CloseIdleConnections()
	}

	// A malformed chunked body: JSend 400.
	rc = dialRaw(t, c, nil)
	if _, err := io.WriteString(rc, "POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, r := rc.readAnswer(t, http.MethodPost); r.HTTPStatus != http.StatusBadRequest || r.ContentType != "application/json" {
		t.Errorf("malformed chunked body: answer %d %q: %s", r.HTTPStatus, r.ContentType, r.Raw)
	}

	// Plain HTTP on the TLS port: JSend 400 in the generation of the path.
	for _, tc := range []struct{ request, prefix string }{
		{"GET /api/v2/status HTTP/1.1\r\nHost: x\r\n\r\n", `{"status":"fail",`},
		{"GET /status HTTP/1.1\r\nHost: x\r\n\r\n", `{"Status":"error",`},
		{"POST /api/v2/manifest HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", `{"status":"fail",`},
	} {
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(time.Minute))
		io.WriteString(conn, tc.request)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("plain HTTP: %v", err)
		}
		raw, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != http.StatusBadRequest || resp.Proto != "HTTP/1.1" || resp.Header.Get("Content-Type") != "application/json" ||
			!strings.HasPrefix(string(raw), tc.prefix) || !strings.Contains(string(raw), "HTTPS") {
			t.Errorf("plain HTTP %q: answer %s %d %q: %s", tc.request, resp.Proto, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
		}
	}
	// The Coordinator still serves TLS.
	expect(t, do(t, hc, http.MethodGet, c.url("/api/v2/status"), nil), http.StatusOK, "success")
}

// TestALPNHTTP10: a client offering only http/1.0 in ALPN completes the
// handshake and is served HTTP/1.x, instead of failing with an error line
// in the log for every connection.
func TestALPNHTTP10(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	conn, err := tls.Dial("tcp", c.addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.0"}})
	if err != nil {
		t.Fatalf("handshake offering only http/1.0: %v", err)
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p != "http/1.0" {
		t.Errorf("negotiated %q", p)
	}
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	io.WriteString(conn, "GET /api/v2/status HTTP/1.0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"status":"success"`) {
		t.Fatalf("answer %d: %s", resp.StatusCode, raw)
	}
	if strings.Contains(c.Logs(), "handshake error") {
		t.Fatalf("handshake error logged:\n%s", c.Logs())
	}
}

// TestRecoverySecretsFetchedAgain: the answer with the recovery secrets is
// lost; a user with UpdateManifest fetches them again (GET
// /api/v2/recover/secrets), they decrypt with the recovery keys and recover
// the state. Strangers get 401, users without UpdateManifest 403, a
// manifest without recovery keys 404, other states 409; after an update
// that changes the keys, the new secrets are served.
func TestRecoverySecretsFetchedAgain(t *testing.T) {
	t.Parallel()
	s := newUpdateSetup(t, 0, "reader:carol")
	_, root := getChain(t, s.c, s.c.client(nil, nil))
	const path = "/api/v2/recover/secrets"
	// The fixture has no recovery keys: nothing to fetch.
	expect(t, do(t, s.clients["alice"], http.MethodGet, s.c.url(path), nil), http.StatusNotFound, "fail")

	keys := recoveryKeys(t, 3)
	next := s.newManifest(t, func(f *fixture) {
		f.set("RecoveryKeys", map[string]any{"k1": publicKeyPEM(t, keys[0]), "k2": publicKeyPEM(t, keys[1])})
	})
	expect(t, s.post(t, "alice", "/api/v2/update", next), http.StatusOK, "success")
	expect(t, s.post(t, "bob", "/api/v2/update-manifest", next), http.StatusOK, "success") // answer "lost"

	stranger, _ := newUserCert(t, "stranger")
	fake := impostor(t, s.f.users["alice"].cert)
	for name, hc := range map[string]*http.Client{
		"anonymous": s.c.client(nil, nil), "stranger": s.c.client(nil, &stranger), "impostor": s.c.client(nil, &fake),
	} {
		if r := do(t, hc, http.MethodGet, s.c.url(path), nil); r.HTTPStatus != http.StatusUnauthorized {
			t.Errorf("%s: answer %d %s", name, r.HTTPStatus, r.Raw)
		}
	}
	expect(t, do(t, s.clients["carol"], http.MethodGet, s.c.url(path), nil), http.StatusForbidden, "fail")
	// Only GET, and no v1 twin.
	expect(t, do(t, s.clients["alice"], http.MethodPost, s.c.url(path), nil), http.StatusMethodNotAllowed, "fail")
	expectV1(t, do(t, s.clients["alice"], http.MethodGet, s.c.url("/recover/secrets"), nil), http.StatusNotFound, "error")

	r := do(t, s.clients["bob"], http.MethodGet, s.c.url(path), nil)
	expect(t, r, http.StatusOK, "success")
	var got struct {
		RecoverySecrets map[string][]byte `json:"recoverySecrets"`
	}
	decode(t, r, &got)
	if len(got.RecoverySecrets) != 2 {
		t.Fatalf("recovery secrets %s", r.Data)
	}
	plain := map[string][]byte{}
	for i, name := range []string{"k1", "k2"} {
		p, err := rsa.DecryptOAEP(sha256.New(), nil, keys[i], got.RecoverySecrets[name], nil)
		if err != nil {
			t.Fatalf("decrypting %s: %v", name, err)
		}
		plain[name] = p
	}
	// The same secrets again, and after a restart (they are sealed).
	s.c.restart()
	r2 := do(t, s.clients["alice"], http.MethodGet, s.c.url(path), nil)
	expect(t, r2, http.StatusOK, "success")
	if string(r2.Data) != string(r.Data) {
		t.Fatalf("the secrets changed: %s, then %s", r.Data, r2.Data)
	}

	// Recovery mode: the state cannot be read, 409; the fetched secrets
	// recover it.
	s.c.kill()
	os.Remove(filepath.Join(s.c.sealDir, "sealed_key"))
	s.c.start()
	expectState(t, s.c, s.c.client(nil, nil), 1, msgRecovery)
	expect(t, do(t, s.clients["alice"], http.MethodGet, s.c.url(path), nil), http.StatusConflict, "fail")
	for i, name := range []string{"k1", "k2"} {
		expect(t, postRecover(t, s.c, plain[name], sign(t, keys[i], plain[name])), http.StatusOK, "success")
	}
	expectState(t, s.c, s.c.client(nil, nil), 3, msgRunning)
	checkManifest(t, s.c, s.c.client(root, nil), root, next)

	// An update that changes the keys: the fetch serves the new secrets,
	// those of the answer.
	third := s.newManifest(t, func(f *fixture) {
		f.set("RecoveryKeys", map[string]any{"k3": publicKeyPEM(t, keys[2])})
	})
	expect(t, s.post(t, "alice", "/api/v2/update", third), http.StatusOK, "success")
	ack := s.post(t, "bob", "/api/v2/update-manifest", third)
	expect(t, ack, http.StatusOK, "success")
	var applied updateData
	decode(t, ack, &applied)
	r3 := do(t, s.clients["alice"], http.MethodGet, s.c.url(path), nil)
	expect(t, r3, http.StatusOK, "success")
	got.RecoverySecrets = nil
	decode(t, r3, &got)
	if len(got.RecoverySecrets) != 1 || string(got.RecoverySecrets["k3"]) != string(applied.RecoverySecrets["k3"]) {
		t.Fatalf("after the update: %s; the update answered %v", r3.Data, applied.RecoverySecrets)
	}

	// State 2: no manifest, no users.
	empty := startCoordinator(t, "")
	alice := s.f.users["alice"].cert
	expect(t, do(t, empty.client(nil, &alice), http.MethodGet, empty.url("/api/v2/recover/secrets"), nil), http.StatusConflict, "fail")
}
