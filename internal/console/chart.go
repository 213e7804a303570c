package console

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
)

// The charts are SVG drawn here and written into the page by the
// template: no script, no external asset. Colours are the Okabe–Ito
// palette, told apart with colour vision deficiencies, each with a legend
// and a table of the same numbers beside the chart.
var palette = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442"}

const otherColour = "#767676"

// Chart geometry (SVG user units; the SVG scales to the page's width).
const (
	chartW, chartH = 640, 240
	padL, padR     = 48, 8
	padT, padB     = 12, 36
	timeBuckets    = 24
	chartSeries    = 6 // types drawn apart; the rest are "other types"
)

type chart struct {
	ID     string
	Title  string
	Desc   string
	Width  int
	Height int
	Empty  bool
	Rects  []rect
	Labels []label
	Lines  []line
	Legend []legend
}

type rect struct {
	X, Y, W, H int
	Fill       string
	Tip        string
}

type label struct {
	X, Y   int
	Text   string
	Anchor string
}

type line struct{ X1, Y1, X2, Y2 int }

type legend struct {
	Colour string
	Name   string
	Count  int
}

// timeline draws activations over time: timeBuckets stacked bars from the
// first kept event to now, by Marble type.
func timeline(evs []core.ActivationEvent, now time.Time) chart {
	c := chart{ID: "timeline", Title: "Activations over time", Width: chartW, Height: chartH}
	if len(evs) == 0 {
		c.Empty = true
		c.Desc = "No activation events are kept."
		return c
	}
	start, end := evs[0].Time, now
	if last := evs[len(evs)-1].Time; last.After(end) {
		end = last
	}
	span := end.Sub(start)
	if span < time.Minute {
		span = time.Minute
	}
	step := span / timeBuckets
	if step*timeBuckets < span {
		step++
	}
	// The series: the types with most events, then the rest together.
	total := map[string]int{}
	for _, e := range evs {
		total[e.MarbleType]++
	}
	types := make([]string, 0, len(total))
	for t := range total {
		types = append(types, t)
	}
	sort.Slice(types, func(i, j int) bool {
		if total[types[i]] != total[types[j]] {
			return total[types[i]] > total[types[j]]
		}
		return types[i] < types[j]
	})
	series := map[string]int{}
	nSeries := min(len(types), chartSeries)
	for i, t := range types[:nSeries] {
		series[t] = i
		c.Legend = append(c.Legend, legend{Colour: palette[i], Name: t, Count: total[t]})
	}
	if len(types) > nSeries {
		other := 0
		for _, t := range types[nSeries:] {
			other += total[t]
		}
		c.Legend = append(c.Legend, legend{Colour: otherColour, Name: fmt.Sprintf("%d other types", len(types)-nSeries), Count: other})
	}
	counts := make([][]int, timeBuckets)
	for i := range counts {
		counts[i] = make([]int, len(c.Legend))
	}
	for _, e := range evs {
		b := min(int(e.Time.Sub(start)/step), timeBuckets-1)
		b = max(b, 0)
		s, ok := series[e.MarbleType]
		if !ok {
			s = len(c.Legend) - 1
		}
		counts[b][s]++
	}
	peak := 1
	for _, b := range counts {
		sum := 0
		for _, n := range b {
			sum += n
		}
		peak = max(peak, sum)
	}
	plotW, plotH := chartW-padL-padR, chartH-padT-padB
	barW := plotW / timeBuckets
	for i, b := range counts {
		y := padT + plotH
		from := start.Add(time.Duration(i) * step)
		for s, n := range b {
			if n == 0 {
				continue
			}
			hgt := max(n*plotH/peak, 1)
			y -= hgt
			c.Rects = append(c.Rects, rect{X: padL + i*barW + 1, Y: y, W: barW - 2, H: hgt, Fill: c.Legend[s].Colour,
				Tip: fmt.Sprintf("%s: %d activations from %s", c.Legend[s].Name, n, from.UTC().Format("2006-01-02 15:04:05"))})
		}
	}
	c.axes(peak, plotW, plotH)
	c.Labels = append(c.Labels,
		label{X: padL, Y: chartH - 12, Text: start.UTC().Format("01-02 15:04"), Anchor: "start"},
		label{X: padL + plotW, Y: chartH - 12, Text: end.UTC().Format("01-02 15:04") + " UTC", Anchor: "end"})
	c.Desc = fmt.Sprintf("%d activations of %d Marble types between %s and %s, in %d intervals of %s.",
		len(evs), len(types), start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), timeBuckets, step.Round(time.Second))
	return c
}

// barChart draws horizontal bars, one per label.
func barChart(items []labelCount) chart {
	c := chart{ID: "refusals", Title: "Refused activations by reason", Width: chartW}
	if len(items) == 0 {
		c.Empty, c.Height = true, 40
		c.Desc = "No activation was refused since this instance started."
		return c
	}
	const rowH, labelW = 28, 170
	c.Height = padT + len(items)*rowH + 8
	var peak uint64 = 1
	for _, it := range items {
		peak = max(peak, it.Count)
	}
	plotW := chartW - labelW - 60
	var parts []string
	for i, it := range items {
		y := padT + i*rowH
		w := max(int(it.Count*uint64(plotW)/peak), 1)
		colour := palette[5]
		c.Rects = append(c.Rects, rect{X: labelW, Y: y, W: w, H: rowH - 8, Fill: colour, Tip: fmt.Sprintf("%s: %d", it.Label, it.Count)})
		c.Labels = append(c.Labels,
			label{X: labelW - 6, Y: y + rowH/2 + 1, Text: it.Label, Anchor: "end"},
			label{X: labelW + w + 6, Y: y + rowH/2 + 1, Text: fmt.Sprint(it.Count), Anchor: "start"})
		parts = append(parts, fmt.Sprintf("%s %d", it.Label, it.Count))
	}
	c.Desc = "Refusals since this instance started: " + strings.Join(parts, ", ") + "."
	return c
}

// axes adds the value axis with a few ticks.
func (c *chart) axes(peak, plotW, plotH int) {
	base := padT + plotH
	c.Lines = append(c.Lines, line{X1: padL, Y1: base, X2: padL + plotW, Y2: base}, line{X1: padL, Y1: padT, X2: padL, Y2: base})
	for _, v := range []int{0, peak / 2, peak} {
		if v == peak/2 && (v == 0 || v == peak) {
			continue
		}
		y := base - v*plotH/peak
		c.Labels = append(c.Labels, label{X: padL - 6, Y: y + 4, Text: fmt.Sprint(v), Anchor: "end"})
	}
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
