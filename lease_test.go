package sluice

import (
	"math/rand/v2"
	"testing"
	"time"
)

// leaseRun drives one store state and a few nodes' leases of l through
// random events from rng (grants, the store's own decisions, leased
// decisions, clock steps) and returns every admitted hit in the order and
// at the instants it was admitted. With naive, a node admits from its
// lease whenever it has hits left, ignoring LeaseDue.
func leaseRun(rng *rand.Rand, l Limit, naive bool) (hits []hitAt) {
	type lease struct {
		grant State
		left  int64
	}
	var st State
	now := int64(1_700_000_000_000_000) + rng.Int64N(1e9)
	leases := make([]lease, 3)
	for range 300 {
		i := rng.IntN(len(leases))
		ls := &leases[i]
		cost := 1 + rng.Int64N(2)
		switch rng.IntN(6) {
		case 0: // the store decides
			if l.TakeMicros(&st, now, cost).Allowed {
				hits = append(hits, hitAt{now, cost})
			}
		case 1: // a grant, its first request among its hits
			k := 2 + rng.Int64N(max(l.Capacity()/2, 1))
			if ls.left == 0 && l.TakeMicros(&st, now, k).Allowed {
				*ls = lease{grant: st, left: k}
			}
		case 2, 3: // a leased decision
			if ls.left == 0 {
				continue
			}
			if naive {
				if cost <= ls.left {
					ls.left -= cost
					hits = append(hits, hitAt{now, cost})
				}
				continue
			}
			d, ok := l.LeaseTake(ls.grant, ls.left, now, cost)
			if !ok {
				if due, _ := l.LeaseDue(ls.grant, ls.left); now > due {
					ls.left = 0 // past due: the lease has ended
				}
				continue
			}
			if !d.Allowed || d.Remaining < 0 || d.Remaining > l.Capacity() {
				panic("LeaseTake admitted with a malformed decision")
			}
			ls.left -= cost
			hits = append(hits, hitAt{now, cost})
		default:
			now += rng.Int64N(l.Period.Microseconds()/max(l.Rate, 1)*3 + 1)
		}
	}
	return hits
}

type hitAt struct{ at, cost int64 }

// exactlyAdmits reports whether l, on a fresh key, admits every one of
// hits at its instant, in order, and the index of the first it denies.
func exactlyAdmits(l Limit, hits []hitAt) (int, bool) {
	var st State
	for i, h := range hits {
		if !l.TakeMicros(&st, h.at, h.cost).Allowed {
			return i, false
		}
	}
	return 0, true
}

// TestLeaseSound checks lease mode's guarantee on bucket limits in
// process: whatever the interleaving of grants, the store's own
// decisions, leased decisions (admitted only by their due instant) and
// clock steps, the exact algorithm admits every admitted hit at the
// instant it was admitted. The same runs with leases that ignore the due
// instant over-admit: the check can fail.
func TestLeaseSound(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	caught := 0
	for trial := range 3000 {
		l := Limit{
			Algorithm: []Algorithm{TokenBucket, LeakyBucket, GCRA}[trial%3],
			Rate:      1 + rng.Int64N(20),
			Period:    time.Duration(1+rng.Int64N(1000)) * time.Millisecond,
			Burst:     1 + rng.Int64N(40),
		}
		seed := rng.Uint64()
		hits := leaseRun(rand.New(rand.NewPCG(seed, 0)), l, false)
		if i, ok := exactlyAdmits(l, hits); !ok {
			t.Fatalf("%v, seed %d: hit %d of %d (%+v) admitted from a lease, denied by the exact algorithm", l, seed, i, len(hits), hits[i])
		}
		if _, ok := exactlyAdmits(l, leaseRun(rand.New(rand.NewPCG(seed, 0)), l, true)); !ok {
			caught++
		}
	}
	if caught == 0 {
		t.Fatal("leases that ignore their due instant never over-admitted: the check cannot fail")
	}
	t.Logf("naive leases over-admitted in %d of 3000 runs", caught)
}

func TestLeaseDue(t *testing.T) {
	t0 := int64(1_000_000_000)
	for _, tt := range []struct {
		name string
		l    Limit
	}{
		{"token_bucket", Limit{Algorithm: TokenBucket, Rate: 10, Period: time.Second, Burst: 20}},
		{"leaky_bucket", Limit{Algorithm: LeakyBucket, Rate: 10, Period: time.Second, Burst: 20}},
		{"gcra", Limit{Algorithm: GCRA, Rate: 10, Period: time.Second, Burst: 20}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.l
			var st State
			if !l.TakeMicros(&st, t0, 5).Allowed { // 5 taken: the bucket's slots start at t0 + 500ms
				t.Fatal("5 of 20 denied")
			}
			if !l.TakeMicros(&st, t0, 8).Allowed { // a lease of 8: slots from t0 + 500ms, 100ms each
				t.Fatal("a lease of 8 denied")
			}
			for left := int64(8); left >= 0; left-- {
				due, ok := l.LeaseDue(st, left)
				if want := t0 + 500_000 + (8-left)*100_000; !ok || due != want {
					t.Fatalf("LeaseDue(left %d) = %d, %v; want %d", left, due, ok, want)
				}
				if left == 0 {
					continue
				}
				d, ok := l.LeaseTake(st, left, due, 1)
				if !ok || !d.Allowed {
					t.Fatalf("LeaseTake(left %d) at its due instant: %+v, %v", left, d, ok)
				}
				if d.Remaining != 19 { // at its slot's start, the bucket ahead of it has drained
					t.Fatalf("LeaseTake(left %d) at its due instant: Remaining %d, want 19", left, d.Remaining)
				}
				if d, _ := l.LeaseTake(st, left, t0, 1); d.Remaining != 20-5-(8-left)-1 {
					t.Fatalf("LeaseTake(left %d) at the grant: Remaining %d, want %d", left, d.Remaining, 20-5-(8-left)-1)
				}
				if wantWait := time.Duration(0); l.Algorithm != LeakyBucket && d.Wait != wantWait {
					t.Fatalf("LeaseTake(left %d): Wait %v on %v", left, d.Wait, l.Algorithm)
				}
				if l.Algorithm == LeakyBucket {
					if d2, _ := l.LeaseTake(st, left, due-30_000, 1); d2.Wait != 30*time.Millisecond {
						t.Fatalf("LeaseTake(left %d) 30ms before its slot: Wait %v, want 30ms", left, d2.Wait)
					}
				}
				if _, ok := l.LeaseTake(st, left, due+1, 1); ok {
					t.Fatalf("LeaseTake(left %d) 1µs past due admitted", left)
				}
				if _, ok := l.LeaseTake(st, left, due, left+1); ok {
					t.Fatalf("LeaseTake(left %d) of %d hits admitted", left, left+1)
				}
			}
		})
	}
	if _, ok := (Limit{Rate: 10, Period: time.Second}).LeaseDue(State{}, 1); ok {
		t.Fatal("LeaseDue of a fixed window: ok")
	}
	if _, ok := (Limit{Rate: 10, Period: time.Second}).LeaseTake(State{}, 1, 0, 1); ok {
		t.Fatal("LeaseTake of a fixed window: ok")
	}
}
