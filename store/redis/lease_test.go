package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestReturn gives back the unused hits of leases on real Redis and Redis
// Cluster: within the window as if never taken, from the previous window
// of a sliding window, nothing once the window has passed, never below
// zero, nothing for a sliding log.
func TestReturn(t *testing.T) {
	type ret struct {
		Key    string
		Limit  sluice.Limit
		Window int64
		Hits   int64
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			clk := clocktest.New(t0)
			s := open(t, b.url(t), testConfig(clk.Now))
			ctx := context.Background()
			fixed := sluice.Limit{Rate: 10, Period: time.Minute}
			sliding := sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Minute}
			bucket := sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 10, Period: time.Minute}
			window := t0.Truncate(time.Minute).UnixMicro()
			remaining := func(key string, l sluice.Limit) int64 {
				t.Helper()
				d, err := sluice.Take(ctx, s, key, l, 0)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			give := func(want int64, rets ...ret) {
				t.Helper()
				reqs, grants := make([]sluice.Request, len(rets)), make([]sluice.State, len(rets))
				for i, r := range rets {
					reqs[i], grants[i] = sluice.Request{Key: r.Key, Limit: r.Limit, Cost: r.Hits}, sluice.StateOf(r.Window, 0, 0)
				}
				got, err := s.ReturnLeases(ctx, reqs, grants)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("Return(%+v) gave back %d, want %d", rets, got, want)
				}
			}
			for _, k := range []string{"{f}", "{s}", "{b}"} {
				l := map[string]sluice.Limit{"{f}": fixed, "{s}": sliding, "{b}": bucket}[k]
				if d, err := sluice.Take(ctx, s, k, l, 6); err != nil || !d.Allowed {
					t.Fatalf("a lease of 6: %+v, %v", d, err)
				}
			}
			give(3, ret{Key: "{f}", Limit: fixed, Window: window, Hits: 3})
			if r := remaining("{f}", fixed); r != 7 {
				t.Fatalf("after 3 of 6 given back: %d remaining, want 7", r)
			}
			give(3, ret{Key: "{f}", Limit: fixed, Window: window, Hits: 10}) // only what is counted
			give(0, ret{Key: "{b}", Limit: bucket, Window: window, Hits: 3}) // a sliding log is not leased
			give(0, ret{Key: "{f}", Limit: fixed, Window: window - 60e6, Hits: 3})
			give(0, ret{Key: "{nobody}", Limit: fixed, Window: window, Hits: 3})
			clk.Set(t0.Add(time.Minute)) // the next window: the sliding window's 6 weigh half
			give(0, ret{Key: "{f}", Limit: fixed, Window: window, Hits: 1})
			before := remaining("{s}", sliding)
			give(2, ret{Key: "{s}", Limit: sliding, Window: window, Hits: 2})
			if r := remaining("{s}", sliding); r <= before {
				t.Fatalf("a sliding window's previous count given back: %d remaining, was %d", r, before)
			}
			clk.Set(t0.Add(2 * time.Minute))
			give(0, ret{Key: "{s}", Limit: sliding, Window: window, Hits: 2})
			if _, err := s.ReturnLeases(ctx, []sluice.Request{{Key: "x", Limit: fixed, Cost: 1}}, []sluice.State{sluice.StateOf(-1, 0, 0)}); err == nil {
				t.Fatal("a window before the epoch: no error")
			}
		})
	}
}

