package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// RunConfig says how Run drives a server.
type RunConfig struct {
	// Connections is the number of concurrent clients. Each has one
	// keep-alive connection of its own (HTTP/2: a transport limited to one
	// connection), so there are exactly this many connections; more are
	// opened only to replace ones that failed or that the server closed.
	Connections int
	// Duration is the measured time; Warmup runs before it, not counted.
	Duration, Warmup time.Duration
	// HTTP2 selects HTTP/2 (negotiated by ALPN) instead of HTTP/1.1.
	HTTP2 bool
	// TLS is the client TLS configuration (server verification, client
	// certificate). It is cloned for each connection.
	TLS *tls.Config
	// Timeout bounds each request (with HTTP/2: the wait for the response
	// headers); 0 means no limit other than the end of the run.
	Timeout time.Duration
}

// Request is the request a scenario repeats. Only body-less requests are
// repeated, so one *http.Request per client can be sent again and again.
type Request struct {
	Method string
	URL    string
}

// RunResult is what Run measured in the Duration after the warm-up. A request
// counts when its response (or transport error) arrives within that window;
// requests still in flight at its end are cancelled and not counted.
type RunResult struct {
	Requests    int64         // responses received (any status)
	Non2xx      int64         // responses with a status outside 200-299
	Errors      int64         // transport errors (no complete response)
	Bytes       int64         // response body bytes
	Elapsed     time.Duration // the measured window
	Latency     Latency       // over all responses, whatever their status
	Connections int64         // connections opened (TCP), warm-up included
	Protocol    string        // protocol of the responses, e.g. "HTTP/1.1"
	FirstError  string        // one example of an error or non-2xx status
}

// workerResult is one client's share, merged after the run so that the
// clients share nothing while they send.
type workerResult struct {
	lat                   []time.Duration
	non2xx, errors, bytes int64
	proto, firstErr       string
}

// Run sends req from cfg.Connections clients for cfg.Warmup+cfg.Duration.
func Run(ctx context.Context, cfg RunConfig, req Request) (RunResult, error) {
	if cfg.Connections < 1 {
		return RunResult{}, errors.New("at least one connection is needed")
	}
	if cfg.Duration <= 0 || cfg.Warmup < 0 {
		return RunResult{}, errors.New("the duration must be positive and the warm-up not negative")
	}
	var dials atomic.Int64
	from := time.Now().Add(cfg.Warmup)
	to := from.Add(cfg.Duration)
	runCtx, cancel := context.WithDeadline(ctx, to)
	defer cancel()
	clients := make([]client, cfg.Connections)
	for i := range clients {
		c, err := newClient(runCtx, cfg, req, to, &dials)
		if err != nil {
			return RunResult{}, err
		}
		clients[i] = c
	}
	results := make([]workerResult, cfg.Connections)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			results[i] = work(runCtx, c, from, to)
			c.close()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return RunResult{}, err
	}

	return combine(results, cfg.Duration, dials.Load()), nil
}

// combine adds up the workers' results of one run.
func combine(results []workerResult, elapsed time.Duration, connections int64) RunResult {
	res := RunResult{Elapsed: elapsed, Connections: connections}
	n := 0
	for _, w := range results {
		n += len(w.lat)
	}
	all := make([]time.Duration, 0, n)
	for _, w := range results {
		all = append(all, w.lat...)
		res.Non2xx += w.non2xx
		res.Errors += w.errors
		res.Bytes += w.bytes
		if res.Protocol == "" {
			res.Protocol = w.proto
		}
		if res.FirstError == "" {
			res.FirstError = w.firstErr
		}
	}
	res.Requests = int64(len(all))
	res.Latency = Summarize(all)
	return res
}

// work is one client's loop.
func work(ctx context.Context, c client, from, to time.Time) workerResult {
	w := workerResult{lat: make([]time.Duration, 0, 4096)}
	for {
		start := time.Now()
		if !start.Before(to) || ctx.Err() != nil {
			return w
		}
		// The start of a failed answer's body (the JSend message) says
		// why; it is kept only until one failure is described.
		x, err := c.exchange(start, w.firstErr == "")
		end := time.Now()
		if end.After(to) || ctx.Err() != nil {
			return w // cut off by the end of the run
		}
		if w.proto == "" {
			w.proto = x.proto
		}
		if end.Before(from) {
			continue // warm-up
		}
		if err != nil {
			w.errors++
			if w.firstErr == "" {
				w.firstErr = err.Error()
			}
			continue
		}
		w.lat = append(w.lat, end.Sub(start))
		w.bytes += x.bytes
		if !is2xx(x.status) {
			w.non2xx++
			if w.firstErr == "" {
				w.firstErr = fmt.Sprintf("HTTP %d: %s", x.status, strings.TrimSpace(string(x.head)))
			}
		}
	}
}

func is2xx(status int) bool { return status >= 200 && status <= 299 }

// client sends one request again and again over its own connection.
type client interface {
	// exchange sends the request (at start) and reads the whole response;
	// wantHead asks for the first bytes of the body if the status is not
	// 2xx.
	exchange(start time.Time, wantHead bool) (exchange, error)
	close()
}

// exchange is what a client learnt from one response.
type exchange struct {
	status int
	bytes  int64  // body bytes
	head   []byte // start of a non-2xx body, if asked for
	proto  string
}

// headBytes is how much of a body exchange keeps when asked.
const headBytes = 200

