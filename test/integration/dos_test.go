package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/loadgen"
)

// Sizes of TestClientAPIUnderDoS. The defaults keep it to seconds; the
// figures in docs/http.md and docs/limits.md come from
//
//	go test -run TestClientAPIUnderDoS -v ./test/integration -dos.conns 1000
var (
	dosConns   = flag.Int("dos.conns", 150, "TestClientAPIUnderDoS: hostile connections of each kind, all from 127.0.0.1")
	dosNofile  = flag.Int("dos.nofile", 512, "TestClientAPIUnderDoS: the Coordinator's RLIMIT_NOFILE (hard; the soft limit starts at half)")
	dosSources = flag.Int("dos.sources", 1, "TestClientAPIUnderDoS: hostile source addresses (1: 127.0.0.1; more: 127.0.1.1, 127.0.1.2, ...), the connections spread over them")
)

// Bounds of TestClientAPIUnderDoS.
const (
	dosPeakRSS      = 300 << 20   // the Coordinator's VmHWM
	dosRenewPause   = time.Second // before a hostile connection the server closed is opened again
	dosSetupWorkers = 64          // hostile connections being opened at once
)

// dosAnswerWithin bounds every measured request: a second for the
// Coordinator as deployed (coordinatorBin, the release build); three when
// the tests run with the race detector, as CI runs them: the measuring
// client is then instrumented too, and the two cores are shared with every
// other package's tests.
var dosAnswerWithin = map[bool]time.Duration{false: time.Second, true: 3 * time.Second}[raceEnabled]

// startCoordinatorNofile starts the Coordinator with a file descriptor
// limit: hard, with the soft limit at soft (children inherit the limits of
// the shell that execs the binary).
func startCoordinatorNofile(t *testing.T, soft, hard int, env ...string) *coordinator {
	t.Helper()
	c := &coordinator{t: t, sealDir: t.TempDir(), env: env, exited: make(chan struct{}),
		launcher: []string{"bash", "-c", fmt.Sprintf(`ulimit -Sn %d && ulimit -Hn %d && exec "$0" "$@"`, soft, hard)}}
	c.start()
	t.Cleanup(c.kill)
	return c
}

// hostileKind sets up one kind of hostile connection on a TCP connection
// to the Coordinator; the connection is then held.
type hostileKind struct {
	name  string
	setup func(conn net.Conn, i int) (net.Conn, error)
}

// hostileTLS is cheap for the attacker (no post-quantum key share), so that
// the test process leaves the cores to the Coordinator.
var hostileTLS = &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}, CurvePreferences: []tls.CurveID{tls.X25519}}

func handshake(conn net.Conn) (net.Conn, error) {
	tc := tls.Client(conn, hostileTLS)
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		return nil, err
	}
	tc.SetDeadline(time.Time{})
	return tc, nil
}

// hostileKinds are the connections an attacker holds: TCP without a TLS
// handshake, TLS without a request, a request's headers never finished,
// a body declared large of which one byte is sent (to the anonymous
// endpoints of paths, round robin), and idle keep-alive connections
// after one request.
func hostileKinds(paths ...string) []hostileKind {
	return []hostileKind{
		{"tcp-only", func(c net.Conn, _ int) (net.Conn, error) { return c, nil }},
		{"tls-no-request", func(c net.Conn, _ int) (net.Conn, error) { return handshake(c) }},
		{"partial-headers", func(c net.Conn, _ int) (net.Conn, error) {
			tc, err := handshake(c)
			if err != nil {
				return nil, err
			}
			_, err = io.WriteString(tc, "POST /api/v2/secrets HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Slow: a")
			return tc, err
		}},
		{"slow-body", func(c net.Conn, i int) (net.Conn, error) {
			tc, err := handshake(c)
			if err != nil {
				return nil, err
			}
			_, err = fmt.Fprintf(tc, "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
				paths[i%len(paths)], 1<<20)
			return tc, err
		}},
		{"idle-keepalive", func(c net.Conn, _ int) (net.Conn, error) {
			tc, err := handshake(c)
			if err != nil {
				return nil, err
			}
			if _, err := io.WriteString(tc, "GET /api/v2/status HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
				return nil, err
			}
			tc.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
			if err != nil {
				return nil, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			tc.SetReadDeadline(time.Time{})
			return tc, nil
		}},
	}
}

// hostiles holds n connections of each kind from the hostile sources (see
// -dos.sources) until stopped; a connection the Coordinator closes is
// opened again after a pause.
type hostiles struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ready  sync.WaitGroup

	mu      sync.Mutex
	opened  map[string]int            // set up (admitted at least as far as the kind goes)
	failed  map[string]int            // refused while being set up
	answers map[string]map[string]int // what the Coordinator answered before closing, by kind
}

