package sluice_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// traffic sends random requests, with a clock that sometimes jumps back,
// and returns the admitted requests stamped with the latest time seen so
// far: the true time, which a clock going back must not fool.
func traffic(t *testing.T, l sluice.Limit, n int, backwards bool) []admitted {
	t.Helper()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var s sluice.State
	p := l.Period.Microseconds()
	clock := t0.UnixMicro()
	latest := int64(math.MinInt64) // the latest time the limit was given
	var out []admitted
	for range n {
		clock += arrival(rng, p, l.Rate)
		now := clock
		if backwards && rng.IntN(8) == 0 {
			now -= rng.Int64N(2 * p) // a clock step back
		}
		latest = max(latest, now)
		cost := 1 + rng.Int64N(3)
		if d := l.TakeMicros(&s, now, cost); d.Allowed {
			out = append(out, admitted{latest, cost})
		}
	}
	return out
}

func TestSlidingLogNeverExceedsLimitInAnyWindow(t *testing.T) {
	t.Parallel()
	for _, backwards := range []bool{false, true} {
		l := sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 20, Period: 100 * time.Millisecond}
		hits := traffic(t, l, 3000, backwards)
		p := l.Period.Microseconds()
		for i, h := range hits {
			var sum int64
			for _, g := range hits[:i+1] {
				if g.t > h.t-p {
					sum += g.n
				}
			}
			if sum > l.Rate {
				t.Fatalf("backwards=%v: %d hits in the period ending at +%dµs, limit %d", backwards, sum, h.t-t0.UnixMicro(), l.Rate)
			}
		}
		if len(hits) < 100 {
			t.Fatalf("only %d requests admitted: the traffic does not test the limit", len(hits))
		}
	}
}

func TestBucketsNeverExceedBurstPlusRate(t *testing.T) {
	t.Parallel()
	for _, l := range []sluice.Limit{
		{Algorithm: sluice.TokenBucket, Rate: 30, Period: time.Second, Burst: 100},
		{Algorithm: sluice.TokenBucket, Rate: 7, Period: 100 * time.Millisecond},
		{Algorithm: sluice.GCRA, Rate: 30, Period: time.Second, Burst: 100},
		{Algorithm: sluice.GCRA, Rate: 3, Period: 10 * time.Millisecond, Burst: 4},
		{Algorithm: sluice.LeakyBucket, Rate: 10, Period: time.Second, Burst: 5},
	} {
		for _, backwards := range []bool{false, true} {
			hits := traffic(t, l, 1500, backwards)
			p := l.Period.Microseconds()
			capacity := l.Capacity()
			// Over [hits[i].t, hits[j].t]: admitted <= capacity + rate × elapsed / p.
			for i := range hits {
				var sum int64
				for j := i; j < len(hits); j++ {
					sum += hits[j].n
					elapsed := hits[j].t - hits[i].t
					if (sum-capacity)*p > l.Rate*elapsed {
						t.Fatalf("%v backwards=%v: %d hits in %dµs, more than burst %d + rate", l, backwards, sum, elapsed, capacity)
					}
				}
			}
		}
	}
}

func TestFixedWindowHoldsPerAlignedWindow(t *testing.T) {
	t.Parallel()
	l := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 10, Period: 50 * time.Millisecond}
	for _, backwards := range []bool{false, true} {
		hits := traffic(t, l, 3000, backwards)
		p := l.Period.Microseconds()
		per := map[int64]int64{}
		for _, h := range hits {
			per[floorTo(h.t, p)] += h.n
		}
		for ws, n := range per {
			if n > l.Rate {
				t.Fatalf("backwards=%v: %d hits in the window at +%dµs", backwards, n, ws-t0.UnixMicro())
			}
		}
	}
}

// TestFixedWindowDoublesAcrossABoundary documents the fixed window's known
// weakness: a client may spend the whole limit at the end of one window and
// again at the start of the next, twice the limit within one period.
func TestFixedWindowDoublesAcrossABoundary(t *testing.T) {
	t.Parallel()
	l := sluice.Limit{Rate: 100, Period: time.Minute}
	var s sluice.State
	end := t0.Add(time.Minute)
	if d := l.Take(&s, end.Add(-time.Millisecond), 100); !d.Allowed {
		t.Fatalf("100 hits at the end of a window: %+v", d)
	}
	if d := l.Take(&s, end, 100); !d.Allowed {
		t.Fatalf("100 more at the start of the next, 1ms later: %+v", d)
	}
	// The sliding window counter does not fall for it.
	sw := sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 100, Period: time.Minute}
	var ss sluice.State
	sw.Take(&ss, end.Add(-time.Millisecond), 100)
	if d := sw.Take(&ss, end, 100); d.Allowed {
		t.Fatalf("sliding_window admitted 200 hits in 1ms: %+v", d)
	}
}

// TestClockBackwardsNeverAdmitsMore replays the same requests with a clock
// that steps back and with the true, monotonic clock: over the whole run
// the stepping clock must not admit more than the true one.
func TestClockBackwardsNeverAdmitsMore(t *testing.T) {
	t.Parallel()
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog, sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
		l := sluice.Limit{Algorithm: alg, Rate: 10, Period: 100 * time.Millisecond}
		rng := rand.New(rand.NewPCG(uint64(alg), 2))
		var skewed, true_ sluice.State
		clock := t0.UnixMicro()
		var nSkewed, nTrue int64
		for range 5000 {
			clock += arrival(rng, l.Period.Microseconds(), l.Rate)
			now := clock
			if rng.IntN(4) == 0 {
				now -= rng.Int64N(l.Period.Microseconds())
			}
			if l.TakeMicros(&skewed, now, 1).Allowed {
				nSkewed++
			}
			if l.TakeMicros(&true_, clock, 1).Allowed {
				nTrue++
			}
		}
		if nSkewed > nTrue {
			t.Errorf("%v: a clock stepping back admitted %d, the true clock %d", alg, nSkewed, nTrue)
		}
	}
}