// TestReturnBuckets gives back the unused hits of leases of bucket limits
// on real Redis and Redis Cluster: right after the grant, exactly (the key
// then decides as if only the used hits had been taken, as the exact
// algorithm on a state that took only those); after a denial, the same;
// after another admission, nothing; late, only the slots still ahead of
// now; nothing under another limit or for more than the capacity.
func TestReturnBuckets(t *testing.T) {
	for _, b := range backends() {
		for _, a := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
			t.Run(b.name+"/"+a.String(), func(t *testing.T) {
				clk := clocktest.New(t0)
				s := open(t, b.url(t), testConfig(clk.Now))
				ctx := context.Background()
				l := sluice.Limit{Algorithm: a, Rate: 10, Period: time.Minute, Burst: 20} // a hit every 6 s
				key := 0
				// lease takes a lease of k on a fresh key after pre hits,
				// and returns the key, the grant's state, and a model of
				// the key had it taken only used of the lease's hits.
				lease := func(pre, k, used int64) (string, sluice.State, sluice.State) {
					t.Helper()
					key++
					name := fmt.Sprintf("{%s%d}", a, key)
					var model sluice.State
					now := clk.Now().UnixMicro()
					if pre > 0 {
						if d, err := sluice.Take(ctx, s, name, l, pre); err != nil || !d.Allowed {
							t.Fatalf("%d before the lease: %+v, %v", pre, d, err)
						}
						l.TakeMicros(&model, now, pre)
					}
					d, st, _, ok, err := s.TakeState(ctx, sluice.Request{Key: name, Limit: l, Cost: k})
					if err != nil || !d.Allowed || !ok {
						t.Fatalf("a lease of %d: %+v, %v, %v", k, d, ok, err)
					}
					l.TakeMicros(&model, now, used)
					return name, st, model
				}
				giveOf := func(l sluice.Limit, name string, st sluice.State, hits, want int64) {
					t.Helper()
					got, err := s.ReturnLeases(ctx, []sluice.Request{{Key: name, Limit: l, Cost: hits}}, []sluice.State{st})
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Fatalf("returning %d of %s gave back %d, want %d", hits, name, got, want)
					}
				}
				give := func(name string, st sluice.State, hits, want int64) {
					t.Helper()
					giveOf(l, name, st, hits, want)
				}
				// same checks that the key decides as model does, for
				// costs 1 to 20 at now (a dry run: TakeAll with a denied
				// request consumes nothing)
				same := func(name string, model sluice.State) {
					t.Helper()
					for cost := int64(1); cost <= 20; cost++ {
						m := model
						want := l.TakeMicros(&m, clk.Now().UnixMicro(), cost)
						var ds [2]sluice.Decision
						err := s.TakeAll(ctx, []sluice.Request{{Key: name, Limit: l, Cost: cost}, {Key: name, Limit: l, Cost: 21}}, ds[:])
						if err != nil {
							t.Fatal(err)
						}
						if ds[0] != want {
							t.Fatalf("%s, %d hits: %+v, want %+v as if only the used hits were taken", name, cost, ds[0], want)
						}
					}
				}
				clk.Set(t0)
				k, st, model := lease(3, 8, 2)
				give(k, st, 6, 6)
				same(k, model)
				give(k, st, 6, 0) // twice: the key's state is no longer the grant's

				clk.Set(t0)
				k, st, model = lease(0, 8, 1)
				if d, err := sluice.Take(ctx, s, k, l, 15); err != nil || d.Allowed {
					t.Fatalf("15 more on 12 left: %+v, %v", d, err)
				}
				clk.Set(t0.Add(time.Second))
				give(k, st, 7, 7) // a denial since: still the grant's slots
				same(k, model)

				clk.Set(t0)
				k, st, _ = lease(0, 8, 1)
				if d, err := sluice.Take(ctx, s, k, l, 1); err != nil || !d.Allowed {
					t.Fatalf("1 more: %+v, %v", d, err)
				}
				give(k, st, 7, 0) // admitted since: nothing

				clk.Set(t0)
				k, st, model = lease(0, 5, 1) // slots at t0 + 0, 6, 12, 18, 24 s
				clk.Set(t0.Add(13 * time.Second))
				give(k, st, 4, 2) // late: the slot at 6 has passed, 12 is partly past; 18 and 24 come back whole
				same(k, model)

				clk.Set(t0)
				k, st, _ = lease(0, 5, 1)
				other := l
				other.Rate = 11
				giveOf(other, k, st, 4, map[sluice.Algorithm]int64{sluice.GCRA: 4}[a]) // gcra's state does not name its limit; a bucket's names its gcd
				k, st, _ = lease(0, 5, 1)
				give(k, st, 21, 0)
			})
		}
	}
}
