package rest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/internal/admission"
)

// Request bodies (docs/design/decisions.md#d13,
// docs/design/decisions.md#d16). Every body is read through
// decodeBody or readRawBody, bounded by a limit per endpoint, after the
// endpoint's cheap checks (state, feature, client certificate). The bytes a
// body may take while it is decoded are reserved from one memory budget as
// they arrive (never by the declared Content-Length); when the budget, or
// the share of it that one source address may hold, is taken the answer is
// 503 or 429 with Retry-After instead of more memory. A body must keep
// arriving at a minimum rate after a grace period, else it is cut (408).
// Whatever a handler leaves unread is drained after the answer, within
// bounds, so that the client (which may still be sending) receives the
// answer before the connection closes.

// decodeCost is the memory a body of n bytes is reckoned to take while it
// is decoded and used: the decoder's buffer (which grows by doubling), the
// decoded value (base64 shrinks by a quarter) and the parsed manifest.
func decodeCost(n int64) int64 { return 3 * n }

// DefaultBodyMemory is the memory budget of request bodies when none is
// configured.
const DefaultBodyMemory = 256 << 20

// Bounds of the drain of an unread body after the answer: at most
// drainTimeout, and at most drainMin bytes or twice the largest body limit,
// whichever is more. Draining costs no memory (the bytes are discarded),
// only the reading; a client that sends more, or more slowly, has its
// connection closed.
const (
	drainTimeout = 5 * time.Second
	drainMin     = 64 << 20
)

// Defaults of the minimum body rate (Options.MinBodyRate, BodyGrace).
const (
	DefaultMinBodyRate = 4 << 10
	DefaultBodyGrace   = 10 * time.Second
)

// memoryBudget bounds the bytes that request bodies being decoded may take
// at once, in all and per source address. A reservation that does not fit
// is refused at once: a request never waits for memory, so a flood cannot
// queue up.
type memoryBudget struct {
	mu       sync.Mutex
	size     int64
	share    int64 // most one source may hold (0: size)
	used     int64
	bySource map[string]int64
}

// newMemoryBudget returns a budget of at least size bytes that fits two
// requests of largest bytes (each from another source), one source holding
// at most a quarter of it or one such request, whichever is more: one
// source can never hold all of it.
func newMemoryBudget(size, largest int64) *memoryBudget {
	size = max(size, 2*largest)
	return &memoryBudget{size: size, share: max(size/4, largest), bySource: map[string]int64{}}
}

// tryReserve takes n bytes for src: errBusy when the budget is taken,
// errSourceBusy when src holds its share.
func (b *memoryBudget) tryReserve(src string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.share > 0 && b.bySource[src]+n > b.share {
		return errSourceBusy
	}
	if b.used+n > b.size {
		return errBusy
	}
	b.used += n
	b.bySource[src] += n
	return nil
}

func (b *memoryBudget) release(src string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.bySource[src] -= n; b.bySource[src] <= 0 {
		delete(b.bySource, src)
	}
}

// pace is the minimum rate of a body: after grace, at least rate bytes
// per second on average since the request arrived (0: no minimum), and the
// whole body within timeout of its arrival (0: no bound).
type pace struct {
	rate    int64
	grace   time.Duration
	timeout time.Duration
}

// requestBody wraps a request's body: it reserves memory for what arrives,
// keeps the read deadline at the minimum rate, counts what was read, and
// drains what the handler left unread.
type requestBody struct {
	io.ReadCloser
	req     *http.Request
	rc      *http.ResponseController
	budget  *memoryBudget
	src     string
	pace    pace
	arrived time.Time
	// byRate: the deadline set last is the minimum rate's (not the
	// timeout's).
	byRate   bool
	reserved int64
	read     int64
	eof      bool
	err      error // the first read error other than io.EOF
	refused  error // errBusy or errSourceBusy: the budget refused a read
}

func (b *requestBody) Read(p []byte) (int, error) {
	if b.refused != nil {
		return 0, b.refused
	}
	b.setDeadline()
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	if n > 0 && b.budget != nil {
		cost := decodeCost(int64(n))
		if rErr := b.budget.tryReserve(b.src, cost); rErr != nil {
			b.refused = rErr
			return 0, rErr
		}
		b.reserved += cost
	}
	switch {
	case err == io.EOF:
		b.eof = true
		// The whole body is here: no deadline for the rest of the
		// request (net/http's background read after the body must not
		// time out while the use case runs).
		b.rc.SetReadDeadline(time.Time{})
	case err != nil && b.err == nil:
		b.err = err
	}
	return n, err
}

// setDeadline sets the read deadline by which the next byte must arrive:
// when the body has been arriving at the minimum rate since the request
// came, and at the latest its timeout.
func (b *requestBody) setDeadline() {
	var dl time.Time
	if b.pace.rate > 0 {
		dl = b.arrived.Add(b.pace.grace + time.Duration(b.read*int64(time.Second)/b.pace.rate))
		b.byRate = true
	}
	if b.pace.timeout > 0 {
		if end := b.arrived.Add(b.pace.timeout); dl.IsZero() || end.Before(dl) {
			dl, b.byRate = end, false
		}
	}
	if !dl.IsZero() {
		b.rc.SetReadDeadline(dl)
	}
}

