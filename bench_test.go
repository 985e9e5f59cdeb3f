package sluice_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// benchLimits are the limits the transition benchmarks run, one per
// algorithm: 10,000 hits a second, met by requests 100µs apart.
var benchLimits = []sluice.Limit{
	{Algorithm: sluice.FixedWindow, Rate: 10000, Period: time.Second},
	{Algorithm: sluice.SlidingWindow, Rate: 10000, Period: time.Second},
	{Algorithm: sluice.SlidingLog, Rate: 10000, Period: time.Second},
	{Algorithm: sluice.TokenBucket, Rate: 10000, Period: time.Second, Burst: 100},
	{Algorithm: sluice.LeakyBucket, Rate: 10000, Period: time.Second, Burst: 100},
	{Algorithm: sluice.GCRA, Rate: 10000, Period: time.Second, Burst: 100},
}

// BenchmarkTakeMicros measures one pure transition, the time passed in,
// with requests arriving at the limit's pace, a few a little early, so
// that some are denied.
func BenchmarkTakeMicros(b *testing.B) {
	for _, l := range benchLimits {
		b.Run(l.Algorithm.String(), func(b *testing.B) {
			b.ReportAllocs()
			var s sluice.State
			now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixMicro()
			allowed := 0
			for i := 0; b.Loop(); i++ {
				now += 100 - int64(i&1) // slightly faster than the rate
				if l.TakeMicros(&s, now, 1).Allowed {
					allowed++
				}
			}
			if allowed == 0 {
				b.Fatal("nothing allowed")
			}
		})
	}
}

// BenchmarkTake is BenchmarkTakeMicros with the time as a time.Time.
func BenchmarkTake(b *testing.B) {
	l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 10000, Period: time.Second, Burst: 100}
	b.ReportAllocs()
	var s sluice.State
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for b.Loop() {
		now = now.Add(100 * time.Microsecond)
		l.Take(&s, now, 1)
	}
}
