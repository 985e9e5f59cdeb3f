package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestSyncCounts writes back hits admitted without Redis, on real Redis
// and Redis Cluster: they count as a Take's hits do, in the window they
// were admitted in, a sliding window's previous one weighted; hits of a
// window past are dropped; a bucket is refused.
func TestSyncCounts(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			clk := clocktest.New(t0)
			s := open(t, b.url(t), testConfig(clk.Now))
			ctx := context.Background()
			fixed := sluice.Limit{Rate: 10, Period: time.Minute}
			sliding := sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Minute}
			w := t0.Truncate(time.Minute).UnixMicro()
			sync := func(want int64, r sluice.Request, window int64) {
				t.Helper()
				got, now, err := s.SyncCounts(ctx, []sluice.Request{r}, []int64{window})
				if err != nil {
					t.Fatal(err)
				}
				if got[0] != want || now != clk.Now().UnixMicro() {
					t.Fatalf("SyncCounts(%+v) = %d at %d, want %d at %d", r, got[0], now, want, clk.Now().UnixMicro())
				}
			}
			if d, err := s.Take(ctx, "{f}", fixed, 2); err != nil || !d.Allowed {
				t.Fatalf("%+v, %v", d, err)
			}
			sync(7, sluice.Request{Key: "{f}", Limit: fixed, Cost: 5}, w)
			if d, err := s.Take(ctx, "{f}", fixed, 0); err != nil || d.Remaining != 3 {
				t.Fatalf("a Take after 2 taken and 5 written back: %+v, %v; want 3 remaining", d, err)
			}
			sync(7, sluice.Request{Key: "{f}", Limit: fixed}, w)
			sync(4, sluice.Request{Key: "{s}", Limit: sliding, Cost: 4}, w)
			clk.Set(t0.Add(time.Minute)) // 30 s into the next window: the previous weighs half
			sync(2, sluice.Request{Key: "{s}", Limit: sliding}, w)
			sync(5, sluice.Request{Key: "{s}", Limit: sliding, Cost: 6}, w) // (4+6)/2
			sync(0, sluice.Request{Key: "{f}", Limit: fixed, Cost: 3}, w)   // a window past
			sync(6, sluice.Request{Key: "{s}", Limit: sliding, Cost: 1}, w+60e6)
			if _, _, err := s.SyncCounts(ctx, []sluice.Request{{Key: "{b}", Limit: sluice.Limit{Algorithm: sluice.GCRA, Rate: 1, Period: time.Second}}}, []int64{w}); err == nil {
				t.Fatal("a gcra limit: no error")
			}
		})
	}
}
