package console

import (
	"sort"
	"sync"

	"github.com/quarry-cc/quarry/internal/core"
)

// maxCountedTypes bounds the Marble types Counts keeps apart: a Marble may
// send any type name, so names beyond the bound are counted as otherType.
const maxCountedTypes = 4096

// unknownType counts the attempts whose type the manifest does not
// define (the name /metrics uses too), otherType the names beyond
// maxCountedTypes.
const (
	unknownType = "<unknown>"
	otherType   = "(other)"
)

// Counts holds the activation attempts of this instance since it started,
// by Marble type: successes and refusals by reason. It is safe for
// concurrent use; the zero value is ready.
type Counts struct {
	mu       sync.Mutex
	success  map[string]uint64
	refused  map[refusalKey]uint64
	reasons  map[string]uint64
	attempts uint64
}

type refusalKey struct{ typ, reason string }

// OnActivation records one finished attempt (core.Options.OnActivation).
func (c *Counts) OnActivation(a core.ActivationAttempt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.success == nil {
		c.success, c.refused, c.reasons = map[string]uint64{}, map[refusalKey]uint64{}, map[string]uint64{}
	}
	c.attempts++
	typ := a.MarbleType
	if !a.KnownType {
		typ = unknownType
	}
	if a.Refused == "" {
		if _, ok := c.success[typ]; !ok && len(c.success) >= maxCountedTypes {
			typ = otherType
		}
		c.success[typ]++
		return
	}
	k := refusalKey{typ: typ, reason: string(a.Refused)}
	if _, ok := c.refused[k]; !ok && len(c.refused) >= maxCountedTypes {
		k.typ = otherType
	}
	c.refused[k]++
	c.reasons[string(a.Refused)]++
}

// typeCount is one Marble type's counts.
type typeCount struct {
	Type     string
	Success  uint64
	Refused  uint64
	ByReason map[string]uint64
}

// countsView is a copy of the counts for a page.
type countsView struct {
	Attempts uint64
	Types    []typeCount // by type name
	Reasons  []labelCount
}

type labelCount struct {
	Label string
	Count uint64
}

func (c *Counts) view() countsView {
	if c == nil {
		return countsView{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	byType := map[string]*typeCount{}
	get := func(t string) *typeCount {
		tc := byType[t]
		if tc == nil {
			tc = &typeCount{Type: t, ByReason: map[string]uint64{}}
			byType[t] = tc
		}
		return tc
	}
	for t, n := range c.success {
		get(t).Success = n
	}
	for k, n := range c.refused {
		tc := get(k.typ)
		tc.Refused += n
		tc.ByReason[k.reason] += n
	}
	v := countsView{Attempts: c.attempts}
	for _, tc := range byType {
		v.Types = append(v.Types, *tc)
	}
	sort.Slice(v.Types, func(i, j int) bool { return v.Types[i].Type < v.Types[j].Type })
	for r, n := range c.reasons {
		v.Reasons = append(v.Reasons, labelCount{Label: r, Count: n})
	}
	sort.Slice(v.Reasons, func(i, j int) bool {
		if v.Reasons[i].Count != v.Reasons[j].Count {
			return v.Reasons[i].Count > v.Reasons[j].Count
		}
		return v.Reasons[i].Label < v.Reasons[j].Label
	})
	return v
}
