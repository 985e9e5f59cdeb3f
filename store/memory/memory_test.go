package memory

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// t0 is the fake clocks' start.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newStore returns a store that decides by now and is closed when t ends.
func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"default", Config{MaxEntries: 1 << 16, Shards: 16}},
		{"one shard", Config{MaxEntries: 1 << 10, Shards: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
				cfg := tc.cfg
				cfg.Now = now
				return newStore(t, cfg)
			})
		})
	}
}

func TestNewRejects(t *testing.T) {
	ok := DefaultConfig()
	for _, tc := range []struct {
		name   string
		change func(*Config)
	}{
		{"negative bytes", func(c *Config) { c.MaxBytes = -1 }},
		{"negative entries", func(c *Config) { c.MaxEntries = -1 }},
		{"shards not a power of two", func(c *Config) { c.Shards = 12 }},
		{"negative shards", func(c *Config) { c.Shards = -2 }},
		{"more shards than entries", func(c *Config) { c.MaxEntries, c.Shards = 4, 8 }},
		{"too few bytes per shard", func(c *Config) { c.MaxBytes, c.Shards = 1<<20, 64 }},
		{"negative clock resolution", func(c *Config) { c.ClockResolution = -time.Millisecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.change(&cfg)
			if s, err := New(cfg); err == nil {
				s.Close()
				t.Fatalf("New(%+v): no error", cfg)
			}
		})
	}
}

func TestDefaultConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"DefaultConfig", DefaultConfig()},
		{"zero", Config{}}, // every zero field means its default
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.cfg)
			if n := len(s.shards); n&(n-1) != 0 || n < 16 {
				t.Fatalf("%d shards by default: want a power of two, at least 16", n)
			}
			if s.clock == nil {
				t.Fatal("no coarse clock by default")
			}
			var total int64
			for i := range s.shards {
				if b := s.shards[i].budget; b < math.MaxUint32/4 {
					t.Fatalf("shard %d: an entry budget of %d by default, want none", i, b)
				}
				total += s.shards[i].maxBytes
			}
			if want := liveBytes(defaultMaxBytes); total > want || total < want-int64(len(s.shards)) {
				t.Fatalf("the shards may hold %d bytes of live data, want %d (256 MiB and GC headroom)", total, want)
			}
			d, err := sluice.Take(context.Background(), s, "k", sluice.Limit{Rate: 2, Period: time.Minute}, 1)
			if err != nil || !d.Allowed || d.Remaining != 1 {
				t.Fatalf("Take on the default store: %+v, %v", d, err)
			}
		})
	}
	if c := DefaultConfig(); c.MaxBytes != defaultMaxBytes || c.ClockResolution != time.Millisecond || c.Shards != defaultShards(defaultMaxBytes, 0) {
		t.Fatalf("DefaultConfig() = %+v", c)
	}
}

func TestClosed(t *testing.T) {
	s, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	l := sluice.Limit{Rate: 1, Period: time.Second}
	if _, err := sluice.Take(context.Background(), s, "k", l, 1); err == nil {
		t.Fatal("Take after Close: no error")
	}
	if err := s.TakeAll(context.Background(), []sluice.Request{{Key: "k", Limit: l, Cost: 1}}, make([]sluice.Decision, 1)); err == nil {
		t.Fatal("TakeAll after Close: no error")
	}
}

// randomIPv6 returns a random IPv6 address, as a flood of clients sends.
func randomIPv6(rng *rand.Rand) string {
	var a [16]byte
	for i := range a {
		a[i] = byte(rng.Uint32())
	}
	return netip.AddrFrom16(a).String()
}

// entries returns the number of live entries and checks the shards'
// bookkeeping: the index finds every live entry, and only those, every
// other slot is free, and the bytes each shard accounts for are those of
// its pages, index, keys and logs, within its budget.
func entries(t testing.TB, s *Store) int {
	t.Helper()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if sh.count > sh.budget {
			t.Errorf("shard %d holds %d entries, budget %d", i, sh.count, sh.budget)
		}
		if got, want := int(sh.count)+len(sh.free), int(sh.used); got != want {
			t.Errorf("shard %d: %d live + %d free slots, %d used", i, sh.count, len(sh.free), sh.used)
		}
		linked := 0
		for _, w := range sh.index {
			if w != 0 {
				linked++
			}
		}
		live := 0
		vars := int64(0)
		for j := range sh.used {
			e := sh.at(j)
			if !e.live() {
				continue
			}
			live++
			vars += keyBytes(e.key, e.state.HeapBytes())
			if k, ok := sh.lookup(s.hash(e.key), e.key); !ok || k != j {
				t.Errorf("shard %d: slot %d holds %q, the index finds %d, %v", i, j, e.key, k, ok)
			}
		}
		if linked != live || live != int(sh.count) {
			t.Errorf("shard %d: %d in the index, %d live entries, count %d", i, linked, live, sh.count)
		}
		if want := int64(len(sh.pages))*pageBytes + 8*int64(len(sh.index)) + vars; sh.bytes != want {
			t.Errorf("shard %d accounts for %d bytes, holds %d (%d of keys and logs)", i, sh.bytes, want, vars)
		}
		if sh.bytes > sh.maxBytes {
			t.Errorf("shard %d holds %d bytes, budget %d", i, sh.bytes, sh.maxBytes)
		}
		n += live
		sh.mu.Unlock()
	}
	return n
}

