package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

var (
	haDuration = flag.Duration("ha.duration", 15*time.Second, "how long TestLinearizability's etcd run drives load and faults (the file-store run takes a quarter)")
	haSeed     = flag.Uint64("ha.seed", 0, "seed of TestLinearizability's random choices (0: from the clock; the seed is logged)")
	haClients  = flag.Int("ha.clients", 5, "concurrent clients in TestLinearizability")
	haMaxOps   = flag.Int("ha.maxops", 100000, "at most this many operations per client in TestLinearizability")
	// The done-when fault run (TestHAChaos).
	haChaos      = flag.Duration("ha.chaos", 20*time.Second, "how long TestHAChaos injects faults before the all-kill and the quorum loss")
	haQuorumLoss = flag.Duration("ha.quorumloss", 10*time.Second, "how long TestHAChaos keeps two of the three etcd members down")
)

// haMaxDBBytes bounds each etcd member's database after a run: Quarry
// compacts etcd's history behind its commits (docs/ha.md, "Compaction").
const haMaxDBBytes = 48 << 20

// haNode is one coordinator process whose address the fault loop changes
// (a restarted process listens on a new port) while clients use it.
type haNode struct {
	c  *coordinator
	mu sync.Mutex
	up bool
	// addr is the Client API address while up.
	addr string
	// upSince is when the node last came up (for the figures).
	upSince time.Time
}

func (n *haNode) address() (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.addr, n.up
}

func (n *haNode) setUp(up bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.up = up
	if up {
		n.addr, n.upSince = n.c.addr, time.Now()
	}
}

// linRun is one run of the workload: the instances, the shared clock and
// the recorded history.
type linRun struct {
	nodes []*haNode
	t0    time.Time
	// manifest is the manifest every client tries to set first.
	manifest []byte
	alice    tls.Certificate
	// stop ends the clients' loops.
	stop chan struct{}

	svnMu   sync.Mutex
	svnTop  int
	svnUsed map[int]bool

	// rootChecked / rootErrs: the roots every instance presented right
	// after the manifest was set (checkRoots).
	rootChecked atomic.Int32
	// setBy is 1 + the instance that acknowledged the manifest (0: none).
	setBy    atomic.Int32
	rootErrs []string

	mu  sync.Mutex
	ops []porcupine.Operation
	// answers counts outcomes by operation and HTTP status (0: no answer).
	answers map[string]int
	// latencies of acknowledged writes and answered reads.
	writeLat, readLat []time.Duration
	// calls: every request sent, with its answer (for the quorum loss).
	calls []linCall
}

// linCall is one request sent and its answer.
type linCall struct {
	in         mInput
	start, end time.Time
	code       int // 0: no answer
	node       int
	why        string // why there was no answer
}

// nextSVN returns a security version no client sent before: mostly the
// next upgrade (1, 5, 9, … : 1 mod 4), else one below the newest (never 1
// mod 4), which the Coordinator must refuse when the version has passed
// it. Unique values let the checker find each update in the update log.
func (r *linRun) nextSVN(rng *rand.Rand) int {
	r.svnMu.Lock()
	defer r.svnMu.Unlock()
	if rng.IntN(4) == 0 && r.svnTop > 8 {
		for range 8 {
			v := r.svnTop - 4*(1+rng.IntN(3)) + 1 + rng.IntN(3)
			if v > modelInitialSVN && !r.svnUsed[v] {
				r.svnUsed[v] = true
				return v
			}
		}
	}
	r.svnTop += 4
	r.svnUsed[r.svnTop] = true
	return r.svnTop
}

func (r *linRun) now() int64 { return int64(time.Since(r.t0)) }

func (r *linRun) record(op porcupine.Operation, in mInput, out mOutput, lat time.Duration, node int, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := time.Now()
	r.calls = append(r.calls, linCall{in: in, start: end.Add(-lat), end: end, code: out.HTTP, node: node, why: why})
	r.answers[fmt.Sprintf("%s %d", in.Op, out.HTTP)]++
	if out.Unknown {
		if in.Op == opStatus || in.Op == opGetSecret || in.Op == opGetLog {
			return // a read without an answer constrains nothing
		}
		op.Return = unknownReturn
	}
	if !out.Unknown {
		switch in.Op {
		case opStatus, opGetSecret, opGetLog:
			r.readLat = append(r.readLat, lat)
		default:
			if out.OK {
				r.writeLat = append(r.writeLat, lat)
			}
		}
	}
	r.ops = append(r.ops, op)
}

