package slots_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/slots"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func TestMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clocktest.New(t0)
	m, err := slots.NewMemory(slots.Config{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	var toks []uint64
	for i := range 3 {
		g, err := m.Acquire(ctx, "k", 3, time.Minute+time.Duration(i)*time.Second)
		if err != nil || !g.OK || g.InFlight != int64(i+1) {
			t.Fatalf("acquire %d: %+v %v", i, g, err)
		}
		toks = append(toks, g.Token)
	}
	g, err := m.Acquire(ctx, "k", 3, time.Minute)
	if err != nil || g.OK || g.InFlight != 3 || g.RetryAfter != time.Minute {
		t.Fatalf("the fourth: %+v %v, want refused, 3 in flight, retry after 1m", g, err)
	}
	if g, _ := m.Acquire(ctx, "other", 3, time.Minute); !g.OK {
		t.Fatal("another key is refused")
	}
	if err := m.Release(ctx, "k", toks[1]); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(ctx, "k", toks[1]); err != nil { // twice: no error, nothing more
		t.Fatal(err)
	}
	if n := m.InFlight("k"); n != 2 {
		t.Fatalf("after a release: %d in flight, want 2", n)
	}
	g, _ = m.Acquire(ctx, "k", 3, time.Minute)
	if !g.OK {
		t.Fatal("the released slot is refused")
	}
	if g, _ := m.Acquire(ctx, "k", 3, time.Minute); g.OK {
		t.Fatal("a fourth slot granted")
	}
	// Holders that never release: their leases end.
	clk.Advance(time.Minute)
	if n := m.InFlight("k"); n != 1 {
		t.Fatalf("after a minute: %d in flight, want 1 (the lease of 1m2s)", n)
	}
	for i := range 2 {
		if g, _ := m.Acquire(ctx, "k", 3, time.Minute); !g.OK {
			t.Fatalf("slot %d after the leases ended refused", i)
		}
	}
}

func TestMemoryFull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clocktest.New(t0)
	m, err := slots.NewMemory(slots.Config{Now: clk.Now, MaxKeys: 32, MaxHolds: 32})
	if err != nil {
		t.Fatal(err)
	}
	// One key and one hold per shard at most: the 33rd key or the 33rd
	// hold finds its shard full sooner or later.
	full := false
	for i := range 1000 {
		_, err := m.Acquire(ctx, string(rune('a'+i%26))+string(rune('a'+i/26)), 5, time.Second)
		if errors.Is(err, slots.ErrFull) {
			full = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !full {
		t.Fatal("1000 keys in a table of 32 and no ErrFull")
	}
	clk.Advance(time.Second) // every lease ends: the sweep makes room
	for i := range 1000 {
		key := string(rune('A'+i%26)) + string(rune('A'+i/26))
		if g, err := m.Acquire(ctx, key, 5, time.Hour); err != nil || !g.OK {
			if i < 1 {
				t.Fatalf("after the leases ended, %s: %+v %v", key, g, err)
			}
			break
		}
	}
	if _, err := slots.NewMemory(slots.Config{MaxKeys: -1}); err == nil {
		t.Fatal("negative MaxKeys accepted")
	}
}
