package core

import (
	"slices"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// DefaultActivationEvents is how many activation events are kept by
// default.
const DefaultActivationEvents = 10_000

// ActivationEvent is one successful Marble activation (kept in memory for
// the Client API's activation events).
type ActivationEvent struct {
	Time       time.Time
	MarbleType string
	UUID       string
	// Quote is the Marble's verified quote as compactQuote keeps it; nil
	// in simulation.
	Quote []byte
}

// compactQuote returns the part of a verified quote worth keeping: the
// quote with what no signature covers cut from its certificate chain
// (sgxquote.Quote.Compact, tdxquote.Quote.Compact), in the Open Enclave
// header if it came in one. A Marble could otherwise pad each quote it
// sends up to the Marble API's request limit and make the kept events hold
// 256 KiB each instead of about 5 KiB (docs/operations.md, "Activation
// events"). A quote that does not parse (it did verify, so only a test's
// verifier lets one through) is kept as it is.
func compactQuote(b []byte) []byte {
	if tdxquote.IsTDX(b) {
		q, err := tdxquote.Parse(b)
		if err != nil {
			return b
		}
		return q.Compact()
	}
	q, err := sgxquote.ParseAny(b)
	if err != nil {
		return b
	}
	if sgxquote.IsWrapped(b) {
		return sgxquote.Wrap(q.Compact())
	}
	return q.Compact()
}

// eventLog keeps the latest activation events in memory, bounded: when
// full, the oldest is dropped and the drop counted.
type eventLog struct {
	mu      sync.Mutex // guards the fields below (limit is set before use)
	limit   int
	events  []ActivationEvent // ring buffer of at most limit events
	next    int               // where the next event goes once full
	dropped uint64
}

func (l *eventLog) record(e ActivationEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limit <= 0 {
		l.dropped++
		return
	}
	if len(l.events) < l.limit {
		l.events = append(l.events, e)
		return
	}
	l.events[l.next] = e
	l.next = (l.next + 1) % l.limit
	l.dropped++
}

// snapshot returns the kept events, oldest first, and how many were
// dropped.
func (l *eventLog) snapshot() ([]ActivationEvent, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Concat(l.events[l.next:], l.events[:l.next])
	return out, l.dropped
}

// ActivationEvents returns the kept activation events, oldest first, and
// the number of older events dropped because the log was full.
func (c *Core) ActivationEvents() ([]ActivationEvent, uint64) { return c.events.snapshot() }
