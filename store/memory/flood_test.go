package memory

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// floodBound is docs/stores.md's bound: the most times a client over a limit
// of its own, which keeps sending, is admitted while a flood inserts
// flood new keys into its shard, which holds held entries when full: its
// limit, plus its limit again each time the store forgets it, which takes
// at least held/2 new keys in its shard since its last request.
func floodBound(limit int64, flood, held int) int64 {
	return limit * (1 + int64(flood/(held/2)))
}

// TestFloodKeepsLimitedClient floods a store with distinct keys, through
// TakeAll as decide sends them, while a client over its limit keeps
// sending, and counts the client's admissions: a denied request counts as
// use, so the flood cannot make the store forget the client and hand it a
// fresh allowance.
func TestFloodKeepsLimitedClient(t *testing.T) {
	user := sluice.Limit{Rate: 5, Period: time.Hour} // fixed_window, 5 an hour
	for _, tc := range []struct {
		name      string
		shards    int
		flood     int
		every     int   // the client sends once per this many flood keys
		exhaust   bool  // the flood keys are each taken to their limit too
		wantExact bool  // the client is never forgotten: admitted exactly 5 times
		maxBytes  int64 // a byte budget instead of 1,000 entries
	}{
		{name: "interleaved, one shard", shards: 1, flood: 5000, every: 1, wantExact: true},
		{name: "interleaved, 8 shards", shards: 8, flood: 20000, every: 1, wantExact: true},
		{name: "every 400 keys, one shard", shards: 1, flood: 20000, every: 400, wantExact: true},
		{name: "exhausted flood keys", shards: 1, flood: 5000, every: 4, exhaust: true, wantExact: true},
		{name: "sparse sender, one shard", shards: 1, flood: 20000, every: 1500},
		{name: "sparse sender, 4 shards", shards: 4, flood: 20000, every: 1500},
		{name: "byte budget, interleaved", shards: 1, flood: 20000, every: 1, wantExact: true, maxBytes: 256 << 10},
		{name: "byte budget, every 300 keys", shards: 2, flood: 20000, every: 300, wantExact: true, maxBytes: 512 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const maxEntries = 1000
			c := clocktest.New(t0)
			c.Set(t0.Truncate(time.Hour)) // an hour's start: one window for the whole test
			cfg := Config{MaxEntries: maxEntries, Shards: tc.shards, Now: c.Now}
			if tc.maxBytes > 0 {
				cfg.MaxEntries, cfg.MaxBytes = 0, tc.maxBytes
			}
			s := newStore(t, cfg)
			ctx := context.Background()
			floodLimit := sluice.Limit{Rate: 5, Period: time.Hour}
			ds := make([]sluice.Decision, 1)
			take := func(key string, l sluice.Limit) bool {
				if err := s.TakeAll(ctx, []sluice.Request{{Key: key, Limit: l, Cost: 1}}, ds); err != nil {
					t.Fatal(err)
				}
				return ds[0].Allowed
			}
			seed := rand.Uint64()
			rng := rand.New(rand.NewPCG(seed, 7))
			admitted, sent, inShard := int64(0), 0, 0
			userShard := s.hash("user:mallory") & s.mask
			for i := range tc.flood {
				if i%tc.every == 0 {
					sent++
					if take("user:mallory", user) {
						admitted++
					}
				}
				k := randomIPv6(rng)
				if s.hash(k)&s.mask == userShard {
					inShard++
				}
				n := 1
				if tc.exhaust {
					n = int(floodLimit.Rate) + 1
				}
				for range n {
					take(k, floodLimit)
				}
				c.Advance(time.Millisecond) // 20 s in all: still within the hour
			}
			held := entries(t, s)
			t.Logf("seed %d: %d sent, %d admitted; the store holds %d entries", seed, sent, admitted, held)
			if most := maxEntries; tc.maxBytes == 0 && held < most*3/4 {
				t.Fatalf("the flood left %d entries of %d: the store evicts far too much", held, most)
			}
			if bytes, most := accounted(s); tc.maxBytes > 0 && bytes < most*3/4 {
				t.Fatalf("the flood left %d bytes of %d: the store evicts far too much", bytes, most)
			}
			if tc.wantExact && admitted != user.Rate {
				t.Fatalf("admitted %d times under a limit of %d: the flood made the store forget the client", admitted, user.Rate)
			}
			if bound := floodBound(user.Rate, inShard, held/tc.shards); admitted > bound {
				t.Fatalf("admitted %d times, above the stated bound %d", admitted, bound)
			}
		})
	}
}

// TestDeniedBatchMarksUse checks that a denied TakeAll counts as use of
// every key it holds, and leaves their states as they were.
func TestDeniedBatchMarksUse(t *testing.T) {
	c := clocktest.New(t0)
	s := newStore(t, Config{MaxEntries: 16, Shards: 1, Now: c.Now})
	ctx := context.Background()
	l := sluice.Limit{Rate: 1, Period: time.Hour}
	ds := make([]sluice.Decision, 2)
	reqs := []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}}
	if err := s.TakeAll(ctx, reqs, ds); err != nil || !ds[0].Allowed {
		t.Fatalf("first batch: %+v, %v", ds, err)
	}
	sh := &s.shards[0]
	for _, k := range []string{"a", "b"} {
		i, _ := sh.lookup(s.hash(k), k)
		e := sh.at(i)
		e.meta = meta(e.alg(), sh.tick-100) // last used 100 insertions ago
	}
	if err := s.TakeAll(ctx, reqs, ds); err != nil || ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("second batch: %+v, %v", ds, err)
	}
	for _, k := range []string{"a", "b"} {
		i, ok := sh.lookup(s.hash(k), k)
		if !ok || sh.at(i).stamp() != sh.tick {
			t.Errorf("key %s: held %v, not marked used by a denied batch", k, ok)
		}
	}
	if d, _ := sluice.Take(ctx, s, "a", l, 0); d.Remaining != 0 {
		t.Fatalf("a denied batch changed a state: %+v", d)
	}
}
