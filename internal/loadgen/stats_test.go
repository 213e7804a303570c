package loadgen

import (
	"math/rand/v2"
	"testing"
	"time"
)

func durations(vals ...int) []time.Duration {
	out := make([]time.Duration, len(vals))
	for i, v := range vals {
		out[i] = time.Duration(v)
	}
	return out
}

func TestPercentileNearestRank(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	ten := durations(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	tests := []struct {
		data []time.Duration
		p    float64
		want time.Duration
	}{
		{hundred, 50, 50},
		{hundred, 90, 90},
		{hundred, 99, 99},
		{hundred, 99.5, 100},
		{hundred, 100, 100},
		{hundred, 1, 1},
		{hundred, 0.5, 1},
		{ten, 50, 5},
		{ten, 90, 9},
		{ten, 99, 10},
		{ten, 91, 10},
		{durations(7), 50, 7},
		{durations(7), 99, 7},
		{durations(1, 2), 50, 1},
		{durations(1, 2), 51, 2},
		{nil, 50, 0},
	}
	for _, tt := range tests {
		if got := Percentile(tt.data, tt.p); got != tt.want {
			t.Errorf("Percentile(n=%d, %v) = %v, want %v", len(tt.data), tt.p, got, tt.want)
		}
	}
}

func TestSummarizeShuffled(t *testing.T) {
	// 1000 samples of 1..1000 µs in random order.
	s := make([]time.Duration, 1000)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Microsecond
	}
	rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	got := Summarize(s)
	want := Latency{
		Mean: 500500 * time.Nanosecond, // (1+1000)/2 µs
		P50:  500 * time.Microsecond,
		P90:  900 * time.Microsecond,
		P99:  990 * time.Microsecond,
		Max:  1000 * time.Microsecond,
	}
	if got != want {
		t.Fatalf("Summarize = %+v, want %+v", got, want)
	}
	if (Summarize(nil) != Latency{}) {
		t.Fatal("Summarize(nil) is not zero")
	}
}

func TestMedian(t *testing.T) {
	odd := durations(30, 10, 20)
	if got := Median(odd); got != 20 {
		t.Errorf("Median(30,10,20) = %v, want 20", got)
	}
	if odd[0] != 30 {
		t.Error("Median changed its argument")
	}
	if got := Median(durations(4, 1, 3, 2)); got != 2 { // (2+3)/2 in integers
		t.Errorf("Median(4,1,3,2) = %v, want 2", got)
	}
	if got := Median(durations(10, 20)); got != 15 {
		t.Errorf("Median(10,20) = %v, want 15", got)
	}
	if got := Median(nil); got != 0 {
		t.Errorf("Median(nil) = %v", got)
	}
}
