package metrics

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
)

// blockingEvents is an EventSource whose ActivationEvents waits until
// release is closed, counting the callers.
type blockingEvents struct {
	mu      sync.Mutex
	callers int
	release chan struct{}
}

func (b *blockingEvents) ActivationEvents() ([]core.ActivationEvent, uint64) {
	b.mu.Lock()
	b.callers++
	b.mu.Unlock()
	<-b.release
	return nil, 0
}

func (b *blockingEvents) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.callers
}

// TestEventsBusy: with MaxEventsRequests answers under way, a further
// /events request gets 503 at once; when they end, /events answers again.
func TestEventsBusy(t *testing.T) {
	f := &fakeCoordinator{state: core.StateAcceptingMarbles}
	src := &blockingEvents{release: make(chan struct{})}
	h := Handler(New(f, Options{SkipProcessCollectors: true}).Registry(), src, NewProbe(f, false), nil)
	var wg sync.WaitGroup
	for range MaxEventsRequests {
		wg.Go(func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/events", nil))
			if w.Code != http.StatusOK {
				t.Errorf("a held request: %d", w.Code)
			}
		})
	}
	for deadline := time.Now().Add(5 * time.Second); src.count() < MaxEventsRequests; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests reached the events", src.count())
		}
	}
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/events", nil))
		done <- w
	}()
	select {
	case w := <-done:
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "busy") {
			t.Fatalf("a request while busy: %d %v %q, want 503 with Retry-After", w.Code, w.Header(), w.Body)
		}
	case <-time.After(3 * time.Second):
		close(src.release)
		t.Fatal("a request while busy waited instead of getting 503")
	}
	close(src.release)
	wg.Wait()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/events", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("after the held requests ended: %d", w.Code)
	}
}

// TestEventsStreamed: /events to clients that do not read holds little
// memory: the answer (here 80 MiB of JSON) is encoded event by event
// into the connection, not built whole first.
func TestEventsStreamed(t *testing.T) {
	quote := make([]byte, 150<<10) // one backing array for every event
	evs := make([]core.ActivationEvent, 400)
	for i := range evs {
		evs[i] = core.ActivationEvent{Time: time.Now(), MarbleType: "m", UUID: fmt.Sprint(i), Quote: quote}
	}
	f := &fakeCoordinator{state: core.StateAcceptingMarbles, events: evs}
	srv := httptest.NewServer(Handler(New(f, Options{SkipProcessCollectors: true}).Registry(), f, NewProbe(f, false), nil))
	defer srv.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var conns []net.Conn
	for range MaxEventsRequests {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
		conns = append(conns, c)
	}
	time.Sleep(time.Second) // the handlers run until the connections stall
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 32<<20 {
		t.Fatalf("two unread /events answers grew the heap by %d MiB", grown>>20)
	}
	// The answer starts as it should for a client that reads.
	c := conns[0]
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The body is not closed (that would read it to its end); the
	// connection is.
	head := make([]byte, 64)
	if _, err := io.ReadFull(resp.Body, head); err != nil || resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(head), `[{"time":`) {
		t.Fatalf("/events: %d %q %v", resp.StatusCode, head, err)
	}
}
