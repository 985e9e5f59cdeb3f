package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestReturn gives back the unused hits of leases on real Redis and Redis
// Cluster: within the window as if never taken, from the previous window
// of a sliding window, nothing once the window has passed, never below
// zero, nothing for other algorithms.
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
			bucket := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Minute}
			window := t0.Truncate(time.Minute).UnixMicro()
			remaining := func(key string, l sluice.Limit) int64 {
				t.Helper()
				d, err := s.Take(ctx, key, l, 0)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			give := func(want int64, rets ...ret) {
				t.Helper()
				reqs, windows := make([]sluice.Request, len(rets)), make([]int64, len(rets))
				for i, r := range rets {
					reqs[i], windows[i] = sluice.Request{Key: r.Key, Limit: r.Limit, Cost: r.Hits}, r.Window
				}
				got, err := s.ReturnLeases(ctx, reqs, windows)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("Return(%+v) gave back %d, want %d", rets, got, want)
				}
			}
			for _, k := range []string{"{f}", "{s}", "{b}"} {
				l := map[string]sluice.Limit{"{f}": fixed, "{s}": sliding, "{b}": bucket}[k]
				if d, err := s.Take(ctx, k, l, 6); err != nil || !d.Allowed {
					t.Fatalf("a lease of 6: %+v, %v", d, err)
				}
			}
			give(3, ret{Key: "{f}", Limit: fixed, Window: window, Hits: 3})
			if r := remaining("{f}", fixed); r != 7 {
				t.Fatalf("after 3 of 6 given back: %d remaining, want 7", r)
			}
			give(3, ret{Key: "{f}", Limit: fixed, Window: window, Hits: 10}) // only what is counted
			give(0, ret{Key: "{b}", Limit: bucket, Window: window, Hits: 3}) // a bucket is not leased
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
			if _, err := s.ReturnLeases(ctx, []sluice.Request{{Key: "x", Limit: fixed, Cost: 1}}, []int64{-1}); err == nil {
				t.Fatal("a window before the epoch: no error")
			}
		})
	}
}
