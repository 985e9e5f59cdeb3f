package sluice_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestDebit checks the write-back of hits admitted elsewhere on the
// bucket limits: where a Take admits, Debit leaves the state the Take
// leaves; past the capacity it leaves a debt that denies until it has
// drained, the RetryAfter saying when; Level reads what BucketState
// builds and what Debit added.
func TestDebit(t *testing.T) {
	t.Parallel()
	limits := []sluice.Limit{
		{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Second, Burst: 30},
		{Algorithm: sluice.LeakyBucket, Rate: 7, Period: time.Minute},
		{Algorithm: sluice.GCRA, Rate: 3, Period: time.Second, Burst: 5},
	}
	for _, l := range limits {
		t.Run(l.String(), func(t *testing.T) {
			b, ok := l.Bucket()
			if !ok || b.Full != l.Capacity()*b.Hit {
				t.Fatalf("Bucket() = %+v, %v", b, ok)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			now := time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC).UnixMicro()
			var s sluice.State
			for range 2000 {
				now += rng.Int64N(3 * b.Hit / b.Drain)
				cost := rng.Int64N(4)
				before := l.Level(s, now)
				taken := s.Clone()
				d := l.TakeMicros(&taken, now, cost)
				debited := s
				if !l.Debit(&debited, now, cost) {
					t.Fatal("Debit refused a bucket limit")
				}
				if got := l.Level(debited, now); got != before+cost*b.Hit {
					t.Fatalf("level %d, debit of %d: %d, want %d", before, cost, got, before+cost*b.Hit)
				}
				if d.Allowed && cost > 0 && taken != debited {
					t.Fatalf("a Take of %d at level %d left %+v, Debit %+v", cost, before, taken, debited)
				}
				if rb := l.BucketState(before, now); l.Level(rb, now) != before {
					t.Fatalf("BucketState(%d): level %d", before, l.Level(rb, now))
				}
				if rng.IntN(3) == 0 {
					s = debited // sometimes a write-back, sometimes what the Take decided
				} else {
					s = taken
				}
			}
			// A debt of 2 capacities: nothing passes until it has drained
			// to a hit's room, exactly when RetryAfter says.
			s = sluice.State{}
			l.Debit(&s, now, 3*l.Capacity())
			d := l.TakeMicros(&s, now, 1)
			if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
				t.Fatalf("in debt: %+v", d)
			}
			at := now + d.RetryAfter.Microseconds()
			if d := l.TakeMicros(&s, at-1, 1); d.Allowed {
				t.Fatalf("admitted 1µs before the retry time: %+v", d)
			}
			if d := l.TakeMicros(&s, at, 1); !d.Allowed {
				t.Fatalf("denied at the retry time: %+v", d)
			}
		})
	}
	if l := (sluice.Limit{Rate: 10, Period: time.Second}); l.Debit(&sluice.State{}, 0, 1) {
		t.Fatal("Debit on a fixed window")
	}
}
