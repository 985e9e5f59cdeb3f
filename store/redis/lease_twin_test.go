package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestScriptReturnBuckets runs lease.lua's returns of bucket leases
// in-process against Go: random grants, Takes, returns and clock steps on
// token_bucket, leaky_bucket and gcra keys of random limits, take.lua and
// lease.lua on one memRedis. Go's model is the exact algorithm on a state
// of its own: a return right after its grant (denials aside) leaves the
// key as if the grant had taken only the used hits, the whole slots of
// the unused ones still ahead of now come back, and every later decision
// is the model's; a return after anything else was admitted gives nothing
// and changes nothing.
func TestScriptReturnBuckets(t *testing.T) {
	t.Parallel()
	leaseProto, err := compile(leaseSource)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 8))
	total := 0
	for trial := range 120 {
		l := sluice.Limit{
			Algorithm: []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA}[trial%3],
			Rate:      1 + rng.Int64N(30),
			Period:    time.Duration(1+rng.Int64N(5000)) * time.Millisecond,
			Burst:     1 + rng.Int64N(50),
		}
		t.Run(fmt.Sprintf("%d/%v", trial, l), func(t *testing.T) {
			clock := clocktest.New(t0)
			w := newTwin(t, clock, time.Hour, trial%2 == 0)
			ctx := context.Background()
			const key = "{k}"
			var model, pre sluice.State // the key's state; before the grant
			var grant sluice.State      // the grant's, while a lease may return
			var lease, used, gat int64  // its size, hits used, instant
			returns := 0
			for range 60 {
				now := clock.Now().UnixMicro()
				cost := 1 + rng.Int64N(max(l.Capacity()/3, 1))
				switch rng.IntN(5) {
				case 0, 1: // a Take: a grant when no lease is open
					before := model
					want := l.TakeMicros(&model, now, cost)
					d, err := sluice.Take(ctx, w, key, l, cost)
					if err != nil {
						t.Fatal(err)
					}
					if d != want {
						t.Fatalf("Take(%d) at %d: %+v, want %+v", cost, now, d, want)
					}
					switch {
					case d.Allowed && lease == 0 && cost > 1:
						pre, grant, lease, used, gat = before, model, cost, 1+rng.Int64N(cost-1), now
					case d.Allowed:
						lease = 0 // admitted after the grant: nothing comes back
					}
				case 2: // the open lease's return, or one that cannot be
					hits := lease - used
					g := grant
					if lease == 0 { // a stale grant: the key's state is another
						hits, g = 1+rng.Int64N(l.Capacity()), sluice.StateOf(now-1, 1, 0)
						if l.Algorithm != sluice.GCRA {
							g = sluice.StateOf(now-1, 0, 0)
						}
					}
					rec, ok, err := returnRecord(sluice.Request{Key: key, Limit: l, Cost: hits}, g)
					if err != nil || !ok {
						t.Fatalf("returnRecord: %v, %v", ok, err)
					}
					arg := ""
					if trial%2 != 0 {
						arg = fmt.Sprint(now)
					}
					ret, err := w.vm.evalProto(leaseProto, []string{w.s.name(key, "")}, string(rec), arg)
					if err != nil {
						t.Fatal(err)
					}
					got := int64(lua.LVAsNumber(ret))
					goRule := model.Clone() // sluice's ReturnLease, the rule lease.lua is in Go
					back := l.ReturnLease(&goRule, g, hits, now)
					want := int64(0)
					if lease > 0 {
						want = wholeSlots(l, grant, hits, now)
						model = pre
						l.TakeMicros(&model, gat, used)
						returns++
					}
					if got != want || back != want {
						t.Fatalf("return of %d (lease %d, used %d) at %d gave back %d (sluice.ReturnLease %d), want %d", hits, lease, used, now, got, back, want)
					}
					for c := int64(1); c <= l.Capacity(); c += max(l.Capacity()/4, 1) {
						m, r := model, goRule
						if dm, dr := l.TakeMicros(&m, now, c), l.TakeMicros(&r, now, c); dm != dr {
							t.Fatalf("after the return, %d hits: sluice.ReturnLease's state decides %+v, the model %+v", c, dr, dm)
						}
					}
					lease = 0
				default:
					clock.Advance(time.Duration(rng.Int64N(l.Period.Microseconds()/l.Rate*2+1)) * time.Microsecond)
				}
				for c := int64(1); c <= l.Capacity(); c += max(l.Capacity()/4, 1) { // the key decides as the model does
					m := model
					want := l.TakeMicros(&m, clock.Now().UnixMicro(), c)
					var dry [1]sluice.Decision
					if err := w.group(ctx, []sluice.Request{{Key: key, Limit: l, Cost: c}}, []int{0}, modeDryRun, dry[:]); err != nil {
						t.Fatal(err)
					}
					if dry[0] != want {
						t.Fatalf("%d hits at %d: %+v, want the model's %+v", c, clock.Now().UnixMicro(), dry[0], want)
					}
				}
			}
			total += returns
		})
	}
	if total < 100 {
		t.Fatalf("%d returns of open leases in all: the test exercises too few", total)
	}
}