func holdHostiles(t *testing.T, addr string, n int, kinds []hostileKind) *hostiles {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &hostiles{cancel: cancel, opened: map[string]int{}, failed: map[string]int{}, answers: map[string]map[string]int{}}
	sem := make(chan struct{}, dosSetupWorkers)
	dialers := []*net.Dialer{{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, Timeout: 5 * time.Second}}
	if *dosSources > 1 {
		dialers = nil
		for i := range *dosSources {
			dialers = append(dialers, &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, byte(1+i/250), byte(1+i%250))}, Timeout: 5 * time.Second})
		}
	}
	total := n * len(kinds)
	h.ready.Add(total)
	for i := range total { // round robin, so that every kind reaches the server
		kind := kinds[i%len(kinds)]
		dialer := dialers[i%len(dialers)]
		h.wg.Go(func() {
			first := true
			for ctx.Err() == nil {
				sem <- struct{}{}
				conn, err := dialer.DialContext(ctx, "tcp", addr)
				if err == nil {
					var held net.Conn
					if held, err = kind.setup(conn, i/len(kinds)); err != nil {
						conn.Close()
					} else {
						conn = held
					}
				}
				<-sem
				if first {
					h.ready.Done()
					first = false
				}
				h.count(kind.name, err == nil, "")
				if err == nil {
					h.hold(ctx, kind.name, conn)
				}
				select {
				case <-ctx.Done():
				case <-time.After(dosRenewPause):
				}
			}
		})
	}
	t.Cleanup(h.stop)
	return h
}

// hold waits until the server closes conn (recording the status of an
// answer it sent first) or ctx ends.
func (h *hostiles) hold(ctx context.Context, kind string, conn net.Conn) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	defer conn.Close()
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if ctx.Err() != nil {
		return
	}
	status := "closed"
	if f := strings.Fields(line); err == nil && len(f) >= 2 && strings.HasPrefix(f[0], "HTTP/") {
		status = f[1]
	}
	h.count(kind, true, status)
}

func (h *hostiles) count(kind string, ok bool, answer string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case answer != "":
		if h.answers[kind] == nil {
			h.answers[kind] = map[string]int{}
		}
		h.answers[kind][answer]++
	case ok:
		h.opened[kind]++
	default:
		h.failed[kind]++
	}
}

func (h *hostiles) answered(kind, status string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.answers[kind][status]
}

// awaitAnswer reports whether a connection of kind was answered status
// within d.
func (h *hostiles) awaitAnswer(kind, status string, d time.Duration) bool {
	for end := time.Now().Add(d); h.answered(kind, status) == 0; {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func (h *hostiles) stop() {
	h.cancel()
	h.wg.Wait()
}

func (h *hostiles) summary() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var kinds []string
	for k := range h.opened {
		kinds = append(kinds, k)
	}
	for k := range h.failed {
		if _, ok := h.opened[k]; !ok {
			kinds = append(kinds, k)
		}
	}
	sort.Strings(kinds)
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, "\n  %-15s set up %5d, refused %5d, answers %v", k, h.opened[k], h.failed[k], h.answers[k])
	}
	return b.String()
}