// holds reports whether the store holds key.
func (s *Store) holds(key string) bool {
	h := s.hash(key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, ok := sh.lookup(h, key)
	return ok
}

func TestFloodStaysWithinBudget(t *testing.T) {
	const maxEntries = 1 << 12
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	c := clocktest.New(t0)
	s := newStore(t, Config{MaxEntries: maxEntries, Shards: 8, Now: c.Now})
	l := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Hour}
	ctx := context.Background()
	// A client in steady use while the flood goes on.
	hot := "2001:db8::1"
	var hotAdmitted int64
	for i := range 20 * maxEntries {
		if _, err := sluice.Take(ctx, s, randomIPv6(rng), l, 1); err != nil {
			t.Fatal(err)
		}
		if i%256 == 0 {
			d, err := sluice.Take(ctx, s, hot, l, 0)
			if err != nil {
				t.Fatal(err)
			}
			if i > 0 && d.Remaining != l.Rate-1 {
				t.Fatalf("after %d flood keys, the client in use has %d remaining, want %d: it was forgotten", i, d.Remaining, l.Rate-1)
			}
			if i == 0 {
				if d, _ := sluice.Take(ctx, s, hot, l, 1); d.Allowed {
					hotAdmitted++
				}
			}
		}
		if i%1024 == 0 {
			c.Advance(time.Millisecond)
		}
		if i%(maxEntries+maxEntries/3) == 0 {
			entries(t, s) // the index and the slab agree
		}
	}
	if hotAdmitted != 1 {
		t.Fatalf("the client in use was admitted %d times, want 1", hotAdmitted)
	}
	n := entries(t, s)
	if n > maxEntries {
		t.Fatalf("%d entries after the flood, budget %d", n, maxEntries)
	}
	if n < maxEntries/2 {
		t.Fatalf("%d entries after the flood of %d keys, budget %d: evicting far too much", n, 20*maxEntries, maxEntries)
	}
}

func TestExpiredEvictedBeforeLive(t *testing.T) {
	const budget = 64
	c := clocktest.New(t0)
	s := newStore(t, Config{MaxEntries: budget, Shards: 1, Now: c.Now})
	ctx := context.Background()
	short := sluice.Limit{Rate: 5, Period: time.Second}
	long := sluice.Limit{Rate: 5, Period: time.Hour}
	c.Set(t0.Truncate(time.Hour).Add(time.Hour)) // start of an hour
	var live, expired []string
	for i := range budget {
		k := fmt.Sprintf("key:%d", i)
		l := long
		if i%2 == 0 {
			l, expired = short, append(expired, k)
		} else {
			live = append(live, k)
		}
		if _, err := sluice.Take(ctx, s, k, l, 1); err != nil {
			t.Fatal(err)
		}
	}
	c.Advance(5 * time.Second) // the short limits' states are fresh again
	for i := range budget / 4 {
		if _, err := sluice.Take(ctx, s, fmt.Sprintf("new:%d", i), long, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range live {
		if !s.holds(k) {
			t.Errorf("live key %s evicted while expired keys were there", k)
		}
	}
	gone := 0
	for _, k := range expired {
		if !s.holds(k) {
			gone++
		}
	}
	if gone < budget/4 {
		t.Errorf("%d expired keys evicted for %d new ones", gone, budget/4)
	}
	if n := entries(t, s); n > budget {
		t.Fatalf("%d entries, budget %d", n, budget)
	}
}

// TestEvictionOnlyForgets runs random traffic through a store much smaller
// than its keys, and checks every decision: on a key the store holds, it is
// the decision of an unbounded store (a local state that saw every request
// the store applied); on a key the store has forgotten, it is a fresh key's
// decision, and at least as lenient as the unbounded store's.
func TestEvictionOnlyForgets(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog, sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			c := clocktest.New(t0)
			s := newStore(t, Config{MaxEntries: 32, Shards: 2, Now: c.Now})
			l := sluice.Limit{Algorithm: a, Rate: 3, Period: 500 * time.Millisecond}
			unbounded := map[string]*sluice.State{}
			forgotten := 0
			for range 10000 {
				c.Advance(time.Duration(rng.Int64N(int64(20 * time.Millisecond))).Truncate(time.Microsecond))
				k := fmt.Sprintf("key:%d", rng.IntN(64))
				cost := rng.Int64N(3)
				ref := unbounded[k]
				if ref == nil {
					ref = &sluice.State{}
					unbounded[k] = ref
				}
				held := s.holds(k)
				got, err := sluice.Take(context.Background(), s, k, l, cost)
				if err != nil {
					t.Fatal(err)
				}
				want := l.Take(ref, c.Now(), cost)
				if held {
					if got != want {
						t.Fatalf("key %s, held: %+v, want %+v", k, got, want)
					}
					continue
				}
				var fresh sluice.State
				if f := l.Take(&fresh, c.Now(), cost); got != f {
					t.Fatalf("key %s, forgotten: %+v, want a fresh key's %+v", k, got, f)
				}
				if want.Allowed && !got.Allowed || got.Remaining < want.Remaining {
					t.Fatalf("key %s, forgotten: %+v is stricter than %+v", k, got, want)
				}
				if got != want {
					forgotten++
				}
				*ref = fresh // the store's state from now on
			}
			if forgotten == 0 {
				t.Fatal("no decision on a forgotten key differed: the test does not test eviction")
			}
		})
	}
}