// wholeSlots returns how many whole slots of the last hits hits of the
// lease whose grant left the bucket limit l in state grant lie ahead of
// now: what lease.lua gives back.
func wholeSlots(l sluice.Limit, grant sluice.State, hits, now int64) int64 {
	t, n, _ := grant.Fields()
	p := l.Period.Microseconds()
	if l.Algorithm == sluice.GCRA { // t is the TAT
		T := (p + l.Rate - 1) / l.Rate
		return max(t-max(t-hits*T, now), 0) / T
	}
	level := max(n-max(now-t, 0)*l.Rate, 0) // n is the level at t, in hit·µs
	return min(hits*p, level) / p
}

// TestScriptReturnWindows runs lease.lua's returns of window leases
// (fixed_window, sliding_window) in-process against sluice.ReturnLease:
// random Takes, returns of grants old and new, and clock steps within and
// across windows, take.lua and lease.lua on one memRedis; every return
// gives back what ReturnLease gives back, and the key then decides as the
// state ReturnLease left.
func TestScriptReturnWindows(t *testing.T) {
	t.Parallel()
	leaseProto, err := compile(leaseSource)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(6, 9))
	gave := 0
	for trial := range 60 {
		l := sluice.Limit{
			Algorithm: []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow}[trial%2],
			Rate:      1 + rng.Int64N(40),
			Period:    time.Duration(1+rng.Int64N(3000)) * time.Millisecond,
		}
		t.Run(fmt.Sprintf("%d/%v", trial, l), func(t *testing.T) {
			clock := clocktest.New(t0)
			w := newTwin(t, clock, time.Hour, trial%4 < 2)
			ctx := context.Background()
			const key = "{k}"
			var model sluice.State
			var grants []sluice.State // states grants left, old and new
			for range 80 {
				now := clock.Now().UnixMicro()
				switch rng.IntN(4) {
				case 0, 1:
					cost := 1 + rng.Int64N(max(l.Rate/2, 1))
					want := l.TakeMicros(&model, now, cost)
					if d, err := sluice.Take(ctx, w, key, l, cost); err != nil || d != want {
						t.Fatalf("Take(%d) at %d: %+v, %v; want %+v", cost, now, d, err, want)
					}
					if want.Allowed {
						grants = append(grants, model.Clone())
					}
				case 2:
					if len(grants) == 0 {
						continue
					}
					g := grants[rng.IntN(len(grants))]
					hits := 1 + rng.Int64N(l.Capacity())
					rec, ok, err := returnRecord(sluice.Request{Key: key, Limit: l, Cost: hits}, g)
					if err != nil || !ok {
						t.Fatalf("returnRecord: %v, %v", ok, err)
					}
					ret, err := w.vm.evalProto(leaseProto, []string{w.s.name(key, "")}, string(rec), fmt.Sprint(now))
					if err != nil {
						t.Fatal(err)
					}
					got, want := int64(lua.LVAsNumber(ret)), l.ReturnLease(&model, g, hits, now)
					if got != want {
						t.Fatalf("return of %d hits of the grant %v at %d: lease.lua gave back %d, sluice.ReturnLease %d", hits, g, now, got, want)
					}
					if got > 0 {
						gave++
					}
				default:
					clock.Advance(time.Duration(rng.Int64N(l.Period.Microseconds()*3/2+1)) * time.Microsecond)
				}
				for c := int64(1); c <= l.Capacity(); c += max(l.Capacity()/4, 1) {
					m := model
					want := l.TakeMicros(&m, clock.Now().UnixMicro(), c)
					var dry [1]sluice.Decision
					if err := w.group(ctx, []sluice.Request{{Key: key, Limit: l, Cost: c}}, []int{0}, modeDryRun, dry[:]); err != nil {
						t.Fatal(err)
					}
					if dry[0] != want {
						t.Fatalf("%d hits at %d: %+v, want ReturnLease's state's %+v", c, clock.Now().UnixMicro(), dry[0], want)
					}
				}
			}
		})
	}
	if gave < 60 {
		t.Fatalf("%d returns gave something back: the test exercises too few", gave)
	}
}