// clientFrom is an HTTPS client on its own connections from the loopback
// address src, presenting cert if given.
func clientFrom(src string, cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{InsecureSkipVerify: true}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	return newHTTPClient(&http.Transport{
		TLSClientConfig: cfg, DialContext: d.DialContext, DisableKeepAlives: true, ForceAttemptHTTP2: true,
	}, 30*time.Second)
}

// timedRequest sends one request on a new connection (TCP and TLS
// handshakes included) and returns its status, JSend body and duration.
func timedRequest(t *testing.T, hc *http.Client, method, url string, body any) (int, string, time.Duration) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, url, rd)
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v (after %s)", method, url, err, time.Since(start))
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return resp.StatusCode, string(raw), took
}

// expectWithin checks that a measured request succeeded within
// dosAnswerWithin and returns its duration.
func expectWithin(t *testing.T, what string, status int, body string, took time.Duration) time.Duration {
	t.Helper()
	if status != http.StatusOK {
		t.Fatalf("%s under attack: answer %d after %s: %s", what, status, took, body)
	}
	if took > dosAnswerWithin {
		t.Fatalf("%s under attack took %s, more than %s", what, took, dosAnswerWithin)
	}
	return took
}

// peakRSS reads the Coordinator's VmHWM.
func peakRSS(t *testing.T, c *coordinator) int64 {
	t.Helper()
	m, err := loadgen.ProcessMemory(c.cmd.Process.Pid)
	if err != nil {
		t.Fatalf("reading the Coordinator's memory: %v", err)
	}
	return m.Peak
}

