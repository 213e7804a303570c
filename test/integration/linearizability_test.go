package integration

import (
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
	haMaxOps   = flag.Int("ha.maxops", 4000, "at most this many operations per client in TestLinearizability")
)

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
	svnNext  atomic.Int64

	mu  sync.Mutex
	ops []porcupine.Operation
	// answers counts outcomes by operation and HTTP status (0: no answer).
	answers map[string]int
	// latencies of acknowledged writes and answered reads.
	writeLat, readLat []time.Duration
}

func (r *linRun) now() int64 { return int64(time.Since(r.t0)) }

func (r *linRun) record(op porcupine.Operation, in mInput, out mOutput, lat time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
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
	addr, up := n.address()
	if !up {
		return 0, jsend{}
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, "https://"+addr+path, rd)
	if err != nil {
		return 0, jsend{}
	}
	resp, err := hc.Do(req)
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return -1, jsend{} // never sent (the instance is down): not recorded
	}
	if err != nil {
		return 0, jsend{}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var env jsend
	if err != nil || json.Unmarshal(raw, &env) != nil {
		return 0, jsend{}
	}
	return resp.StatusCode, env
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
	r.record(porcupine.Operation{ClientId: c.id, Input: in, Call: call, Output: out, Return: ret, Metadata: fmt.Sprintf("instance %d, HTTP %d", ni, code)}, in, out, lat)
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

// loop runs the client until the deadline or its operation budget: first
// the manifest (retried until definite: set by this client or another),
// then a random mix of writes and reads through random instances.
func (c *linClient) loop(deadline time.Time, maxOps int) {
	for time.Now().Before(deadline) {
		out := c.do(c.pick(), mInput{Op: opSetManifest})
		if !out.Unknown {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for ops := 0; ops < maxOps && time.Now().Before(deadline); ops++ {
		var in mInput
		switch p := c.rng.IntN(100); {
		case p < 30:
			c.writes++
			// unique per client and write; 32 bytes for the 256-bit key
			v := fmt.Sprintf("c%02d-w%06d-", c.id, c.writes)
			in = mInput{Op: opSetSecret, Secret: c.rng.IntN(len(modelSecrets)), Value: v + strings.Repeat("x", 32-len(v))}
		case p < 40:
			n := c.run.svnNext.Add(1)
			if c.rng.IntN(4) == 0 {
				n = max(1, n-int64(1+c.rng.IntN(3))) // probably a downgrade: refused
			}
			in = mInput{Op: opSetSVN, SVN: int(n)}
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

// linFaults says which faults the run injects.
type linFaults struct {
	etcd    *etcdtest.Cluster // stop and restart members (one at a time: quorum stays)
	minUp   int               // coordinators kept running
	restart []time.Duration   // filled: time from start() to listening after a SIGKILL
}

// runLinearizability drives the workload against nodes for d while the
// test goroutine injects faults, then checks the history.
func runLinearizability(t *testing.T, name string, nodes []*haNode, seed uint64, d time.Duration, faults *linFaults) {
	manifest, alice := linManifest(t)
	r := &linRun{nodes: nodes, t0: time.Now(), manifest: manifest, alice: alice, answers: map[string]int{}}
	r.svnNext.Store(modelInitialSVN)
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	clients := make([]*linClient, *haClients)
	for i := range clients {
		tr := func(cert []tls.Certificate) *http.Client {
			return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: cert, MinVersion: tls.VersionTLS12}}}
		}
		clients[i] = &linClient{id: i, run: r, rng: rand.New(rand.NewPCG(seed, uint64(i+1))),
			hc: tr([]tls.Certificate{alice}), anon: tr(nil)}
		wg.Go(func() { clients[i].loop(deadline, *haMaxOps) })
	}

	// Faults, from the test goroutine (starting a process may t.Fatal).
	rng := rand.New(rand.NewPCG(seed, 0))
	downUntil := make([]time.Time, len(nodes))
	var etcdDown = -1
	var etcdUntil time.Time
	kills, etcdStops := 0, 0
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
		now := time.Now()
		for i, n := range nodes {
			if _, up := n.address(); !up && now.After(downUntil[i]) {
				start := time.Now()
				n.c.start()
				faults.restart = append(faults.restart, time.Since(start))
				n.setUp(true)
			}
		}
		if etcdDown >= 0 && now.After(etcdUntil) {
			if err := faults.etcd.Restart(etcdDown); err != nil {
				t.Fatalf("restarting etcd member %d: %v", etcdDown, err)
			}
			etcdDown = -1
		}
		switch p := rng.IntN(100); {
		case p < 10: // SIGKILL a coordinator for 0.2–1.5 s
			up := 0
			for _, n := range nodes {
				if _, ok := n.address(); ok {
					up++
				}
			}
			i := rng.IntN(len(nodes))
			if _, ok := nodes[i].address(); ok && up > faults.minUp {
				nodes[i].setUp(false)
				nodes[i].c.kill()
				downUntil[i] = now.Add(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
				kills++
			}
		case p < 18 && faults.etcd != nil && etcdDown < 0: // stop an etcd member for 0.5–3 s
			etcdDown = rng.IntN(faults.etcd.Size())
			faults.etcd.Stop(etcdDown)
			etcdUntil = now.Add(time.Duration(500+rng.IntN(2500)) * time.Millisecond)
			etcdStops++
		}
	}
	wg.Wait()
	// Everything back up for the final reads.
	if etcdDown >= 0 {
		if err := faults.etcd.Restart(etcdDown); err != nil {
			t.Fatalf("restarting etcd member %d: %v", etcdDown, err)
		}
	}
	for _, n := range nodes {
		if _, up := n.address(); !up {
			n.c.start()
			n.setUp(true)
		}
	}
	load := time.Since(r.t0)

	// Final reads through every instance (retried until answered): they
	// join the history, and no acknowledged write may be missing from them.
	final := &linClient{id: len(clients), run: r, hc: clients[0].hc, anon: clients[0].anon}
	finalValues := make([][len(modelSecrets)]string, len(nodes))
	finalLog := make([]int, len(nodes))
	for ni := range nodes {
		for si := range modelSecrets {
			finalValues[ni][si] = final.mustRead(t, ni, mInput{Op: opGetSecret, Secret: si}).Value
		}
		finalLog[ni] = final.mustRead(t, ni, mInput{Op: opGetLog}).LogLen
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

	unknown := 0
	for _, op := range ops {
		if op.Output.(mOutput).Unknown {
			unknown++
		}
	}
	ops, patched := patchUnknown(ops, finalLog[0])
	start := time.Now()
	res, viz, err := checkHistory(ops, time.Minute)
	t.Logf("%s: seed %d: %d operations in %v (%d of unknown outcome; %s), %d SIGKILLs, %d etcd member stops; porcupine: %s in %v",
		name, seed, len(ops), load.Round(time.Millisecond), unknown, patched, kills, etcdStops, res, time.Since(start).Round(time.Millisecond))
	t.Logf("%s: answers %v", name, answers)
	logFigures(t, name, r, load)
	if res == porcupine.Unknown {
		t.Fatalf("%s: porcupine did not finish within a minute (replay with -ha.seed %d; fewer operations: -ha.maxops); visualization: %s %v", name, seed, viz, err)
	}
	if res != porcupine.Ok {
		t.Fatalf("%s: the history is not linearizable (%s; replay with -ha.seed %d); visualization: %s %v", name, res, seed, viz, err)
	}
}

// patchUnknown narrows writes of unknown outcome (as etcd's robustness
// tests do), so that the check stays fast; both steps are sound:
//   - a secret write whose unique value a read returned took effect before
//     that read returned: its return time becomes the earliest such read's;
//   - the final update log (read after all faults, the same at every
//     instance) has one entry per applied change: if the acknowledged
//     changes and the observed unknown ones account for all of them, no
//     other unknown write took effect, and those are dropped.
//
// Otherwise the unknown writes stay open until infinity.
func patchUnknown(ops []porcupine.Operation, finalLog int) ([]porcupine.Operation, string) {
	firstSeen := map[string]int64{}
	acked := 0
	for _, op := range ops {
		in, out := op.Input.(mInput), op.Output.(mOutput)
		if in.Op == opGetSecret && !out.Unknown && out.Value != "" {
			if r, ok := firstSeen[out.Value]; !ok || op.Return < r {
				firstSeen[out.Value] = op.Return
			}
		}
		if (in.Op == opSetSecret || in.Op == opSetSVN) && out.OK && !out.Unknown {
			acked++
		}
	}
	observed, open := 0, 0
	for i, op := range ops {
		in, out := op.Input.(mInput), op.Output.(mOutput)
		if !out.Unknown || in.Op != opSetSecret {
			continue
		}
		if r, ok := firstSeen[in.Value]; ok {
			ops[i].Return = max(r, op.Call)
			ops[i].Output = mOutput{Unknown: true, HTTP: out.HTTP}
			observed++
		}
	}
	for _, op := range ops {
		if op.Output.(mOutput).Unknown && op.Return == unknownReturn && op.Input.(mInput).Op != opSetManifest {
			open++
		}
	}
	if open == 0 || finalLog != modelLogAfterManifest+acked+observed {
		return ops, fmt.Sprintf("%d bounded by a read, %d left open", observed, open)
	}
	kept := ops[:0]
	for _, op := range ops {
		if !(op.Output.(mOutput).Unknown && op.Return == unknownReturn && op.Input.(mInput).Op != opSetManifest) {
			kept = append(kept, op)
		}
	}
	return kept, fmt.Sprintf("%d bounded by a read, %d not applied per the final log, dropped", observed, open)
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
// cluster; concurrent clients write and read through random instances while
// instances are SIGKILLed and restarted and etcd members stopped and
// restarted; the recorded history must be linearizable (porcupine) and no
// acknowledged write may be lost.
func TestLinearizability(t *testing.T) {
	seed := linSeed(t)
	cluster := etcdtest.Start(t, 3)
	env := haEnv(cluster.Endpoints(), newPrefix())
	nodes := make([]*haNode, 3)
	for i := range nodes {
		nodes[i] = &haNode{c: startCoordinator(t, "", env...)}
		nodes[i].setUp(true)
	}
	faults := &linFaults{etcd: cluster, minUp: 1}
	runLinearizability(t, "etcd, 3 instances", nodes, seed, *haDuration, faults)
	logRestart(t, faults)
}

// TestLinearizabilityFileStore: the same workload and check on one
// coordinator with the file store, SIGKILLed and restarted.
func TestLinearizabilityFileStore(t *testing.T) {
	seed := linSeed(t)
	nodes := []*haNode{{c: startCoordinator(t, "")}}
	nodes[0].setUp(true)
	faults := &linFaults{minUp: 0}
	runLinearizability(t, "file store, 1 instance", nodes, seed, max(5*time.Second, *haDuration/4), faults)
	logRestart(t, faults)
}

func logRestart(t *testing.T, f *linFaults) {
	if len(f.restart) == 0 {
		return
	}
	s := slices.Clone(f.restart)
	slices.Sort(s)
	t.Logf("a SIGKILLed instance serves again after: median %v, max %v (%d restarts)", s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}
