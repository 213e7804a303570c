package console

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
)

// BenchmarkPages renders each page for a manifest with 1,000 Marble types,
// 10,000 kept activation events (the default bound), refusals of every
// type and a log of 1,000 entries. The target is under 50 ms a page
// (docs/console.md); this measures, it asserts nothing about time.
func BenchmarkPages(b *testing.B) {
	f := newFake(b, core.StateAcceptingMarbles)
	f.raw = testManifest(b, 1000)
	entries := make([]string, 1000)
	for i := range entries {
		entries[i] = fmt.Sprintf(`{"time":"2026-01-01T00:00:00.000Z","update":"Secret set","user":"alice","secret":"s%d","type":"plain"}`, i)
	}
	f.setLog(b, entries)
	now := time.Now()
	c := &Counts{}
	for i := range core.DefaultActivationEvents {
		typ := fmt.Sprintf("svc-%04d", i%1000)
		f.events = append(f.events, core.ActivationEvent{Time: now.Add(time.Duration(i-core.DefaultActivationEvents) * time.Second), MarbleType: typ})
		c.OnActivation(core.ActivationAttempt{MarbleType: typ, KnownType: true})
		if i%7 == 0 {
			c.OnActivation(core.ActivationAttempt{MarbleType: typ, KnownType: true, Refused: core.RefusedQuote})
		}
	}
	h := New(f, Options{Counts: c})
	for _, p := range pages {
		b.Run(p, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, p, nil)
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d", p, rec.Code)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/page")
		})
	}
}