// TestClientAPIUnderDoS holds -dos.conns hostile connections of each kind
// (TCP only, TLS without a request, unfinished headers, slow bodies, idle
// keep-alives) from 127.0.0.1 against a Coordinator whose file descriptor
// limit is -dos.nofile, fewer than the connections. Meanwhile, each from
// another loopback address and on a new connection: a user's secret upload
// and GET /api/v2/status (running), then, after the Coordinator is made to
// lose its key, GET /api/v2/status and the recovery upload (recovery mode)
// are each answered 200 within a second. The Coordinator's peak RSS stays
// under 300 MiB, its soft file descriptor limit is raised to the hard one
// and its connections capped below it (the log says so, and no file
// operation or accept fails for lack of descriptors), the anonymous
// sign-quote bodies are refused before they are read, and the slow
// recovery bodies are cut at the minimum rate (408).
func TestClientAPIUnderDoS(t *testing.T) {
	if *dosConns < 1 || *dosNofile < 128 || *dosSources < 1 || *dosSources > 1000 {
		t.Fatalf("-dos.conns %d, -dos.nofile %d, -dos.sources %d: want at least 1, 128 and 1 (at most 1000 sources)", *dosConns, *dosNofile, *dosSources)
	}
	nofile := *dosNofile
	c := startCoordinatorNofile(t, nofile/2, nofile, "QUARRY_CLIENT_BODY_GRACE=1s", "EDG_DEBUG_LOGGING=0")
	s := newRecoverySetupOn(t, c, 1, func(*fixture) {})
	alice := s.f.users["alice"].cert
	t.Logf("%d hostile connections of each kind from %d source address(es); RLIMIT_NOFILE %d (soft %d at start)", *dosConns, *dosSources, nofile, nofile/2)

	var log struct {
		Msg            string `json:"msg"`
		Limit          int    `json:"limit"`
		ClientMaxConns int    `json:"clientMaxConns"`
	}
	for _, line := range strings.Split(c.Logs(), "\n") {
		if json.Unmarshal([]byte(line), &log) == nil && strings.HasPrefix(log.Msg, "file descriptor limit") {
			break
		}
	}
	if log.Limit != nofile || log.Msg != "file descriptor limit raised to the hard limit" && log.Msg != "file descriptor limit" ||
		log.ClientMaxConns < 1 || log.ClientMaxConns >= nofile {
		t.Fatalf("the file descriptor limit is not logged as raised to %d with a connection cap below it: %+v\n%s", nofile, log, c.Logs())
	}

	// Running: a user's secret upload and the status.
	h := holdHostiles(t, c.addr, *dosConns, hostileKinds("/api/v2/sign-quote"))
	h.ready.Wait()
	var worst time.Duration
	for round := range 3 {
		key := make([]byte, 32)
		rand.Read(key)
		st, body, took := timedRequest(t, clientFrom("127.0.0.2", &alice), http.MethodPost, c.url("/api/v2/secrets"),
			map[string]any{"secrets": map[string]any{"userkey": map[string]any{"key": key}}})
		worst = max(worst, expectWithin(t, fmt.Sprintf("secret upload %d", round), st, body, took))
		st, body, took = timedRequest(t, clientFrom("127.0.0.3", nil), http.MethodGet, c.url("/api/v2/status"), nil)
		worst = max(worst, expectWithin(t, fmt.Sprintf("status %d", round), st, body, took))
	}
	if got := getSecrets(t, c, clientFrom("127.0.0.4", &alice), "userkey")["userkey"]; len(got.Private) != 32 {
		t.Fatal("the uploaded secret is not stored")
	}
	if !h.awaitAnswer("slow-body", "403", 5*time.Second) {
		t.Fatalf("no anonymous sign-quote body was refused before it was read:%s", h.summary())
	}
	h.stop()
	rssRunning := peakRSS(t, c)
	t.Logf("running: slowest measured request %s, peak RSS %.1f MiB; hostile connections:%s", worst.Round(time.Millisecond), float64(rssRunning)/(1<<20), h.summary())

	// Recovery mode: the status and the recovery upload.
	s.breakKey(t)
	h = holdHostiles(t, c.addr, *dosConns, hostileKinds("/api/v2/recover", "/api/v2/sign-quote"))
	h.ready.Wait()
	worst = 0
	for round := range 3 {
		st, body, took := timedRequest(t, clientFrom("127.0.0.3", nil), http.MethodGet, c.url("/api/v2/status"), nil)
		worst = max(worst, expectWithin(t, fmt.Sprintf("status in recovery mode %d", round), st, body, took))
		if !strings.Contains(body, `"code":1`) {
			t.Fatalf("not in recovery mode: %s", body)
		}
	}
	st, body, took := timedRequest(t, clientFrom("127.0.0.2", nil), http.MethodPost, c.url("/api/v2/recover"),
		map[string][]byte{"recoverySecret": s.secrets["key1"], "recoverySecretSignature": sign(t, s.keys["key1"], s.secrets["key1"])})
	worst = max(worst, expectWithin(t, "recovery upload", st, body, took))
	// The slow recovery bodies are cut once the grace (1s) has passed.
	if !h.awaitAnswer("slow-body", "408", 10*time.Second) {
		t.Fatalf("no slow recovery body was cut at the minimum rate:%s", h.summary())
	}
	h.stop()
	rssRecovery := peakRSS(t, c)
	t.Logf("recovery mode: slowest measured request %s, peak RSS %.1f MiB; hostile connections:%s", worst.Round(time.Millisecond), float64(rssRecovery)/(1<<20), h.summary())
	expectState(t, c, clientFrom("127.0.0.4", nil), 3, msgRunning)

	for _, rss := range []int64{rssRunning, rssRecovery} {
		if rss > dosPeakRSS {
			t.Errorf("peak RSS %.1f MiB, more than %d MiB", float64(rss)/(1<<20), dosPeakRSS>>20)
		}
	}
	if logs := c.Logs(); strings.Contains(logs, "too many open files") || strings.Contains(logs, `"status":500`) {
		t.Errorf("the Coordinator ran out of file descriptors or answered 500:\n%s", logs)
	}
}