// end releases the memory reservation.
func (b *requestBody) end() {
	if b.budget != nil && b.reserved > 0 {
		b.budget.release(b.src, b.reserved)
		b.reserved = 0
	}
}

// drain flushes the answer to a request whose body was not read to its
// end, then, for HTTP/1.x, reads what is left, at most limit bytes and for
// at most drainTimeout. A client that sends its whole body before it reads
// the answer would otherwise see the connection reset, and lose the answer,
// when the server closes it with unread data. HTTP/2 needs only the flush
// (the answer's frames then precede the stream's reset; the connection
// stays); a client that waits for "100 Continue" and got none never sends
// the body. A body that failed (cut for its rate, broken) is not drained.
func (b *requestBody) drain(w http.ResponseWriter, limit int64) {
	r := b.req
	if b.eof || b.err != nil {
		return
	}
	rc := http.NewResponseController(w)
	if rc.Flush() != nil || r.ProtoMajor != 1 {
		return
	}
	if b.read == 0 && strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	rc.SetReadDeadline(time.Now().Add(drainTimeout))
	io.CopyN(io.Discard, b.ReadCloser, limit)
}

// bodyOf returns the wrapped body of r (nil outside the route table, as in
// unit tests).
func bodyOf(r *http.Request) *requestBody {
	b, _ := r.Body.(*requestBody)
	return b
}

// withBodies wraps every request's body (see requestBody) and drains what
// was left unread after the answer; maxBody is the largest body limit.
func withBodies(budget *memoryBudget, p pace, maxBody int64) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Body == nil || r.Body == http.NoBody {
				next.ServeHTTP(w, r)
				return
			}
			b := &requestBody{ReadCloser: r.Body, budget: budget, pace: p, arrived: time.Now(),
				src: admission.SourceOf(r.RemoteAddr), rc: http.NewResponseController(w)}
			r2 := *r
			r2.Body = b
			b.req = &r2
			defer b.end() // also after a panic
			next.ServeHTTP(w, &r2)
			// The answer is written: release the memory before the
			// client can see it, then drain.
			b.end()
			b.drain(w, max(drainMin, 2*maxBody))
		})
	}
}

// readError describes a failure to read the body itself (not its
// content): a malformed chunked encoding, a client that stopped sending.
func readError(r *http.Request, err error) error {
	b := bodyOf(r)
	if b != nil && b.refused != nil {
		return b.refused
	}
	if b != nil && b.err != nil {
		err = b.err
	}
	var ne interface{ Timeout() bool }
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		if b != nil && b.byRate {
			return &bodyError{timeout: true, msg: fmt.Sprintf(
				"request body too slow: after the first %s it must arrive at %d bytes per second or more, and %d bytes had arrived; send it faster",
				b.pace.grace, b.pace.rate, b.read)}
		}
		if b != nil && b.pace.timeout > 0 {
			return &bodyError{timeout: true, msg: fmt.Sprintf("request body too slow: it did not arrive within %s", b.pace.timeout)}
		}
		return &bodyError{timeout: true, msg: "request body too slow: it did not arrive in time"}
	}
	return &bodyError{msg: "invalid request: reading the body: " + err.Error()}
}

// decodeBody reads one JSON value from the request body, at most limit
// bytes, into v. Unknown members are ignored (as MarbleRun's clients may
// send extra ones); trailing data is rejected. The memory to decode it is
// reserved as the bytes arrive (errBusy or errSourceBusy when there is
// none).
func decodeBody(r *http.Request, limit int64, v any) error {
	body := http.MaxBytesReader(nil, r.Body, limit)
	dec := json.NewDecoder(body)
	err := dec.Decode(v)
	if err == nil {
		if _, tErr := dec.Token(); tErr != io.EOF {
			err = errTrailing
			if tErr != nil {
				err = tErr
			}
		}
	}
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooLarge):
		return &bodyError{tooLarge: true, msg: fmt.Sprintf("request body too large: the limit is %d bytes", limit)}
	case bodyOf(r) != nil && (bodyOf(r).err != nil || bodyOf(r).refused != nil):
		return readError(r, err)
	case errors.Is(err, io.EOF):
		return &bodyError{msg: "invalid request: the body is empty; a JSON object is expected"}
	case errors.Is(err, errTrailing):
		return &bodyError{msg: "invalid request: unexpected data after the JSON object"}
	}
	return &bodyError{msg: "invalid request: malformed JSON body: " + err.Error()}
}

var errTrailing = errors.New("trailing data")

// readRawBody reads the whole body, at most limit bytes, reserving the
// memory for it as it arrives.
func readRawBody(r *http.Request, limit int64) ([]byte, error) {
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, &bodyError{tooLarge: true, msg: fmt.Sprintf("request body too large: the limit is %d bytes", limit)}
	case err != nil:
		return nil, readError(r, err)
	case len(raw) == 0:
		return nil, &bodyError{msg: "invalid request: the body is empty"}
	}
	return raw, nil
}
