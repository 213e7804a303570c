package rest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Request bodies (decisions D13 and D16). Every body is read through
// decodeBody or readRawBody, bounded by a limit per endpoint, after the
// endpoint's cheap checks (state, client certificate). The bytes a body may
// take while it is decoded are reserved from one memory budget first; when
// the budget is taken by other large requests the answer is 503 with
// Retry-After instead of more memory. Whatever a handler leaves unread is
// drained after the answer, within bounds, so that the client (which may
// still be sending) receives the answer before the connection closes.

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

// memoryBudget bounds the bytes that request bodies being decoded may take
// at once. A reservation that does not fit is refused at once (503): a
// request never waits for memory, so a flood cannot queue up.
type memoryBudget struct {
	mu   sync.Mutex
	size int64
	used int64
}

func (b *memoryBudget) tryReserve(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.size {
		return false
	}
	b.used += n
	return true
}

func (b *memoryBudget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// requestBody wraps a request's body: it counts what was read, holds the
// memory reserved for decoding it until the request ends, and drains what
// the handler left unread.
type requestBody struct {
	io.ReadCloser
	req      *http.Request
	budget   *memoryBudget
	reserved int64
	read     int64
	eof      bool
	err      error // the first read error other than io.EOF
}

func (b *requestBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	switch {
	case err == io.EOF:
		b.eof = true
	case err != nil && b.err == nil:
		b.err = err
	}
	return n, err
}

// reserve takes the memory to decode a body of at most limit bytes (less
// when the request declares a smaller Content-Length) from the budget, for
// the rest of the request.
func (b *requestBody) reserve(limit int64) error {
	if b.budget == nil {
		return nil
	}
	n := limit
	if cl := b.req.ContentLength; cl >= 0 && cl < n {
		n = cl
	}
	n = decodeCost(max(n, 512))
	if !b.budget.tryReserve(n) {
		return errBusy
	}
	b.reserved += n
	return nil
}

// end releases the memory reservation.
func (b *requestBody) end() {
	if b.budget != nil && b.reserved > 0 {
		b.budget.release(b.reserved)
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
// the body.
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
func withBodies(budget *memoryBudget, maxBody int64) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Body == nil || r.Body == http.NoBody {
				next.ServeHTTP(w, r)
				return
			}
			b := &requestBody{ReadCloser: r.Body, budget: budget}
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

// reserveBody takes the memory for a body of at most limit bytes.
func reserveBody(r *http.Request, limit int64) error {
	if b := bodyOf(r); b != nil {
		return b.reserve(limit)
	}
	return nil
}

// readError describes a failure to read the body itself (not its
// content): a malformed chunked encoding, a client that stopped sending.
func readError(r *http.Request, err error) error {
	if b := bodyOf(r); b != nil && b.err != nil {
		err = b.err
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return &bodyError{msg: "invalid request: the body did not arrive in time"}
	}
	return &bodyError{msg: "invalid request: reading the body: " + err.Error()}
}

// decodeBody reads one JSON value from the request body, at most limit
// bytes, into v. Unknown members are ignored (as MarbleRun's clients may
// send extra ones); trailing data is rejected. It reserves the memory to
// decode it first (errBusy when there is none).
func decodeBody(r *http.Request, limit int64, v any) error {
	if err := reserveBody(r, limit); err != nil {
		return err
	}
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
	case bodyOf(r) != nil && bodyOf(r).err != nil:
		return readError(r, err)
	case errors.Is(err, io.EOF):
		return &bodyError{msg: "invalid request: the body is empty; a JSON object is expected"}
	case errors.Is(err, errTrailing):
		return &bodyError{msg: "invalid request: unexpected data after the JSON object"}
	}
	return &bodyError{msg: "invalid request: malformed JSON body: " + err.Error()}
}

var errTrailing = errors.New("trailing data")

// readRawBody reads the whole body, at most limit bytes, after reserving
// the memory for it.
func readRawBody(r *http.Request, limit int64) ([]byte, error) {
	if err := reserveBody(r, limit); err != nil {
		return nil, err
	}
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