func TestExpiry(t *testing.T) {
	const unit = time.Duration(1) << expiryShift
	for _, tc := range []struct {
		name string
		now  int64 // µs
		d    time.Duration
		want uint32
	}{
		{"zero", 0, 0, 0},
		{"a nanosecond", 0, 1, 1},
		{"one unit", 0, unit, 1},
		{"one unit and a nanosecond", 0, unit + 1, 2},
		{"now and reset add up to a unit", 1e6, unit - time.Second, 1},
		{"never", 1e15, sluice.Never, 1<<32 - 1},
		{"far future", 1 << 62 / 1000, time.Second, 1<<32 - 1},
		{"before the epoch", -1000, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := expiry(tc.now, tc.d); got != tc.want {
				t.Fatalf("expiry(%d, %v) = %d, want %d", tc.now, tc.d, got, tc.want)
			}
		})
	}
}

// TestExpiryNeverEarly checks that an entry is not expired before its
// reset ends, and is soon after.
func TestExpiryNeverEarly(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		now := t0.UnixMicro() + rng.Int64N(1e12)
		d := time.Duration(rng.Int64N(int64(48 * time.Hour)))
		exp := expiry(now, d)
		endNs := now*1000 + int64(d)
		before := (endNs - 1) / 1000 // the last µs before the end
		if expiredBy(before) >= exp {
			t.Fatalf("now %dµs, reset %v: expired at %dµs, before the reset ends", now, d, before)
		}
		after := endNs/1000 + int64(2*(1<<expiryShift))/1000
		if expiredBy(after) < exp {
			t.Fatalf("now %dµs, reset %v: not expired at %dµs, two units after the reset ends", now, d, after)
		}
	}
}

func TestZeroAllocations(t *testing.T) {
	c := clocktest.New(t0)
	s := newStore(t, Config{MaxEntries: 1 << 10, Shards: 4, Now: c.Now})
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			l := sluice.Limit{Algorithm: a, Rate: 1000, Period: time.Second}
			reqs := []sluice.Request{{Key: "a:" + a.String(), Limit: l, Cost: 1}, {Key: "b:" + a.String(), Limit: l, Cost: 1}}
			ds := make([]sluice.Decision, 2)
			if err := s.TakeAll(ctx, reqs, ds); err != nil {
				t.Fatal(err)
			}
			if n := testing.AllocsPerRun(100, func() {
				if err := s.TakeAll(ctx, reqs[:1], ds); err != nil {
					t.Fatal(err)
				}
			}); n != 0 {
				t.Errorf("TakeAll of one request on a held key: %v allocations", n)
			}
			if n := testing.AllocsPerRun(100, func() {
				if err := s.TakeAll(ctx, reqs, ds); err != nil {
					t.Fatal(err)
				}
			}); n != 0 {
				t.Errorf("TakeAll on held keys: %v allocations", n)
			}
		})
	}
}
