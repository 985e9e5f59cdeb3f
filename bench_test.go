//go:build unix

package sluice_test

import (
	"syscall"
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

// benchCPU returns the CPU time the process has used. A benchmark that
// allocates nothing runs on one thread, so this is the benchmark's.
func benchCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// reportCPU reports the CPU time since start per operation, as cpu-ns/op:
// unlike ns/op, it does not count the time the benchmark waits for a core
// that other work holds, so it compares fairly on a busy machine.
func reportCPU(b *testing.B, start time.Duration, ok bool, n int) {
	if end, ok2 := benchCPU(); ok && ok2 && n > 0 {
		b.ReportMetric(float64(end-start)/float64(n), "cpu-ns/op")
	}
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
			start, ok := benchCPU()
			n := 0
			for ; b.Loop(); n++ {
				now += 100 - int64(n&1) // slightly faster than the rate
				if l.TakeMicros(&s, now, 1).Allowed {
					allowed++
				}
			}
			reportCPU(b, start, ok, n)
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
	start, ok := benchCPU()
	n := 0
	for ; b.Loop(); n++ {
		now = now.Add(100 * time.Microsecond)
		l.Take(&s, now, 1)
	}
	reportCPU(b, start, ok, n)
}
