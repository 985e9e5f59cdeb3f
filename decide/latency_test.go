package decide

import (
	"testing"
	"time"
)

// TestLatency checks the store timeout that latencies set: the floor for
// a healthy store, twice the 99th percentile (rounded up to its bucket)
// for a slower one, the cap for one slower still, and twice the timeout
// once more than 1% of calls time out.
func TestLatency(t *testing.T) {
	t.Parallel()
	const lo, hi = 50 * time.Millisecond, 200 * time.Millisecond
	tests := []struct {
		name     string
		calls    func(i int) time.Duration
		min, max time.Duration
	}{
		{name: "healthy, p99 of 3ms", calls: func(i int) time.Duration {
			if i%100 == 0 {
				return 3 * time.Millisecond
			}
			return 300 * time.Microsecond
		}, min: lo, max: lo},
		{name: "30ms slower", calls: func(int) time.Duration { return 31 * time.Millisecond }, min: 62 * time.Millisecond, max: 80 * time.Millisecond},
		{name: "120ms slower", calls: func(int) time.Duration { return 121 * time.Millisecond }, min: hi, max: hi},
		{name: "2% over the floor", calls: func(i int) time.Duration {
			if i%50 == 0 {
				return lo // a call that timed out counts as the timeout
			}
			return time.Millisecond
		}, min: 2 * lo, max: 2 * lo * 5 / 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := newLatency(lo, hi)
			for i := range 4 * latencyEvery {
				l.observe(tt.calls(i))
			}
			if got := l.now(); got < tt.min || got > tt.max {
				t.Errorf("timeout %v, want %v to %v", got, tt.min, tt.max)
			}
		})
	}
}

// TestLatencyBuckets checks that each latency falls in a bucket whose
// upper bound is at least it and at most a quarter above it.
func TestLatencyBuckets(t *testing.T) {
	t.Parallel()
	for us := int64(0); us < 1<<30; us = us*9/8 + 1 {
		i := bucket(us)
		if up := upper(i); up < us || (us >= 16 && float64(up) > 1.25*float64(us)) {
			t.Fatalf("%dµs in bucket %d up to %dµs", us, i, up)
		}
	}
}

// BenchmarkLatencyObserve measures what the adaptive store timeout costs a
// store call: counting its latency, and every latencyEvery calls the
// estimate.
func BenchmarkLatencyObserve(b *testing.B) {
	l := newLatency(50*time.Millisecond, 200*time.Millisecond)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := time.Duration(0)
		for pb.Next() {
			d = (d + 37*time.Microsecond) % (3 * time.Millisecond)
			l.observe(d)
		}
	})
}
