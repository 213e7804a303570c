package admission

import "sync"

// Gate bounds the requests in progress from one source. A request over
// the bound is refused at once (Enter returns false), never queued: a
// source that sends more cannot make others wait.
type Gate struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// NewGate bounds each source to max requests at once (0: no bound).
func NewGate(max int) *Gate { return &Gate{max: max, n: map[string]int{}} }

// Max is the bound per source (0: none).
func (g *Gate) Max() int { return g.max }

// Enter admits one request of src, unless src has max in progress. Every
// admitted request must Leave.
func (g *Gate) Enter(src string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.max > 0 && g.n[src] >= g.max {
		return false
	}
	g.n[src]++
	return true
}

// Leave ends one request of src.
func (g *Gate) Leave(src string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n[src] <= 1 {
		delete(g.n, src)
		return
	}
	g.n[src]--
}

// InProgress is the number of requests of src in progress.
func (g *Gate) InProgress(src string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n[src]
}
