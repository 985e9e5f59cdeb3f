package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// referenceLimits are the limits the reference checks run: each algorithm
// with small numbers (many boundaries crossed), rates that do not divide
// their periods, and large numbers whose products pass 2^53 (sliding
// window counts × periods, bucket levels before the gcd reduction).
func referenceLimits() []sluice.Limit {
	ms, s, day := time.Millisecond, time.Second, 24*time.Hour
	var ls []sluice.Limit
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog,
		sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
		ls = append(ls,
			sluice.Limit{Algorithm: alg, Rate: 5, Period: s},
			sluice.Limit{Algorithm: alg, Rate: 7, Period: 1000 * ms},
			sluice.Limit{Algorithm: alg, Rate: 3, Period: 1234567 * time.Microsecond},
			sluice.Limit{Algorithm: alg, Rate: 1000, Period: time.Minute},
		)
		if alg.HasBurst() {
			ls = append(ls,
				sluice.Limit{Algorithm: alg, Rate: 30, Period: s, Burst: 100},
				sluice.Limit{Algorithm: alg, Rate: 1_000_000, Period: day, Burst: 2_000_000},
			)
		} else if alg != sluice.SlidingLog {
			ls = append(ls, sluice.Limit{Algorithm: alg, Rate: 1_000_003, Period: day})
		}
	}
	sw := sluice.SlidingWindow // of sub-windows (precision), which the script decides itself
	return append(ls,
		sluice.Limit{Algorithm: sw, Rate: 5, Period: s, Precision: 2},
		sluice.Limit{Algorithm: sw, Rate: 7, Period: 1000 * ms, Precision: 10},
		sluice.Limit{Algorithm: sw, Rate: 1000, Period: time.Minute, Precision: 60},
		sluice.Limit{Algorithm: sw, Rate: 1_000_003, Period: day, Precision: 16},
	)
}

// randomStep returns the next time and cost of a random walk for l: mostly
// forward by a fraction of the period (sometimes several periods),
// sometimes not at all, rarely back; costs mostly small, sometimes 0, the
// whole capacity, more than it, or negative.
func randomStep(r *rand.Rand, l sluice.Limit, now time.Time) (time.Time, int64) {
	p := l.Period
	switch x := r.IntN(100); {
	case x < 15: // same instant
	case x < 20:
		now = now.Add(-time.Duration(r.Int64N(int64(p/2/time.Microsecond)+1)) * time.Microsecond)
	case x < 25:
		now = now.Add(time.Duration(r.IntN(3)+1) * p)
	default:
		now = now.Add(time.Duration(r.Int64N(int64(p/time.Microsecond)/4+1)) * time.Microsecond)
	}
	c := l.Capacity()
	var cost int64
	switch x := r.IntN(100); {
	case x < 10:
		cost = 0
	case x < 13:
		cost = c
	case x < 16:
		cost = c + 1 + r.Int64N(3)
	case x < 17:
		cost = -1
	case x < 60:
		cost = 1
	default:
		cost = 1 + r.Int64N(max(c/4, 1))
	}
	return now, cost
}

// TestReferenceTake checks every decision of the Redis store against
// sluice.Limit.Take on a State of its own, for every algorithm, under
// random times and costs: the Decision structs must be identical.
func TestReferenceTake(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			clock := clocktest.New(t0)
			s := open(t, b.url(t), testConfig(clock.Now))
			for i, l := range referenceLimits() {
				t.Run(l.String(), func(t *testing.T) {
					testTake(t, s, clock, i, l)
				})
			}
		})
	}
}

// testTake walks key "ref<i>" of s, whose clock is clock, under l with
// randomStep, and checks each decision against sluice.Limit.Take.
func testTake(t *testing.T, s sluice.Store, clock *fakeClock, i int, l sluice.Limit) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(uint64(i), 42))
	key := fmt.Sprintf("ref%d", i)
	var st sluice.State
	now := t0.Add(time.Duration(r.Int64N(int64(l.Period))))
	steps := 300
	if l.Rate > 100 {
		steps = 150
	}
	var allowed, denied int
	defer func() {
		if !t.Failed() && (allowed == 0 || denied == 0) {
			t.Errorf("%d allowed, %d denied: the walk should see both", allowed, denied)
		}
	}()
	for step := range steps {
		var cost int64
		now, cost = randomStep(r, l, now)
		clock.Set(now)
		want := l.Take(&st, now, cost)
		got, err := sluice.Take(ctx, s, key, l, cost)
		if err != nil {
			t.Fatalf("step %d: Take: %v", step, err)
		}
		if got != want {
			t.Fatalf("step %d at %s cost %d:\n got %+v\nwant %+v", step, now.Sub(t0), cost, got, want)
		}
		if got.Allowed {
			allowed++
		} else {
			denied++
		}
	}
}

