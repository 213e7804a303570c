package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"
)

// TestKillDuringFirstManifest SIGKILLs the Coordinator at a random moment
// while its first manifest is being set (its key file is written beside
// the state being built, docs/sealing.md). A restart is never in recovery
// mode: it waits for a manifest (nothing was stored, and setting the
// manifest again works) or runs with that manifest, and it runs with it
// whenever the request was answered 200 before the kill.
func TestKillDuringFirstManifest(t *testing.T) {
	t.Parallel()
	raw := newFixture(t).bytes(t)
	body, err := json.Marshal(map[string][]byte{"manifest": raw})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	t.Logf("kill delays from seed %d", seed)
	states := map[int]int{}
	for i := range 10 {
		c := startCoordinator(t, "")
		hc := c.client(nil, nil)
		expectState(t, c, hc, 2, msgReady) // the connection is open
		answered := make(chan int, 1)      // the HTTP status, 0: none
		go func() {
			resp, err := hc.Post(c.url("/api/v2/manifest"), "application/json", bytes.NewReader(body))
			if err != nil {
				answered <- 0
				return
			}
			resp.Body.Close()
			answered <- resp.StatusCode
		}()
		time.Sleep(time.Duration(rng.Int64N(int64(15 * time.Millisecond))))
		c.kill()
		code := <-answered
		hc.CloseIdleConnections()
		c.start()
		s := getStatus(t, c, hc)
		states[s.Code]++
		switch s.Code {
		case 3:
			r := do(t, hc, http.MethodGet, c.url("/api/v2/manifest"), nil)
			expect(t, r, http.StatusOK, "success")
			var m manifestData
			decode(t, r, &m)
			if m.Fingerprint != hex.EncodeToString(sum[:]) {
				t.Fatalf("kill %d: a restart runs with manifest %s, not the one set", i, m.Fingerprint)
			}
		case 2:
			if code == http.StatusOK {
				t.Fatalf("kill %d: the manifest was acknowledged, but a restart waits for one\n%s", i, c.Logs())
			}
			expect(t, setManifest(t, c, hc, raw), http.StatusOK, "success")
		default:
			t.Fatalf("kill %d (answer %d): a restart is in state %d %q\n%s", i, code, s.Code, s.Message, c.Logs())
		}
		c.kill()
	}
	t.Logf("states after the restarts: %v", states)
}
