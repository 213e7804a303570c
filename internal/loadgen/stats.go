package loadgen

import (
	"slices"
	"time"
)

// Latency summarises the latencies of one scenario. Percentiles use the
// nearest-rank definition: Pxx is the smallest recorded latency that at least
// xx % of the requests did not exceed, so it is always a latency that was
// actually observed.
type Latency struct {
	Mean time.Duration
	P50  time.Duration
	P90  time.Duration
	P99  time.Duration
	Max  time.Duration
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, which must be sorted ascending. It returns 0 for no data.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// rank = ceil(p/100 * n), computed in integers where possible so that
	// p=99, n=100 gives exactly 99 and not 100 from a rounding error.
	rank := int(p * float64(n) / 100)
	if float64(rank)*100 < p*float64(n) {
		rank++
	}
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Summarize sorts samples in place and returns their summary.
func Summarize(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	return Latency{
		Mean: sum / time.Duration(len(samples)),
		P50:  Percentile(samples, 50),
		P90:  Percentile(samples, 90),
		P99:  Percentile(samples, 99),
		Max:  samples[len(samples)-1],
	}
}

// Median returns the median of ds (the mean of the two middle values for an
// even count) without changing ds.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