// heavyLimits are large limits, where the arithmetic passes 2^53 before
// the reductions.
func heavyLimits() []sluice.Limit {
	return []sluice.Limit{
		{Algorithm: sluice.SlidingWindow, Rate: 1_000_003, Period: 24 * time.Hour},
		{Algorithm: sluice.SlidingWindow, Rate: 1 << 40, Period: 1 << 40 * time.Microsecond},
		{Algorithm: sluice.SlidingWindow, Rate: 1 << 40, Period: 1 << 40 * time.Microsecond, Precision: 32},
		{Algorithm: sluice.TokenBucket, Rate: 1_000_000, Period: 24 * time.Hour, Burst: 5_000_000},
		{Algorithm: sluice.LeakyBucket, Rate: 999_999, Period: time.Hour, Burst: 1_000_000},
		{Algorithm: sluice.GCRA, Rate: 1_000_000, Period: 24 * time.Hour, Burst: 5_000_000},
		{Algorithm: sluice.FixedWindow, Rate: 1 << 50, Period: 1 << 45 * time.Microsecond},
	}
}

// TestReferenceHeavy drives bursts of large costs at large limits, where
// the arithmetic passes 2^53 before the reductions, and checks against
// sluice.Limit.Take.
func TestReferenceHeavy(t *testing.T) {
	b := backends()[0]
	clock := clocktest.New(t0)
	s := open(t, b.url(t), testConfig(clock.Now))
	for i, l := range heavyLimits() {
		t.Run(l.String(), func(t *testing.T) {
			testHeavy(t, s, clock, i, l)
		})
	}
}

// testHeavy walks key "heavy<i>" of s under l with bursts of large costs,
// and checks each decision against sluice.Limit.Take.
func testHeavy(t *testing.T, s sluice.Store, clock *fakeClock, i int, l sluice.Limit) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(uint64(i), 7))
	var st sluice.State
	now := t0
	c := l.Capacity()
	for step := range 200 {
		now = now.Add(time.Duration(r.Int64N(int64(l.Period/time.Microsecond)/8+1)) * time.Microsecond)
		cost := r.Int64N(c/3 + 1)
		clock.Set(now)
		want := l.Take(&st, now, cost)
		got, err := sluice.Take(ctx, s, fmt.Sprintf("heavy%d", i), l, cost)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if got != want {
			t.Fatalf("step %d cost %d:\n got %+v\nwant %+v", step, cost, got, want)
		}
	}
}

// TestReferenceTakeAll checks TakeAll against a model built from
// sluice.Limit.Take: each key's state is its admitted history replayed, a
// batch is decided in order on those states (a key given twice sees the
// first request's hits), and its hits are kept only if all passed.
func TestReferenceTakeAll(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			clock := clocktest.New(t0)
			s := open(t, b.url(t), testConfig(clock.Now))
			for _, tagged := range []bool{true, false} {
				t.Run(fmt.Sprintf("group %v", tagged), func(t *testing.T) {
					testTakeAll(t, s, clock, tagged)
				})
			}
		})
	}
}

type op struct {
	at   time.Time
	cost int64
}

// testTakeAll checks random TakeAlls of s, whose clock is clock, against
// the model of TestReferenceTakeAll; with tagged, in one group.
func testTakeAll(t *testing.T, s sluice.Store, clock *fakeClock, tagged bool) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 4))
	limits := referenceLimits()
	type keyed struct {
		key   string
		limit sluice.Limit
	}
	// Six keys, each with one limit of its own.
	var keys []keyed
	for i := range 6 {
		k := fmt.Sprintf("all%v|%d", tagged, i)
		l := limits[r.IntN(len(limits))]
		for l.Rate > 1000 {
			l = limits[r.IntN(len(limits))]
		}
		keys = append(keys, keyed{k, l})
	}
	history := map[string][]op{}
	replay := func(k keyed) *sluice.State {
		st := new(sluice.State)
		for _, o := range history[k.key] {
			k.limit.Take(st, o.at, o.cost)
		}
		return st
	}
	now := t0
	for step := range 300 {
		now, _ = randomStep(r, sluice.Limit{Period: 500 * time.Millisecond}, now)
		clock.Set(now)
		n := 1 + r.IntN(4)
		reqs := make([]sluice.Request, n)
		picked := make([]keyed, n)
		for i := range reqs {
			picked[i] = keys[r.IntN(len(keys))]
			_, cost := randomStep(r, picked[i].limit, now)
			reqs[i] = sluice.Request{Key: picked[i].key, Limit: picked[i].limit, Cost: cost}
			if tagged { // one group, with braces that must not break its hash tag
				reqs[i].Group = "{client}|}{"
			}
		}
		// The model.
		states := map[string]*sluice.State{}
		want := make([]sluice.Decision, n)
		all := true
		for i, k := range picked {
			st, ok := states[k.key]
			if !ok {
				st = replay(k)
				states[k.key] = st
			}
			want[i] = k.limit.Take(st, now, reqs[i].Cost)
			all = all && want[i].Allowed
		}
		got := make([]sluice.Decision, n)
		if err := s.TakeAll(ctx, reqs, got); err != nil {
			t.Fatalf("step %d: TakeAll: %v", step, err)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("step %d at %s, request %d of %v:\n got %+v\nwant %+v", step, now.Sub(t0), i, reqs, got[i], want[i])
			}
		}
		if all {
			for i, k := range picked {
				history[k.key] = append(history[k.key], op{now, reqs[i].Cost})
			}
		}
	}
}
