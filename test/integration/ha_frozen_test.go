package integration

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// writeResult is one secret upload of a writer loop.
type writeResult struct {
	start, end time.Time
	code       int // 0: no answer
}

// writerLoop uploads unique secret values through addr one after the other
// until stop is closed, and returns every result.
func writerLoop(alice tls.Certificate, addr func() string, stop <-chan struct{}) []writeResult {
	hc := newHTTPClient(&http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{alice}, MinVersion: tls.VersionTLS12}}, 10*time.Second)
	var out []writeResult
	for i := 0; ; i++ {
		select {
		case <-stop:
			return out
		default:
		}
		v := fmt.Sprintf("frozen-w%06d-", i)
		body, _ := json.Marshal(map[string]any{"secrets": map[string]any{"userkey": map[string]any{"key": []byte(v + strings.Repeat("x", 32-len(v)))}}})
		r := writeResult{start: time.Now()}
		resp, err := hc.Post("https://"+addr()+"/api/v2/secrets", "application/json", bytes.NewReader(body))
		if err == nil {
			r.code = resp.StatusCode
			resp.Body.Close()
		}
		r.end = time.Now()
		out = append(out, r)
		if r.code != http.StatusOK {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// freezeFigures sums up the writes that started within [from, to): how
// many were acknowledged, the answers that were not 200, the slowest
// acknowledged write and the longest time without an acknowledgement.
type freezeFigures struct {
	acked   int
	failed  map[int]int
	slowest time.Duration
	longest time.Duration
}

func figuresOf(rs []writeResult, from, to time.Time) freezeFigures {
	f := freezeFigures{failed: map[int]int{}}
	last := from
	for _, r := range rs {
		if r.start.Before(from) || !r.start.Before(to) {
			continue
		}
		if r.code != http.StatusOK {
			f.failed[r.code]++
			continue
		}
		f.acked++
		f.slowest = max(f.slowest, r.end.Sub(r.start))
		f.longest = max(f.longest, r.end.Sub(last))
		last = r.end
	}
	f.longest = max(f.longest, to.Sub(last))
	return f
}

// TestHAFrozenEtcdMember: a coordinator writes without pause to a
// three-member etcd cluster of real processes while one member is frozen
// (SIGSTOP), first a follower, then the leader. A frozen follower must not
// be noticed at all (every write acknowledged, none slow); a frozen leader
// stops writes only until the others elected a new one, and nothing ends
// in a 500 or without an answer. docs/ha.md, "A frozen etcd member".
func TestHAFrozenEtcdMember(t *testing.T) {
	procs := etcdtest.StartProcs(t, 3, etcdtest.ProcOptions{Binary: os.Getenv(etcdtest.BinaryEnv)})
	env := haEnv(procs.Endpoints(), newPrefix())
	c := startCoordinator(t, "", env...)
	manifest, alice := linManifest(t)
	r := do(t, c.client(nil, nil), http.MethodPost, c.url("/api/v2/manifest"), map[string]any{"manifest": manifest})
	expect(t, r, http.StatusOK, "success")

	stop := make(chan struct{})
	var results []writeResult
	var wg sync.WaitGroup
	wg.Go(func() { results = writerLoop(alice, func() string { return c.addr }, stop) })

	const freeze = 4 * time.Second
	type window struct {
		what     string
		from, to time.Time
	}
	var windows []window
	time.Sleep(2 * time.Second)
	for _, role := range []string{"follower", "leader"} {
		leader := procs.Leader()
		if leader < 0 {
			close(stop)
			wg.Wait()
			t.Fatal("the etcd cluster has no leader")
		}
		victim := leader
		if role == "follower" {
			victim = (leader + 1) % procs.Size()
		}
		from := time.Now()
		procs.Freeze(victim)
		time.Sleep(freeze)
		procs.Thaw(victim)
		windows = append(windows, window{fmt.Sprintf("%s (member %d) frozen", role, victim), from, time.Now()})
		if err := procs.WaitHealthy(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	close(stop)
	wg.Wait()

	for _, code := range []int{0, http.StatusInternalServerError} {
		if n := slices.IndexFunc(results, func(r writeResult) bool { return r.code == code }); n >= 0 {
			t.Errorf("a write got HTTP %d (0: no answer within 10 s) at %v", code, results[n].start.Sub(results[0].start).Round(time.Millisecond))
		}
	}
	for i, w := range windows {
		f := figuresOf(results, w.from, w.to)
		t.Logf("%s for %v: %d writes acknowledged, not acknowledged %v, slowest acknowledged %v, longest stall %v",
			w.what, freeze, f.acked, f.failed, f.slowest.Round(time.Millisecond), f.longest.Round(time.Millisecond))
		if f.acked < 10 {
			t.Errorf("%s: only %d writes acknowledged in %v: writes stalled", w.what, f.acked, freeze)
		}
		if i == 0 {
			// A frozen follower gets no requests: nothing fails, nothing waits.
			if len(f.failed) > 0 {
				t.Errorf("%s: writes not acknowledged: %v (HTTP status: count)", w.what, f.failed)
			}
			if f.longest > 1500*time.Millisecond {
				t.Errorf("%s: writes stalled for %v", w.what, f.longest)
			}
			continue
		}
		// A frozen leader: an election (0.5–1 s here), then the client
		// finds the new leader within a probe.
		if f.longest > 4*time.Second {
			t.Errorf("%s: writes stalled for %v", w.what, f.longest)
		}
		for code := range f.failed {
			if code != http.StatusServiceUnavailable {
				t.Errorf("%s: a write got HTTP %d", w.what, code)
			}
		}
	}
}