// linClient is one concurrent client: its own connections, random source
// and id.
type linClient struct {
	id     int
	run    *linRun
	rng    *rand.Rand
	hc     *http.Client // alice's certificate, any server certificate
	anon   *http.Client // no client certificate (the manifest)
	writes int
	why    string // why the last call had no answer
}

// jsend is the answer's envelope.
type jsend struct {
	Status  string          `json:"status"`
	Data    json.RawMessage `json:"data"`
	Message string          `json:"message"`
}

// call sends one request to node n and returns the HTTP status (0 without
// an answer) and the envelope.
func (c *linClient) call(hc *http.Client, n *haNode, method, path string, body []byte) (int, jsend) {
	code, env, why := c.send(hc, n, method, path, body)
	c.why = why
	return code, env
}

// send is call, also saying why there was no answer.
func (c *linClient) send(hc *http.Client, n *haNode, method, path string, body []byte) (int, jsend, string) {
	addr, up := n.address()
	if !up {
		return 0, jsend{}, "the instance is not up"
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, "https://"+addr+path, rd)
	if err != nil {
		return 0, jsend{}, err.Error()
	}
	resp, err := hc.Do(req)
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return -1, jsend{}, "" // never sent (the instance is down): not recorded
	}
	if err != nil {
		return 0, jsend{}, err.Error()
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20)) // the update log grows with the run
	var env jsend
	if err != nil || json.Unmarshal(raw, &env) != nil {
		return 0, jsend{}, fmt.Sprintf("HTTP %d, body unreadable: %v", resp.StatusCode, err)
	}
	return resp.StatusCode, env, ""
}

// do runs one operation against node index ni and records it.
func (c *linClient) do(ni int, in mInput) mOutput {
	r := c.run
	n := r.nodes[ni]
	if _, up := n.address(); !up {
		return mOutput{Unknown: true} // not sent: not recorded
	}
	start := time.Now()
	call := r.now()
	var code int
	var env jsend
	switch in.Op {
	case opSetManifest:
		body, _ := json.Marshal(map[string]any{"manifest": r.manifest})
		code, env = c.call(c.anon, n, http.MethodPost, "/api/v2/manifest", body)
	case opStatus:
		code, env = c.call(c.hc, n, http.MethodGet, "/api/v2/status", nil)
	case opSetSecret:
		body, _ := json.Marshal(map[string]any{"secrets": map[string]any{modelSecrets[in.Secret]: map[string]any{"key": []byte(in.Value)}}})
		code, env = c.call(c.hc, n, http.MethodPost, "/api/v2/secrets", body)
	case opGetSecret:
		code, env = c.call(c.hc, n, http.MethodGet, "/api/v2/secrets?"+url.Values{"s": {modelSecrets[in.Secret]}}.Encode(), nil)
	case opSetSVN:
		b, _ := json.Marshal(map[string]any{"Packages": map[string]any{"backend": map[string]any{"SecurityVersion": in.SVN}}})
		body, _ := json.Marshal(map[string]any{"manifest": b})
		code, env = c.call(c.hc, n, http.MethodPost, "/api/v2/update", body)
	case opGetLog:
		code, env = c.call(c.hc, n, http.MethodGet, "/api/v2/update", nil)
	}
	ret := r.now()
	lat := time.Since(start)
	if code < 0 {
		return mOutput{Unknown: true}
	}
	out := mOutput{HTTP: code}
	switch {
	case code == 0 || code >= 500:
		// No answer, a timeout, a lost connection or 503: the write may
		// or may not have happened.
		out.Unknown = true
	case code == http.StatusOK:
		out.OK = true
		if err := decodeRead(in, env.Data, &out); err != nil {
			out = mOutput{Unknown: true, HTTP: code}
		}
	default:
		out.OK = false
	}
	r.record(porcupine.Operation{ClientId: c.id, Input: in, Call: call, Output: out, Return: ret, Metadata: fmt.Sprintf("instance %d, HTTP %d", ni, code)}, in, out, lat, ni, c.why)
	return out
}

