package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/clocktest"
)

// TestSlotsNodeDies: a node that dies holding concurrency slots (it never
// releases them) does not leak them past their lease; another node's
// slots come back on release. On one Redis and on a Cluster.
func TestSlotsNodeDies(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clocktest.New(t0)
			cfg := testConfig(clk.Now)
			url := b.url(t)
			dying := open(t, url, cfg) // node A
			live := open(t, url, cfg)  // node B, sharing the keys
			a, bs := dying.SlotCounter(), live.SlotCounter()
			const key, limit, lease = "cid|3:bob", 20, 10 * time.Minute
			for i := range limit - 1 {
				if g, err := a.Acquire(ctx, key, limit, lease); err != nil || !g.OK {
					t.Fatalf("node A, slot %d: %+v %v", i, g, err)
				}
			}
			g, err := bs.Acquire(ctx, key, limit, time.Second)
			if err != nil || !g.OK || g.InFlight != limit {
				t.Fatalf("node B, the 20th: %+v %v", g, err)
			}
			mine := g.Token
			g, err = bs.Acquire(ctx, key, limit, time.Second)
			if err != nil || g.OK || g.InFlight != limit || g.RetryAfter != time.Second {
				t.Fatalf("the 21st: %+v %v, want refused with retry 1s (B's lease)", g, err)
			}
			if err := bs.Release(ctx, key, mine); err != nil {
				t.Fatal(err)
			}
			if g, _ := bs.Acquire(ctx, key, limit, time.Second); !g.OK {
				t.Fatal("B's released slot is refused")
			}
			dying.Close() // node A dies holding 19 slots

			clk.Advance(time.Second) // B's lease ended; A's 19 are held
			if n, err := bs.InFlight(ctx, key); err != nil || n != limit-1 {
				t.Fatalf("after 1s: %d held (%v), want 19", n, err)
			}
			clk.Advance(lease - time.Second - time.Millisecond)
			if g, _ := bs.Acquire(ctx, key, limit, time.Second); !g.OK {
				t.Fatal("the 20th slot, within A's lease, refused")
			}
			if g, _ := bs.Acquire(ctx, key, limit, time.Second); g.OK || g.RetryAfter != time.Millisecond {
				t.Fatalf("the 21st within A's lease: %+v, want refused with retry 1ms", g)
			}
			clk.Advance(time.Millisecond) // A's leases end
			for i := range limit - 1 {
				if g, err := bs.Acquire(ctx, key, limit, time.Second); err != nil || !g.OK {
					t.Fatalf("after A's leases, slot %d: %+v %v", i, g, err)
				}
			}
			if g, _ := bs.Acquire(ctx, key, limit, time.Second); g.OK {
				t.Fatal("a 21st slot granted")
			}
		})
	}
}
