package localfirst

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/storetest"
	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests (rueidis's own two
// that end by themselves after a close are not ours; see store/redis).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}

func backendURLs() map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"single":  func(t *testing.T) string { return "redis://" + testenv.RedisAddr(t) + "/0" },
		"cluster": func(t *testing.T) string { return "redis+cluster://" + strings.Join(testenv.RedisClusterAddrs(t), ",") },
	}
}

// memURL names the backend without Redis: the nodes of one key prefix
// share one memStore, as servers share one Redis.
const memURL = "mem:"

// memStores holds the memStore of each key prefix (memURL).
var memStores sync.Map

// contractURLs returns backendURLs and memURL, for the contract suites,
// which run under -short without Redis on memURL.
func contractURLs() map[string]func(t *testing.T) string {
	urls := backendURLs()
	urls["memory"] = func(*testing.T) string { return memURL }
	return urls
}

// openRedis opens a Redis store of its own key prefix on url that decides
// by now (nil: Redis's TIME), closed when the test ends.
func openRedis(t testing.TB, url string, now func() time.Time) *redis.Store {
	t.Helper()
	return openRedisPrefix(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), now)
}

// openRedisPrefix opens a Redis store on url with the key prefix prefix,
// deciding by now (nil: Redis's TIME), closed when the test ends.
func openRedisPrefix(t testing.TB, url, prefix string, now func() time.Time) *redis.Store {
	t.Helper()
	cfg := redis.DefaultConfig()
	cfg.KeyPrefix = prefix
	cfg.Now = now
	cfg.ExpiryMargin = 10 * time.Minute // the fake clocks run ahead of Redis's
	// Bounds on a hang only: the defaults (1s) failed handshakes and calls
	// on a loaded machine.
	cfg.DialTimeout, cfg.Timeout = 10*time.Second, 10*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := redis.Open(ctx, url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openNodes returns n Stores of cfg, deciding by now, over Redis stores
// of their own on url sharing prefix (memURL: the memStore of prefix);
// each closed (a lease returned, a hit written back), then its Redis
// store, when the test ends.
func openNodes(t testing.TB, url, prefix string, now func() time.Time, n int, cfg Config) []*Store {
	t.Helper()
	nodes := make([]*Store, n)
	for i := range nodes {
		var r sluice.Store
		if url == memURL {
			m, _ := memStores.LoadOrStore(prefix, newMemStore(now))
			r = m.(*memStore)
		} else {
			r = openRedisPrefix(t, url, prefix, now)
		}
		c := cfg
		c.Now = now
		s, err := New(r, c)
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = s
		t.Cleanup(func() { // before r's own, registered first
			if err := s.Close(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	return nodes
}

// newStore returns next decorated by cfg, failing t on an error.
func newStore(t *testing.T, next sluice.Store, cfg Config) *Store {
	t.Helper()
	s, err := New(next, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestNearCacheIdentical drives one random request stream through a
// store decorated by the near cache and through the same store alone, on
// one Redis with one injected clock, and compares every decision; the
// cache must have answered a good share of them.
func TestNearCacheIdentical(t *testing.T) {
	for name, url := range backendURLs() {
		t.Run(name, func(t *testing.T) {
			u := url(t)
			c := clocktest.New(time.Date(2026, 3, 14, 12, 30, 30, 0, time.UTC))
			exact := openRedis(t, u, c.Now)
			near := newStore(t, openRedis(t, u, c.Now), Config{Now: c.Now})
			rng := rand.New(rand.NewPCG(rand.Uint64(), 13))
			limits := []sluice.Limit{
				{Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Second},
				{Algorithm: sluice.SlidingWindow, Rate: 7, Period: 300*time.Millisecond + 7*time.Microsecond},
				{Algorithm: sluice.SlidingLog, Rate: 5, Period: time.Second},
				{Algorithm: sluice.TokenBucket, Rate: 5, Period: time.Second, Burst: 10},
				{Algorithm: sluice.LeakyBucket, Rate: 4, Period: time.Second, Burst: 8},
				{Algorithm: sluice.GCRA, Rate: 6, Period: time.Second, Burst: 6},
			}
			ctx := context.Background()
			for i := range 4000 {
				// A hot key per limit and a few cold ones, all of one hash tag
				// per limit so that cluster batches stay on a slot.
				li := rng.IntN(len(limits))
				l := limits[li]
				key := fmt.Sprintf("{l%d}:hot", li)
				if rng.IntN(4) == 0 {
					key = fmt.Sprintf("{l%d}:cold%d", li, rng.IntN(5))
				}
				switch r := rng.IntN(100); {
				case r == 0:
					c.Advance((l.Period + time.Duration(rng.Int64N(int64(l.Period)))).Truncate(time.Microsecond))
				case r < 10:
					c.Advance(time.Duration(rng.Int64N(int64(l.Period / time.Duration(l.Rate)))).Truncate(time.Microsecond))
				case r < 40:
					c.Advance(time.Duration(rng.Int64N(int64(time.Millisecond))).Truncate(time.Microsecond))
				}
				cost := int64(1)
				switch r := rng.IntN(20); {
				case r == 0:
					cost = 0
				case r == 1:
					cost = 2 + rng.Int64N(3)
				case r == 2:
					cost = 20
				}
				if rng.IntN(10) == 0 { // a batch of two keys of one tag
					reqs := []sluice.Request{{Key: key, Limit: l, Cost: cost}, {Key: fmt.Sprintf("{l%d}:hot", li), Limit: l, Cost: 1}}
					got, want := make([]sluice.Decision, 2), make([]sluice.Decision, 2)
					if err := near.TakeAll(ctx, reqs, got); err != nil {
						t.Fatal(err)
					}
					if err := exact.TakeAll(ctx, reqs, want); err != nil {
						t.Fatal(err)
					}
					if got[0] != want[0] || got[1] != want[1] {
						t.Fatalf("request %d, TakeAll(%v):\n got %+v\nwant %+v", i, reqs, got, want)
					}
					continue
				}
				got, err := sluice.Take(ctx, near, key, l, cost)
				if err != nil {
					t.Fatal(err)
				}
				want, err := sluice.Take(ctx, exact, key, l, cost)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("request %d, Take(%q, %v, %d):\n got %+v\nwant %+v", i, key, l, cost, got, want)
				}
			}
			st := near.Stats()
			t.Logf("%+v", st)
			if st.NearHits < 300 {
				t.Fatalf("the near cache answered %d of 4000 requests: the stream does not test it", st.NearHits)
			}
		})
	}
}

// TestNearCacheConformance runs the store suite, both tiers, on the near
// cache over Redis and Redis Cluster with the suite's clock: an exact
// store. Its nodes are separate decorators over separate Redis stores.
func TestNearCacheConformance(t *testing.T) {
	for name, url := range backendURLs() {
		t.Run(name, func(t *testing.T) {
			u := url(t)
			prefix := fmt.Sprintf("localfirsttest:%x:", rand.Uint64())
			open := func(t *testing.T, now func() time.Time) sluice.Store {
				cfg := redis.DefaultConfig()
				cfg.KeyPrefix, cfg.Now, cfg.ExpiryMargin = prefix, now, 10*time.Minute
				// Bounds on a hang only: the defaults (1s) failed handshakes and calls
				// on a loaded machine.
				cfg.DialTimeout, cfg.Timeout = 10*time.Second, 10*time.Second
				r, err := redis.Open(context.Background(), u, cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close() })
				return newStore(t, r, Config{Now: now})
			}
			t.Run("Contract", func(t *testing.T) {
				storetest.RunContract(t, func(t *testing.T, now func() time.Time, n int) []sluice.Store {
					nodes := make([]sluice.Store, n)
					for i := range nodes {
						nodes[i] = open(t, now)
					}
					return nodes
				}, storetest.Bound{})
			})
			t.Run("Exact", func(t *testing.T) { storetest.RunExact(t, open) })
		})
	}
}

// TestNearCacheRedisTime checks the near cache over Redis deciding by its
// own TIME, the clock of production: a hot key admits exactly its limit,
// the cache answers the rest, and its denials agree with the store's.
func TestNearCacheRedisTime(t *testing.T) {
	for name, url := range backendURLs() {
		t.Run(name, func(t *testing.T) {
			r := openRedis(t, url(t), nil)
			near := newStore(t, r, Config{})
			l := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 5, Period: time.Hour, Burst: 5}
			admitted := 0
			for range 100 {
				d, err := sluice.Take(context.Background(), near, "{hot}", l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
					continue
				}
				// What Redis says now, without the cache, at cost 0 (a
				// report: the same state).
				want, err := sluice.Take(context.Background(), r, "{hot}", l, 0)
				if err != nil {
					t.Fatal(err)
				}
				if d.Remaining != want.Remaining || d.RetryAfter <= 11*time.Minute || d.RetryAfter > 12*time.Minute {
					t.Fatalf("cached denial %+v, the store reports %+v", d, want)
				}
			}
			if admitted != 5 {
				t.Fatalf("admitted %d, want 5", admitted)
			}
			if st := near.Stats(); st.NearHits != 94 || st.NearEntries != 1 {
				t.Fatalf("stats %+v: want 94 hits (100 requests, 5 admitted, 1 denial learnt) and 1 entry", st)
			}
		})
	}
}

// TestNearCacheBounded fills the near cache with more denied keys than
// its budget holds: it stays within the budget and keeps answering.
func TestNearCacheBounded(t *testing.T) {
	c := clocktest.New(time.Date(2026, 3, 14, 12, 30, 30, 0, time.UTC))
	const budget = 64 << 10
	near := newStore(t, openRedis(t, "redis://"+testenv.RedisAddr(t)+"/0", c.Now), Config{Now: c.Now, NearCacheBytes: budget})
	l := sluice.Limit{Rate: 1, Period: time.Hour}
	for i := range 2000 {
		key := fmt.Sprintf("user%04d", i)
		for range 2 {
			if _, err := sluice.Take(context.Background(), near, key, l, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := near.Stats()
	if st.NearBytes > budget || st.NearEntries == 0 {
		t.Fatalf("stats %+v: want at most %d bytes and some entries", st, budget)
	}
	if max := budget / (8 + entryOverhead); st.NearEntries > max {
		t.Fatalf("%d entries in %d bytes", st.NearEntries, budget)
	}
	before := st.NearHits
	for range 2 {
		if _, err := sluice.Take(context.Background(), near, "user1999", l, 1); err != nil {
			t.Fatal(err)
		}
	}
	if near.Stats().NearHits != before+2 {
		t.Fatal("the latest denial is not answered from the cache")
	}
}

// TestNearCacheOff checks that a store without TakeState, or a negative
// budget, leaves every call to the store.
func TestNearCacheOff(t *testing.T) {
	mem, err := memory.New(memory.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	r := openRedis(t, "redis://"+testenv.RedisAddr(t)+"/0", nil)
	for name, s := range map[string]*Store{
		"memory":   newStore(t, mem, Config{}),
		"negative": newStore(t, r, Config{NearCacheBytes: -1}),
	} {
		t.Run(name, func(t *testing.T) {
			l := sluice.Limit{Rate: 1, Period: time.Hour}
			for range 5 {
				if _, err := sluice.Take(context.Background(), s, "k", l, 1); err != nil {
					t.Fatal(err)
				}
			}
			if st := s.Stats(); st != (Stats{StoreCalls: 5, AsyncServers: 1}) {
				t.Fatalf("stats %+v, want 5 store calls and nothing else", st)
			}
		})
	}
	if !newStore(t, mem, Config{}).NonBlocking() || newStore(t, r, Config{}).NonBlocking() {
		t.Fatal("NonBlocking is not the decorated store's")
	}
}

// TestGroupKept checks that a request's Group reaches the store whether
// the request comes alone or in a batch: one counter either way.
func TestGroupKept(t *testing.T) {
	for name, url := range backendURLs() {
		t.Run(name, func(t *testing.T) {
			for _, sync := range []Sync{Exact, Lease} {
				t.Run(sync.String(), func(t *testing.T) {
					s := newStore(t, openRedis(t, url(t), nil), Config{Sync: sync})
					defer s.Close(context.Background())
					l := sluice.Limit{Rate: 1, Period: time.Hour}
					one := []sluice.Request{{Key: "k", Group: "alice", Limit: l, Cost: 1}}
					two := []sluice.Request{{Key: "k", Group: "alice", Limit: l, Cost: 1}, {Key: "k2", Group: "alice", Limit: l, Cost: 1}}
					ds := make([]sluice.Decision, 2)
					if err := s.TakeAll(context.Background(), one, ds); err != nil || !ds[0].Allowed {
						t.Fatalf("the first hit: %+v, %v", ds[0], err)
					}
					if err := s.TakeAll(context.Background(), two, ds); err != nil || ds[0].Allowed {
						t.Fatalf("a batch after the one hit the limit admits: %+v, %v", ds, err)
					}
				})
			}
		})
	}
}
