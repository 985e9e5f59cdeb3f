package memory

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestLimitChangeKeepsCount uses one key under limits of one algorithm and
// period but other rates and bursts, as rules whose counter identity leaves
// out rate and burst do when an operator edits them: the count stays.
// Raising 5 a minute to 6 admits one more request, and setting it back
// admits none; every decision is the Go transition's on one state that
// saw the same requests under the same limits. (Bucket levels are kept in
// hit·µs, exactly: store/redis keeps them over gcd(rate, period) and
// rounds a level written under another gcd up to the new one, less than a
// microsecond's refill, so the two agree whenever the new gcd divides the
// old, as its TestBucketLimitChanges checks.)
func TestLimitChangeKeepsCount(t *testing.T) {
	algs := []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog, sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA}
	for _, a := range algs {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			c := clocktest.New(t0)
			c.Set(t0.Truncate(time.Minute)) // a window's start
			s := newStore(t, Config{MaxEntries: 64, Shards: 1, Now: c.Now})
			ctx := context.Background()
			five := sluice.Limit{Algorithm: a, Rate: 5, Period: time.Minute}
			six := sluice.Limit{Algorithm: a, Rate: 6, Period: time.Minute}
			admitted := func(l sluice.Limit, n int) int {
				k := 0
				for range n {
					ds := make([]sluice.Decision, 1)
					if err := s.TakeAll(ctx, []sluice.Request{{Key: "login", Limit: l, Cost: 1}}, ds); err != nil {
						t.Fatal(err)
					}
					if ds[0].Allowed {
						k++
					}
				}
				return k
			}
			if got := admitted(five, 10); got != 5 {
				t.Fatalf("5 a minute admitted %d of 10", got)
			}
			// gcra keeps its theoretical arrival time, a debt in time: 60 s
			// is 5 hits at 5 a minute and 6 at 6 a minute, so a raise admits
			// nothing more until it drains (as in store/redis, which keeps
			// the same state).
			more := 1
			if a == sluice.GCRA {
				more = 0
			}
			if got := admitted(six, 10); got != more {
				t.Fatalf("raised to 6 a minute, admitted %d more, want %d: the count was not kept", got, more)
			}
			if got := admitted(five, 10); got != 0 {
				t.Fatalf("set back to 5 a minute, admitted %d more, want 0", got)
			}

			// Random traffic under limits of other rates and bursts.
			limits := []sluice.Limit{
				{Algorithm: a, Rate: 6, Period: time.Minute},
				{Algorithm: a, Rate: 7, Period: time.Minute},
				{Algorithm: a, Rate: 8, Period: time.Minute},
			}
			if a.HasBurst() {
				limits[1].Burst, limits[2].Burst = 10, 3
			}
			seed := rand.Uint64()
			rng := rand.New(rand.NewPCG(seed, 11))
			var ref sluice.State
			for step := range 500 {
				c.Advance(time.Duration(rng.IntN(4000)) * time.Millisecond)
				l := limits[rng.IntN(len(limits))]
				cost := rng.Int64N(4)
				want := l.Take(&ref, c.Now(), cost)
				got, err := sluice.Take(ctx, s, "changing", l, cost)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("seed %d, step %d, %v cost %d:\n got %+v\nwant %+v", seed, step, l, cost, got, want)
				}
			}
		})
	}
}