// readResponse reads and closes resp's body.
func readResponse(resp *http.Response, wantHead bool) (exchange, error) {
	x := exchange{status: resp.StatusCode, proto: resp.Proto}
	var err error
	if wantHead && !is2xx(resp.StatusCode) {
		x.head, err = io.ReadAll(io.LimitReader(resp.Body, headBytes))
		x.bytes = int64(len(x.head))
	}
	if err == nil {
		var n int64
		n, err = io.Copy(io.Discard, resp.Body)
		x.bytes += n
	}
	resp.Body.Close()
	return x, err
}

// newClient returns the client of one worker: HTTP/1.1 written and read on a
// TLS connection of its own (as wrk does: no connection pool, no goroutines
// besides the worker's), or for HTTP/2 a net/http transport limited to one
// connection.
func newClient(ctx context.Context, cfg RunConfig, req Request, end time.Time, dials *atomic.Int64) (client, error) {
	r, err := http.NewRequestWithContext(ctx, req.Method, req.URL, nil)
	if err != nil {
		return nil, err
	}
	if r.URL.Scheme != "https" {
		return nil, fmt.Errorf("%s: only https URLs are supported", req.URL)
	}
	r.Header.Set("User-Agent", userAgent)
	if cfg.HTTP2 {
		return &transportClient{t: newTransport(cfg, dials), req: r}, nil
	}
	var wire bytes.Buffer
	if err := r.Write(&wire); err != nil {
		return nil, err
	}
	tlsCfg := &tls.Config{}
	if cfg.TLS != nil {
		tlsCfg = cfg.TLS.Clone()
	}
	tlsCfg.NextProtos = []string{"http/1.1"}
	addr := r.URL.Host
	if r.URL.Port() == "" {
		addr = net.JoinHostPort(r.URL.Hostname(), "443")
	}
	if tlsCfg.ServerName == "" {
		tlsCfg.ServerName = r.URL.Hostname()
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}, Config: tlsCfg}
	return &h1Client{
		ctx:     ctx,
		req:     r,
		wire:    wire.Bytes(),
		timeout: cfg.Timeout,
		end:     end,
		br:      bufio.NewReaderSize(nil, 16<<10),
		dial: func(ctx context.Context) (net.Conn, error) {
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				dials.Add(1)
			}
			return conn, err
		},
	}, nil
}

const userAgent = "quarry-bench"

// h1Client is an HTTP/1.1 keep-alive client on one TLS connection. The
// request is encoded once; responses are parsed by http.ReadResponse. A
// failed exchange or a "Connection: close" answer closes the connection and
// the next exchange opens a new one.
type h1Client struct {
	ctx     context.Context
	req     *http.Request // for http.ReadResponse
	wire    []byte        // the encoded request
	timeout time.Duration
	end     time.Time // no wait lasts beyond it
	br      *bufio.Reader
	dial    func(context.Context) (net.Conn, error)

	conn     net.Conn
	stopWake func() bool
}

func (c *h1Client) exchange(start time.Time, wantHead bool) (exchange, error) {
	if c.conn == nil {
		conn, err := c.dial(c.ctx)
		if err != nil {
			return exchange{}, err
		}
		c.conn = conn
		c.br.Reset(conn)
		// Wake a blocked read or write when the run is cancelled.
		c.stopWake = context.AfterFunc(c.ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	}
	deadline := c.end
	if c.timeout > 0 && start.Add(c.timeout).Before(deadline) {
		deadline = start.Add(c.timeout)
	}
	c.conn.SetDeadline(deadline)
	if _, err := c.conn.Write(c.wire); err != nil {
		c.close()
		return exchange{}, err
	}
	resp, err := http.ReadResponse(c.br, c.req)
	if err != nil {
		c.close()
		return exchange{}, err
	}
	x, err := readResponse(resp, wantHead)
	if err != nil || resp.Close {
		c.close()
	}
	return x, err
}

func (c *h1Client) close() {
	if c.conn != nil {
		c.stopWake()
		c.conn.Close()
		c.conn = nil
	}
}

// transportClient sends through a net/http transport (used for HTTP/2).
type transportClient struct {
	t   *http.Transport
	req *http.Request // reused: a RoundTripper does not change it
}

func (c *transportClient) exchange(_ time.Time, wantHead bool) (exchange, error) {
	resp, err := c.t.RoundTrip(c.req)
	if err != nil {
		return exchange{}, err
	}
	return readResponse(resp, wantHead)
}

func (c *transportClient) close() { c.t.CloseIdleConnections() }

// newTransport returns a transport that holds at most one connection and
// counts the connections it opens in dials (if not nil).
func newTransport(cfg RunConfig, dials *atomic.Int64) *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err == nil && dials != nil {
				dials.Add(1)
			}
			return conn, err
		},
		MaxIdleConns:          1,
		MaxIdleConnsPerHost:   1,
		MaxConnsPerHost:       1,
		DisableCompression:    true, // as wrk: no Accept-Encoding
		ResponseHeaderTimeout: cfg.Timeout,
		TLSHandshakeTimeout:   10 * time.Second,
		Protocols:             new(http.Protocols),
	}
	if cfg.TLS != nil {
		t.TLSClientConfig = cfg.TLS.Clone()
	}
	if cfg.HTTP2 {
		t.Protocols.SetHTTP2(true)
	} else {
		t.Protocols.SetHTTP1(true)
	}
	return t
}