// decodeRead fills the read fields of out from a success answer.
func decodeRead(in mInput, data json.RawMessage, out *mOutput) error {
	switch in.Op {
	case opStatus:
		var d struct {
			Status int `json:"status"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return err
		}
		out.Status = d.Status
	case opGetSecret:
		var d struct {
			Secrets map[string]v2Secret `json:"secrets"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return err
		}
		s, ok := d.Secrets[modelSecrets[in.Secret]]
		if !ok {
			return fmt.Errorf("secret %s missing", modelSecrets[in.Secret])
		}
		out.Value = string(s.Private)
	case opGetLog:
		var d struct {
			UpdateLog []string `json:"updateLog"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return err
		}
		out.LogLen = len(d.UpdateLog)
		out.Log = d.UpdateLog
	}
	return nil
}

// pick returns a random node that is up (or any node if none is).
func (c *linClient) pick() int {
	order := c.rng.Perm(len(c.run.nodes))
	for _, i := range order {
		if _, up := c.run.nodes[i].address(); up {
			return i
		}
	}
	return order[0]
}

func (c *linClient) stopped() bool {
	select {
	case <-c.run.stop:
		return true
	default:
		return false
	}
}

// loop runs the client until the run stops or its operation budget ends:
// first the manifest (retried until definite: set by this client or
// another; the client that set it checks every instance's root), then a
// random mix of writes and reads through random instances.
func (c *linClient) loop(maxOps int) {
	for !c.stopped() {
		ni := c.pick()
		out := c.do(ni, mInput{Op: opSetManifest})
		if out.OK {
			c.run.setBy.Store(int32(ni) + 1)
			c.run.checkRoots(ni)
		}
		if !out.Unknown {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for ops := 0; ops < maxOps && !c.stopped(); ops++ {
		var in mInput
		switch p := c.rng.IntN(100); {
		case p < 30:
			c.writes++
			// unique per client and write; 32 bytes for the 256-bit key
			v := fmt.Sprintf("c%02d-w%06d-", c.id, c.writes)
			in = mInput{Op: opSetSecret, Secret: c.rng.IntN(len(modelSecrets)), Value: v + strings.Repeat("x", 32-len(v))}
		case p < 40:
			in = mInput{Op: opSetSVN, SVN: c.run.nextSVN(c.rng)}
		case p < 70:
			in = mInput{Op: opGetSecret, Secret: c.rng.IntN(len(modelSecrets))}
		case p < 85:
			in = mInput{Op: opGetLog}
		default:
			in = mInput{Op: opStatus}
		}
		out := c.do(c.pick(), in)
		if out.Unknown {
			time.Sleep(time.Duration(20+c.rng.IntN(80)) * time.Millisecond)
		}
	}
}

// linManifest is the fixture's manifest with a second user-defined secret.
func linManifest(t *testing.T) ([]byte, tls.Certificate) {
	f := newFixture(t)
	f.set("Secrets.k2", map[string]any{"Type": "symmetric-key", "Size": 256, "UserDefined": true})
	f.set("Roles.reader.ResourceNames", []string{"symkey", "cert", "userkey", "k2"})
	f.set("Roles.writer.ResourceNames", []string{"userkey", "k2"})
	return f.bytes(t), f.users["alice"].cert
}

// rootOf opens a new TLS connection to addr (so that the handshake picks
// its certificate now), sends GET /api/v2/status over it and returns the
// last certificate of the chain presented and the answer's status.
func rootOf(addr string, cert tls.Certificate) ([]byte, int, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second},
		Config: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, 0, err
	}
	conn := nc.(*tls.Conn)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	chain := conn.ConnectionState().PeerCertificates
	if len(chain) == 0 {
		return nil, 0, errors.New("no certificate presented")
	}
	if _, err := io.WriteString(conn, "GET /api/v2/status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"); err != nil {
		return nil, 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, 0, err
	}
	resp.Body.Close()
	return chain[len(chain)-1].Raw, resp.StatusCode, nil
}

// checkRoots: right after instance ni acknowledged the manifest, a new
// connection to every instance that runs must present the manifest's root
// (docs/ha.md: every TLS handshake brings the instance up to the stored
// state first). A handshake whose sync failed presents the old root, but
// then every request over it gets 503: only connections whose request was
// answered 200 count.
func (r *linRun) checkRoots(ni int) {
	// An instance that is down (SIGKILLed by the fault plan, restarting)
	// is waited for a while: with one instance, that is the only one.
	root := func(n *haNode) ([]byte, bool) {
		for range 50 {
			addr, up := n.address()
			if !up {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			raw, code, err := rootOf(addr, r.alice)
			if err == nil && code == http.StatusOK {
				return raw, true
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil, false
	}
	want, ok := root(r.nodes[ni])
	if !ok {
		return
	}
	for i, n := range r.nodes {
		got, ok := root(n)
		if !ok {
			continue
		}
		r.rootChecked.Add(1)
		if !bytes.Equal(got, want) {
			r.mu.Lock()
			r.rootErrs = append(r.rootErrs, fmt.Sprintf("instance %d presents another root than instance %d, which set the manifest", i, ni))
			r.mu.Unlock()
		}
	}
}

// linPlan says which faults a run injects, in which phases.
type linPlan struct {
	procs *etcdtest.Procs // etcd members to crash, stop and freeze (one at a time); nil: none
	minUp int             // coordinators kept running during the chaos
	// chaos is how long clients run while faults are injected.
	chaos time.Duration
	// allKill: then SIGKILL every coordinator at once and start them again.
	allKill bool
	// quorumLoss: then keep two etcd members down (one killed, one
	// frozen) for this long.
	quorumLoss time.Duration
	// quiet: then run the clients without faults for this long.
	quiet time.Duration

	// filled by the run
	restart    []time.Duration // time from start() to listening after a SIGKILL
	etcdFaults map[string]int
	kills      int
	qlFrom     time.Time // the quorum loss
	qlTo       time.Time
}

// etcdFault is one etcd member down.
type etcdFault struct {
	member int // -1: none
	kind   string
	until  time.Time
}

func (p *linPlan) inject(t *testing.T, rng *rand.Rand, now time.Time) etcdFault {
	m := rng.IntN(p.procs.Size())
	kind := [...]string{"SIGKILL", "SIGTERM", "SIGSTOP"}[rng.IntN(3)]
	switch kind {
	case "SIGKILL":
		p.procs.Kill(m)
	case "SIGTERM":
		p.procs.Term(m)
	default:
		p.procs.Freeze(m)
	}
	p.etcdFaults[kind]++
	return etcdFault{member: m, kind: kind, until: now.Add(time.Duration(500+rng.IntN(2500)) * time.Millisecond)}
}

func (p *linPlan) repair(t *testing.T, f etcdFault) {
	if f.member < 0 {
		return
	}
	if err := p.procs.Restart(f.member); err != nil {
		t.Fatalf("restarting etcd member %d after %s: %v", f.member, f.kind, err)
	}
}

// allHealthy reports whether every etcd member runs with a leader.
func (p *linPlan) allHealthy() bool {
	for i := range p.procs.Size() {
		if !p.procs.Healthy(i) {
			return false
		}
	}
	return true
}

// runLinearizability drives the workload against nodes while the test
// goroutine injects the plan's faults, then checks the history.
func runLinearizability(t *testing.T, name string, nodes []*haNode, seed uint64, plan *linPlan) *linRun {
	manifest, alice := linManifest(t)
	r := &linRun{nodes: nodes, t0: time.Now(), manifest: manifest, alice: alice, answers: map[string]int{},
		stop: make(chan struct{}), svnTop: modelInitialSVN, svnUsed: map[int]bool{}}
	plan.etcdFaults = map[string]int{}
	var wg sync.WaitGroup
	clients := make([]*linClient, *haClients)
	for i := range clients {
		tr := func(cert []tls.Certificate) *http.Client {
			return newHTTPClient(&http.Transport{
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: cert, MinVersion: tls.VersionTLS12}}, 5*time.Second)
		}
		clients[i] = &linClient{id: i, run: r, rng: rand.New(rand.NewPCG(seed, uint64(i+1))),
			hc: tr([]tls.Certificate{alice}), anon: tr(nil)}
		wg.Go(func() { clients[i].loop(*haMaxOps) })
	}
	upCount := func() int {
		up := 0
		for _, n := range nodes {
			if _, ok := n.address(); ok {
				up++
			}
		}
		return up
	}
	startNode := func(n *haNode) {
		start := time.Now()
		n.c.start()
		plan.restart = append(plan.restart, time.Since(start))
		n.setUp(true)
	}

	// Faults, from the test goroutine (starting a process may t.Fatal).
	rng := rand.New(rand.NewPCG(seed, 0))
	downUntil := make([]time.Time, len(nodes))
	down := etcdFault{member: -1}
	chaosEnd := time.Now().Add(plan.chaos)
	for time.Now().Before(chaosEnd) {
		time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
		now := time.Now()
		for i, n := range nodes {
			if _, up := n.address(); !up && now.After(downUntil[i]) {
				startNode(n)
			}
		}
		if down.member >= 0 && now.After(down.until) {
			plan.repair(t, down)
			down = etcdFault{member: -1}
		}
		switch p := rng.IntN(100); {
		case p < 10: // SIGKILL a coordinator for 0.2–1.5 s
			i := rng.IntN(len(nodes))
			if _, ok := nodes[i].address(); ok && upCount() > plan.minUp {
				nodes[i].setUp(false)
				nodes[i].c.kill()
				downUntil[i] = now.Add(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
				plan.kills++
			}
		case p < 20 && plan.procs != nil && down.member < 0 && plan.allHealthy():
			// one etcd member crashed, stopped or frozen for 0.5–3 s
			down = plan.inject(t, rng, now)
		}
	}
	plan.repair(t, down)
	for _, n := range nodes {
		if _, up := n.address(); !up {
			startNode(n)
		}
	}
	if plan.allKill {
		for _, n := range nodes {
			n.setUp(false)
			n.c.kill()
		}
		plan.kills += len(nodes)
		time.Sleep(500 * time.Millisecond)
		for _, n := range nodes {
			startNode(n)
		}
	}
	if plan.quorumLoss > 0 {
		if err := plan.procs.WaitHealthy(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		a := rng.IntN(plan.procs.Size())
		b := (a + 1 + rng.IntN(plan.procs.Size()-1)) % plan.procs.Size()
		plan.qlFrom = time.Now()
		plan.procs.Kill(a)
		plan.procs.Freeze(b)
		time.Sleep(plan.quorumLoss)
		plan.qlTo = time.Now()
		plan.procs.Thaw(b)
		if err := plan.procs.Restart(a); err != nil {
			t.Fatalf("restarting etcd member %d after the quorum loss: %v", a, err)
		}
		if err := plan.procs.WaitHealthy(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(plan.quiet)
	close(r.stop)
	wg.Wait()
	if plan.procs != nil {
		if err := plan.procs.WaitHealthy(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	load := time.Since(r.t0)

	// Final reads through every instance (retried until answered): they
	// join the history, and no acknowledged write may be missing from them.
	final := &linClient{id: len(clients), run: r, hc: clients[0].hc, anon: clients[0].anon}
	finalValues := make([][len(modelSecrets)]string, len(nodes))
	finalLog := make([]int, len(nodes))
	var finalEntries []linLogEntry
	var finalRet int64
	for ni := range nodes {
		for si := range modelSecrets {
			finalValues[ni][si] = final.mustRead(t, ni, mInput{Op: opGetSecret, Secret: si}).Value
		}
		out := final.mustRead(t, ni, mInput{Op: opGetLog})
		finalLog[ni] = out.LogLen
		if ni == 0 {
			entries, err := parseLog(out.Log)
			if err != nil {
				t.Fatal(err)
			}
			finalEntries, finalRet = entries, r.now()
		}
		if s := final.mustRead(t, ni, mInput{Op: opStatus}).Status; s != 3 {
			t.Errorf("instance %d ends in state %d", ni, s)
		}
	}

	r.mu.Lock()
	ops := slices.Clone(r.ops)
	answers := r.answers
	r.mu.Unlock()
	checkNoLostWrite(t, ops, finalValues, finalLog)
	for ni := range finalLog {
		if finalLog[ni] != finalLog[0] {
			t.Errorf("instance %d ends with %d update-log entries, instance 0 with %d", ni, finalLog[ni], finalLog[0])
		}
	}
	for _, e := range checkLog(ops, finalEntries) {
		t.Errorf("%s: update log: %s (replay with -ha.seed %d)", name, e, seed)
	}

	unknown := 0
	for _, op := range ops {
		if op.Output.(mOutput).Unknown {
			unknown++
		}
	}
	checked, nw := narrow(ops, finalEntries, finalRet)
	start := time.Now()
	res, viz, err := checkHistory(checked, 5*time.Minute)
	t.Logf("%s: seed %d: %d operations in %v (%d of unknown outcome; %s), %d coordinator SIGKILLs, etcd member faults %v; porcupine: %s on %d operations in %v",
		name, seed, len(ops), load.Round(time.Millisecond), unknown, nw, plan.kills, plan.etcdFaults, res, len(checked), time.Since(start).Round(time.Millisecond))
	t.Logf("%s: answers %v", name, answers)
	logFigures(t, name, r, load)
	if res == porcupine.Unknown {
		t.Fatalf("%s: porcupine did not finish within 5 minutes (replay with -ha.seed %d); visualization: %s %v", name, seed, viz, err)
	}
	if res != porcupine.Ok {
		t.Fatalf("%s: the history is not linearizable (%s; replay with -ha.seed %d); visualization: %s %v", name, res, seed, viz, err)
	}
	if r.rootChecked.Load() == 0 {
		// No instance answered within the wait right after the set (the
		// faults of that moment: an instance killed, etcd's leader
		// stopped), or the answer to the set was lost: the roots are
		// checked now, with every instance up and running the manifest
		// (the final reads), against the one that set it if known.
		t.Logf("%s: no root checked right after the manifest was set; checking the roots after the run", name)
		r.checkRoots(max(int(r.setBy.Load())-1, 0))
	}
	if c := r.rootChecked.Load(); c == 0 {
		t.Errorf("%s: no instance's root was checked after the manifest was set", name)
	}
	for _, e := range r.rootErrs {
		t.Errorf("%s: %s", name, e)
	}
	t.Logf("%s: after the manifest set, %d new connections to the instances presented the manifest's root", name, r.rootChecked.Load())
	return r
}

// mustRead reads through node ni until it answers (instances may still be
// reconnecting after the faults).
func (c *linClient) mustRead(t *testing.T, ni int, in mInput) mOutput {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := c.do(ni, in)
		if !out.Unknown && out.OK {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %d does not answer %s 30 s after the faults ended (HTTP %d)", ni, in.Op, out.HTTP)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkNoLostWrite: every instance's final value of a secret is the value of
// an acknowledged write or a later one (a write not acknowledged before the
// last acknowledged write began), and the update log holds at least one
// entry per acknowledged change.
func checkNoLostWrite(t *testing.T, ops []porcupine.Operation, finalValues [][len(modelSecrets)]string, finalLog []int) {
	t.Helper()
	writes := map[string]porcupine.Operation{}
	acked := 0
	for _, op := range ops {
		in, out := op.Input.(mInput), op.Output.(mOutput)
		if in.Op == opSetSecret {
			writes[in.Value] = op
		}
		if (in.Op == opSetSecret || in.Op == opSetSVN) && out.OK && !out.Unknown {
			acked++
		}
	}
	for ni, vals := range finalValues {
		for si, v := range vals {
			w, ok := writes[v]
			if !ok || w.Input.(mInput).Secret != si {
				t.Errorf("instance %d: %s = %q, not a value any client wrote", ni, modelSecrets[si], v)
				continue
			}
			for _, op := range ops {
				in, out := op.Input.(mInput), op.Output.(mOutput)
				if in.Op == opSetSecret && in.Secret == si && out.OK && !out.Unknown && w.Return < op.Call {
					t.Errorf("instance %d: %s = %q, older than the acknowledged write of %q: lost", ni, modelSecrets[si], v, in.Value)
					break
				}
			}
		}
		if finalLog[ni] < modelLogAfterManifest+acked {
			t.Errorf("instance %d: update log has %d entries, fewer than the %d acknowledged changes and the manifest", ni, finalLog[ni], acked)
		}
	}
}

// logFigures logs latencies and throughput (never asserted).
func logFigures(t *testing.T, name string, r *linRun, load time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		s := slices.Clone(d)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[int(float64(len(s)-1)*p)].Round(10 * time.Microsecond)
	}
	t.Logf("%s: acknowledged writes %d: median %v, p90 %v; answered reads %d (%.0f/s over the run with %d clients): median %v",
		name, len(r.writeLat), pct(r.writeLat, 0.5), pct(r.writeLat, 0.9), len(r.readLat), float64(len(r.readLat))/load.Seconds(), *haClients, pct(r.readLat, 0.5))
}

// linSeed returns the run's seed and logs it.
func linSeed(t *testing.T) uint64 {
	seed := *haSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test ./test/integration -run '%s$' -ha.seed %d)", seed, t.Name(), seed)
	return seed
}

// TestLinearizability: three coordinator processes on a three-member etcd
// cluster of real processes; concurrent clients write and read through
// random instances while instances are SIGKILLed and restarted and etcd
// members crashed (SIGKILL), stopped (SIGTERM) or frozen (SIGSTOP) one at
// a time; the recorded history must be linearizable (porcupine) and no
// acknowledged write may be lost.
func TestLinearizability(t *testing.T) {
	// Not parallel: like TestHAChaos, it holds fault timing against a steady load.
	seed := linSeed(t)
	procs := etcdtest.StartProcs(t, 3, etcdtest.ProcOptions{Binary: os.Getenv(etcdtest.BinaryEnv)})
	env := haEnv(procs.Endpoints(), newPrefix())
	nodes := make([]*haNode, 3)
	for i := range nodes {
		nodes[i] = &haNode{c: startRaceCoordinator(t, "", env...)}
		nodes[i].setUp(true)
	}
	plan := &linPlan{procs: procs, minUp: 1, chaos: *haDuration, quiet: time.Second}
	runLinearizability(t, "etcd, 3 instances", nodes, seed, plan)
	logRestart(t, plan)
	checkDBSize(t, procs)
}

// TestHAChaos is the fault run of docs/ha.md ("The fault run"): three etcd
// processes and three coordinators; -ha.chaos of SIGKILLed coordinators
// and one etcd member at a time crashed, stopped or frozen; then every
// coordinator SIGKILLed at once and started again; then -ha.quorumloss
// with two etcd members down (one crashed, one frozen); then a few seconds
// without faults. Besides the checks of TestLinearizability: no answer is
// 500, every request sent while the quorum is lost is answered 503 within
// the store timeout (and a little), and each etcd member's database size
// is at most haMaxDBBytes.
func TestHAChaos(t *testing.T) {
	// Not parallel: its load loop must keep sending through the quorum loss, which a loaded machine starves.
	seed := linSeed(t)
	procs := etcdtest.StartProcs(t, 3, etcdtest.ProcOptions{Binary: os.Getenv(etcdtest.BinaryEnv)})
	env := haEnv(procs.Endpoints(), newPrefix())
	nodes := make([]*haNode, 3)
	for i := range nodes {
		nodes[i] = &haNode{c: startRaceCoordinator(t, "", env...)}
		nodes[i].setUp(true)
	}
	plan := &linPlan{procs: procs, minUp: 1, chaos: *haChaos, allKill: true, quorumLoss: *haQuorumLoss, quiet: 3 * time.Second}
	r := runLinearizability(t, "fault run", nodes, seed, plan)
	logRestart(t, plan)

	// No 500 at any time; 503 while the quorum is lost. The first
	// requests of the loss may still wait for a write under way (the
	// write's own timeout, then its read-back's): requests sent from two
	// store timeouts and a second on are held to the bound of one store
	// timeout. Over a new connection the TLS handshake waits for a sync
	// first, and the request after it is refused at once because that
	// sync just failed (docs/ha.md); the test allows a second over the
	// store timeout for the handshakes themselves under -race and counts
	// the answers over half a second more.
	const storeTimeout = 2 * time.Second // the default --store-timeout
	grace := plan.qlFrom.Add(2*storeTimeout + time.Second)
	var slowest, slowestLate time.Duration
	n503, late, overOne := 0, 0, 0
	for _, c := range r.calls {
		if c.code == http.StatusInternalServerError {
			t.Errorf("%s at %v: HTTP 500", c.in.Op, c.start.Sub(r.t0).Round(time.Millisecond))
		}
		if c.start.Before(plan.qlFrom) || !c.end.Before(plan.qlTo) {
			continue
		}
		lat := c.end.Sub(c.start)
		if c.code == http.StatusServiceUnavailable {
			n503++
			slowest = max(slowest, lat)
		}
		if c.start.Before(grace) {
			continue
		}
		late++
		slowestLate = max(slowestLate, lat)
		switch {
		case c.code != http.StatusServiceUnavailable:
			t.Errorf("%s to instance %d sent %v into the quorum loss: HTTP %d after %v (%s), want 503", c.in.Op, c.node, c.start.Sub(plan.qlFrom).Round(time.Millisecond), c.code, lat.Round(time.Millisecond), c.why)
		case lat > storeTimeout+time.Second:
			t.Errorf("%s sent %v into the quorum loss: 503 after %v, want within the store timeout (%v, and 1 s for the handshake)", c.in.Op, c.start.Sub(plan.qlFrom).Round(time.Millisecond), lat.Round(time.Millisecond), storeTimeout)
		case lat > storeTimeout+500*time.Millisecond:
			overOne++
		}
	}
	if late == 0 && plan.quorumLoss > 2*storeTimeout+2*time.Second {
		t.Errorf("no request was sent during the quorum loss")
	}
	t.Logf("quorum lost for %v: %d answers 503, the slowest after %v; %d requests sent after the first %v, the slowest answered after %v, %d after more than the store timeout",
		plan.quorumLoss, n503, slowest.Round(time.Millisecond), late, grace.Sub(plan.qlFrom), slowestLate.Round(time.Millisecond), overOne)

	checkDBSize(t, procs)
}

// checkDBSize logs each etcd member's database size and fails above
// haMaxDBBytes.
func checkDBSize(t *testing.T, procs *etcdtest.Procs) {
	t.Helper()
	for i := range procs.Size() {
		st, err := procs.Status(i)
		if err != nil {
			t.Errorf("etcd member %d: %v", i, err)
			continue
		}
		t.Logf("etcd member %d: database %.1f MiB (%.1f MiB in use), revision %d", i, float64(st.DBSize)/(1<<20), float64(st.DBSizeInUse)/(1<<20), st.Revision)
		if st.DBSize > haMaxDBBytes {
			t.Errorf("etcd member %d: database of %.1f MiB, more than %d MiB", i, float64(st.DBSize)/(1<<20), haMaxDBBytes>>20)
		}
	}
}

// TestLinearizabilityFileStore: the same workload and check on one
// coordinator with the file store, SIGKILLed and restarted.
func TestLinearizabilityFileStore(t *testing.T) {
	t.Parallel()
	seed := linSeed(t)
	nodes := []*haNode{{c: startRaceCoordinator(t, "")}}
	nodes[0].setUp(true)
	plan := &linPlan{minUp: 0, chaos: max(5*time.Second, *haDuration/4), quiet: time.Second}
	runLinearizability(t, "file store, 1 instance", nodes, seed, plan)
	logRestart(t, plan)
}

func logRestart(t *testing.T, p *linPlan) {
	if len(p.restart) == 0 {
		return
	}
	s := slices.Clone(p.restart)
	slices.Sort(s)
	t.Logf("a SIGKILLed instance serves again after: median %v, max %v (%d restarts)", s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}
