package localfirst

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/storetest"
)

// asyncOver is async mode's stated overshoot for nodes nodes sharing out
// with k and syncing every interval: on the window limits of k intervals
// or more (those the suite and these tests use), nodes × max(⌊rate / (k ×
// nodes)⌋, 1) hits a window (those below k × nodes decide exactly; a
// shorter window's D is ⌈period / interval⌉ + ¼ and its bound is that of
// docs/sync-modes.md, checked by TestAsyncOvershoot); on the bucket limits, in any interval of length
// d, beyond capacity + rate × d / period,
//
//	⌊max(Full / k + Drain × interval, nodes × Hit) / Hit⌋
//
// hits (in hits: max(capacity / k + rate × interval / period, nodes)).
func asyncOver(l sluice.Limit, nodes int, k int64, interval time.Duration) int64 {
	n := int64(nodes)
	if b, ok := l.Bucket(); ok {
		return max(b.Full+k*b.Drain*interval.Microseconds(), k*n*b.Hit) / (k * b.Hit)
	}
	syncs := (l.Period + interval - 1) / interval
	d4 := min(4*int64(syncs)+1, 4*k) // 4 × D
	if !redis.Syncable(l) || 4*l.Rate < d4*n {
		return 0
	}
	return n * max(4*l.Rate/(d4*n), 1)
}

// asyncBound is async mode's stated bound (asyncOver) as the store suite
// takes it; no bound under it.
func asyncBound(k int64, interval time.Duration) storetest.Bound {
	return storetest.Bound{
		Over:  func(l sluice.Limit, nodes int) int64 { return asyncOver(l, nodes, k, interval) },
		Under: func(l sluice.Limit, _ int) int64 { return l.Capacity() },
	}
}

// openAsyncNodes returns n async-mode Stores over Redis stores of their own
// on url sharing prefix, deciding by now, with AsyncNodes n, synced only
// when the test calls SyncAsync (a sync loop on real time would sync at
// instants of now that depend on the machine's load); closed (their hits
// written back) when the test ends.
func openAsyncNodes(t testing.TB, url, prefix string, now func() time.Time, n int, cfg Config) []*Store {
	t.Helper()
	cfg.Sync, cfg.AsyncNodes, cfg.syncByHand = Async, int64(n), true
	return openNodes(t, url, prefix, now, n, cfg)
}

// TestAsyncContract runs the store suite's contract tier on async mode
// over Redis and Redis Cluster, 1 and 3 nodes, with the bound async mode
// states (k = 2 here, so that the suite's small limits are shared out:
// at most half the limit over), the window and the bucket limits: its
// Intervals scenario checks the buckets' bound over every interval of a
// random run with syncs at random.
func TestAsyncContract(t *testing.T) {
	for name, url := range contractURLs() {
		t.Run(name, func(t *testing.T) {
			u := url(t)
			storetest.RunContract(t, func(t *testing.T, now func() time.Time, n int) []sluice.Store {
				prefix := fmt.Sprintf("localfirsttest:%x:", rand.Uint64())
				var out []sluice.Store
				for _, s := range openAsyncNodes(t, u, prefix, now, n, Config{AsyncShare: 2, SyncInterval: 5 * time.Millisecond}) {
					out = append(out, s)
				}
				return out
			}, asyncBound(2, 5*time.Millisecond))
		})
	}
}

// TestAsyncOvershoot is the three-server hot-key test: 3 async nodes on
// one hot key, with three times the limit's requests spread at random over
// the nodes and over time (a tick of 5 ms), each node syncing every 100 ms
// of the clock on its own phase (as servers' timers are), over several
// windows of each limit: a minute's (600 syncs a window, shares of
// 1/(N × k) of what is left: the bound 1000 + 3 × ⌊1000/150⌋) and a
// second's (10 syncs a window: what is left spread over the syncs left).
// Every window admits at most 2% over the limit, and the windows at least
// 97% of a minute's limit on average, 96% of a second's (the last
// allowances of a window, a quarter short, lose a few hits; 95% of 100 a
// second, whose allowances of about 3 hits lose one or two to rounding);
// the test reports the extremes.
func TestAsyncOvershoot(t *testing.T) {
	const interval = 100 * time.Millisecond
	const tick = 5 * time.Millisecond
	for _, tc := range []struct {
		name    string
		l       sluice.Limit
		windows int
		fill    float64 // the least share of the limit a window admits on average
	}{
		{"1000 a minute", sluice.Limit{Rate: 1000, Period: time.Minute}, 3, 0.97},
		{"1000 a second", sluice.Limit{Rate: 1000, Period: time.Second}, 10, 0.96},
		// Allowances of about 3 hits: rounding loses a hit or two a window.
		{"100 a second", sluice.Limit{Rate: 100, Period: time.Second}, 10, 0.95},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.l
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC).Add(l.Period))
			url := "redis://" + testenv.RedisAddr(t) + "/0"
			nodes := openAsyncNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{SyncInterval: interval})
			rng := rand.New(rand.NewPCG(rand.Uint64(), 7))
			per := int64(interval / tick)
			phase := []int64{rng.Int64N(per), rng.Int64N(per), rng.Int64N(per)}
			perTick := 3 * float64(l.Rate) * float64(tick) / float64(l.Period)
			ticks := int64(l.Period / tick)
			most, least, total := int64(0), l.Rate, int64(0)
			var due float64
			for w := range tc.windows {
				var admitted int64
				for i := range ticks {
					for due += perTick; due >= 1; due-- {
						d, err := sluice.Take(context.Background(), nodes[rng.IntN(3)], "{hot}", l, 1)
						if err != nil {
							t.Fatal(err)
						}
						if d.Allowed {
							admitted++
						}
					}
					clk.Advance(tick)
					for n, s := range nodes {
						if (i+phase[n])%per == 0 {
							if err := s.SyncAsync(context.Background()); err != nil {
								t.Fatal(err)
							}
						}
					}
				}
				if w == 0 {
					continue // the nodes' first requests, decided by the store
				}
				most, least, total = max(most, admitted), min(least, admitted), total+admitted
			}
			mean := float64(total) / float64(tc.windows-1)
			var calls uint64
			for _, s := range nodes {
				calls += s.Stats().StoreCalls
			}
			t.Logf("%d windows, 3 nodes: admitted %d to %d a window, %.1f on average (limit %d; overshoot at most %d, %.1f%%); %.1f store calls a window",
				tc.windows-1, least, most, mean, l.Rate, most-l.Rate, 100*float64(most-l.Rate)/float64(l.Rate), float64(calls)/float64(tc.windows))
			if most > l.Rate+l.Rate/50 {
				t.Errorf("admitted %d in a window, more than %d + 2%%", most, l.Rate)
			}
			if mean < tc.fill*float64(l.Rate) {
				t.Errorf("admitted %.1f a window on average, less than %.0f%% of %d", mean, 100*tc.fill, l.Rate)
			}
		})
	}
}

// TestAsyncBucketOvershoot drives 3 async nodes (k = 50, syncing every
// 100 ms of the clock, each on its own jittered schedule) on one hot key
// of each bucket limit, with requests far above its rate for 30 s, and
// checks every interval between two admissions against the stated bound:
// in any interval of length d, at most capacity + rate × d / period +
// max(capacity / 50 + rate × 100 ms / period, 3). It reports the largest
// excess over capacity + rate × d / period that it saw.
func TestAsyncBucketOvershoot(t *testing.T) {
	const interval = 100 * time.Millisecond
	url := "redis://" + testenv.RedisAddr(t) + "/0"
	for i, l := range []sluice.Limit{
		{Algorithm: sluice.TokenBucket, Rate: 1000, Period: time.Minute, Burst: 1000},
		{Algorithm: sluice.GCRA, Rate: 1000, Period: time.Minute},
		{Algorithm: sluice.LeakyBucket, Rate: 1000, Period: time.Minute},
		{Algorithm: sluice.TokenBucket, Rate: 100, Period: time.Second, Burst: 20}, // the refill share dominates
		{Algorithm: sluice.GCRA, Rate: 100, Period: time.Second, Burst: 20},
	} {
		t.Run(l.String(), func(t *testing.T) {
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
			nodes := openAsyncNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{SyncInterval: interval})
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(i)))
			p := l.Period.Microseconds()
			next := make([]time.Time, len(nodes)) // each node's next sync
			for j := range next {
				next[j] = clk.Now().Add(time.Duration(rng.Int64N(int64(interval))))
			}
			var seen []admission
			start := clk.Now()
			for clk.Now().Sub(start) < 30*time.Second {
				clk.Advance(time.Duration(rng.Int64N(5000)) * time.Microsecond)
				for range 1 + rng.IntN(3) {
					d, err := sluice.Take(context.Background(), nodes[rng.IntN(len(nodes))], "{hot}", l, 1)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						seen = append(seen, admission{clk.Now().UnixMicro(), 1})
					}
				}
				for j, s := range nodes {
					if clk.Now().Before(next[j]) {
						continue
					}
					if err := s.SyncAsync(context.Background()); err != nil {
						t.Fatal(err)
					}
					next[j] = clk.Now().Add(interval*4/5 + time.Duration(rng.Int64N(int64(interval*2/5))))
				}
			}
			over := asyncOver(l, len(nodes), 50, interval)
			worst := checkIntervals(t, l, seen, over)
			refill := l.Rate * clk.Now().Sub(start).Microseconds() / p
			var calls uint64
			for _, s := range nodes {
				calls += s.Stats().StoreCalls
			}
			t.Logf("%d admitted in 30 s (capacity %d + %d refilled); the most in an interval: capacity + rate × d / period + %d (bound %d); %d store calls",
				len(seen), l.Capacity(), refill, worst-l.Capacity(), over, calls)
			if int64(len(seen)) < (l.Capacity()+refill)/2 {
				t.Fatalf("admitted %d, fewer than half the capacity and the %d refilled: the test does not test the bound", len(seen), refill)
			}
		})
	}
}

// admission is a request seen admitted: at µs, cost hits.
type admission struct{ at, cost int64 }

// checkIntervals fails t unless every interval between two of seen
// (in time order) admits at most capacity + rate × d / period + over
// hits of l, and returns the most hits past rate × d / period seen in
// one.
func checkIntervals(t *testing.T, l sluice.Limit, seen []admission, over int64) int64 {
	t.Helper()
	p := l.Period.Microseconds()
	var worst int64
	for i := range seen {
		var sum int64
		for j := i; j < len(seen); j++ {
			sum += seen[j].cost
			d := seen[j].at - seen[i].at
			if sum*p > (l.Capacity()+over)*p+l.Rate*d {
				t.Fatalf("%v: %d admitted in the %v from %d µs, more than capacity %d + rate × d / period %.2f + the bound %d",
					l, sum, time.Duration(d)*time.Microsecond, seen[i].at, l.Capacity(), float64(l.Rate*d)/float64(p), over)
			}
			worst = max(worst, sum-l.Rate*d/p)
		}
	}
	return worst
}

// TestAsyncBucketRedisDies kills Redis under an async node holding a
// bucket key with hits not yet written back: the failed sync keeps them;
// the node goes on admitting from its grant (which stops growing one
// sync interval after the last sync that succeeded, however long Redis
// stays away), then returns an error for decide's --fail to answer; once
// Redis is back (restarted: it forgot everything), the next sync writes
// every kept hit, and the node admits from its grant again.
func TestAsyncBucketRedisDies(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	const interval = time.Hour // no tick of the node's own in the test
	url := "redis://" + srv.Addr + "/0"
	prefix := fmt.Sprintf("dies:%x:", rand.Uint64())
	node := openAsyncNodes(t, url, prefix, clk.Now, 1, Config{SyncInterval: interval})[0]
	l := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1000, Period: 24 * time.Hour, Burst: 1000}
	b, _ := l.Bucket()
	ctx := context.Background()
	take := func() (sluice.Decision, error) {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return sluice.Take(c, node, "{k}", l, 1)
	}
	if d, err := take(); err != nil || !d.Allowed { // the store decides: the node holds the key
		t.Fatalf("first: %+v, %v", d, err)
	}
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	// The grant: 999/50 of the bucket free at the sync (19.98 hits), and
	// an interval's refill, 1000/24 hits, once an interval has passed.
	base := (b.Full - b.Hit) / 50
	full := (base + b.Drain*interval.Microseconds()) / b.Hit // 61
	var admitted int64
	for range 5 {
		if d, err := take(); err != nil || !d.Allowed {
			t.Fatalf("before Redis dies: %+v, %v", d, err)
		}
		admitted++
	}
	srv.Kill()
	if err := node.SyncAsync(ctx); err == nil {
		t.Fatal("a sync with Redis dead: no error")
	}
	if st := node.Stats(); st.ReturnErrors != 1 {
		t.Fatalf("stats %+v: want 1 failed sync", st)
	}
	// use takes until the node answers with an error.
	use := func(what string) {
		t.Helper()
		for {
			d, err := take()
			if err != nil {
				return
			}
			if !d.Allowed {
				t.Fatalf("%s: denied (%+v), want admitted from the grant or an error", what, d)
			}
			if admitted++; admitted > full {
				t.Fatalf("%s: %d admitted with Redis dead, more than the grant's %d", what, admitted, full)
			}
		}
	}
	use("Redis dead")
	if want := base / b.Hit; admitted != want {
		t.Fatalf("admitted %d with no time passed, want the grant's %d", admitted, want)
	}
	clk.Advance(24 * time.Hour) // a day's refill, of which the grant holds one interval's
	use("a day later")
	if admitted != full {
		t.Fatalf("admitted %d a day later, want the grant's %d", admitted, full)
	}
	srv.Restart()
	waitFor(t, 10*time.Second, "a sync once Redis is back", func() bool { return node.SyncAsync(ctx) == nil })
	// Redis forgot the first hit, which it had decided; the node wrote
	// back every hit it admitted by itself.
	r := openRedisPrefix(t, url, prefix, clk.Now)
	if d, err := sluice.Take(ctx, r, "{k}", l, 0); err != nil || d.Remaining != 1000-admitted {
		t.Fatalf("Redis after the write-back: %+v, %v; want %d remaining", d, err, 1000-admitted)
	}
	if d, err := take(); err != nil || !d.Allowed {
		t.Fatalf("after the write-back: %+v, %v", d, err)
	}
}

// waitFor checks cond every 10ms until it holds, and fails t if it does
// not within limit (a failure timeout, not a wait for time to pass).
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, limit)
		case <-tick.C:
		}
	}
}

// TestAsyncWindowRedisDies kills Redis under an async node with hits of a
// window limit not yet written back: the failed sync keeps them, the node
// admits what its allowance still holds, then returns an error for
// decide's --fail to answer (it denied before, whatever --fail said); once Redis
// is back, the next sync writes them.
func TestAsyncWindowRedisDies(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	url := "redis://" + srv.Addr + "/0"
	prefix := fmt.Sprintf("dies:%x:", rand.Uint64())
	node := openAsyncNodes(t, url, prefix, clk.Now, 1, Config{SyncInterval: 100 * time.Millisecond})[0]
	l := sluice.Limit{Rate: 1000, Period: time.Hour} // allowance ⌊999 / 50⌋ = 19
	ctx := context.Background()
	take := func() (sluice.Decision, error) {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return sluice.Take(c, node, "{w}", l, 1)
	}
	for range 7 {
		if d, err := take(); err != nil || !d.Allowed {
			t.Fatalf("before Redis dies: %+v, %v", d, err)
		}
	}
	srv.Kill()
	if err := node.SyncAsync(ctx); err == nil {
		t.Fatal("a sync with Redis dead: no error")
	}
	for range 19 - 6 { // what the allowance still holds
		if d, err := take(); err != nil || !d.Allowed {
			t.Fatalf("Redis dead, from the allowance: %+v, %v", d, err)
		}
	}
	if d, err := take(); err == nil {
		t.Fatalf("Redis dead, the allowance spent: %+v, want an error", d)
	}
	srv.Restart()
	waitFor(t, 10*time.Second, "a sync once Redis is back", func() bool { return node.SyncAsync(ctx) == nil })
	// Redis forgot the first hit, which it decided; the node wrote back
	// the 19 it admitted by itself, saw the count below what it had read
	// plus those, and put back the first (restore).
	r := openRedisPrefix(t, url, prefix, clk.Now)
	if d, err := sluice.Take(ctx, r, "{w}", l, 0); err != nil || d.Remaining != 1000-20 {
		t.Fatalf("Redis after the write-back: %+v, %v; want 980 remaining", d, err)
	}
	if d, err := take(); err != nil || !d.Allowed {
		t.Fatalf("after the write-back: %+v, %v", d, err)
	}
}

// TestAsyncWindowComesBack sends a burst to an async node on a window
// key, lets it sync, then leaves the key quiet and has the node forget it
// as a full table does (evict), again and again in one window: the node
// asks the store what it counted each time it takes the key up again, so
// the window admits no more than the stated bound, 1000 + 20, and (a
// spent allowance reads the count again) no fewer than 1000. (It started
// every return with a full allowance, as if nothing were counted: 20 more
// each time.)
func TestAsyncWindowComesBack(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	url := "redis://" + testenv.RedisAddr(t) + "/0"
	node := openAsyncNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 1, Config{SyncInterval: 100 * time.Millisecond})[0]
	l := sluice.Limit{Rate: 1000, Period: time.Hour}
	ctx := context.Background()
	var admitted, forgotten, rounds int64
	for range 300 {
		before := admitted
		for range 30 {
			d, err := sluice.Take(ctx, node, "{back}", l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted > before {
			rounds++
		}
		if err := node.SyncAsync(ctx); err != nil { // writes the burst back
			t.Fatal(err)
		}
		clk.Advance(300 * time.Millisecond) // quiet for 3 intervals
		a, n := node.async, 0               // evict each shard, as if full
		for i := range a.shards {
			sh := &a.shards[i]
			sh.mu.Lock()
			n += len(sh.m)
			a.evict(sh, clk.Now(), 100*time.Millisecond, a.budget)
			n -= len(sh.m)
			sh.mu.Unlock()
		}
		forgotten += int64(n)
	}
	if forgotten < rounds { // every round that admitted
		t.Fatalf("the node forgot the key %d times, want it forgotten in each of the %d rounds that admitted", forgotten, rounds)
	}
	if bound := 1000 + asyncOver(l, 1, 50, 100*time.Millisecond); admitted > bound || admitted < 1000 {
		t.Fatalf("admitted %d in one window, want 1000 (a spent allowance reads the store's count again) to %d", admitted, bound)
	}
	t.Logf("admitted %d", admitted)
}

// TestAsyncBucketSyncInFlight pauses Redis while an async node's sync of
// a bucket key is in flight: the node goes on admitting from the grant it
// holds (as it does a window key's allowance), and the hits it admitted
// meanwhile, not in that sync, are written by the next one, none lost and
// none written twice.
func TestAsyncBucketSyncInFlight(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	url := "redis://" + srv.Addr + "/0"
	prefix := fmt.Sprintf("inflight:%x:", rand.Uint64())
	node := openAsyncNodes(t, url, prefix, clk.Now, 1, Config{SyncInterval: time.Hour})[0]
	r := openRedisPrefix(t, url, prefix, clk.Now)
	l := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1000, Period: 24 * time.Hour, Burst: 1000}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	take := func(n int, what string) {
		t.Helper()
		for range n {
			if d, err := sluice.Take(ctx, node, "{k}", l, 1); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v, %v", what, d, err)
			}
		}
	}
	remaining := func(want int64) {
		t.Helper()
		if d, err := sluice.Take(ctx, r, "{k}", l, 0); err != nil || d.Remaining != want {
			t.Fatalf("Redis: %+v, %v; want %d remaining", d, err, want)
		}
	}
	take(1, "the first, which Redis decides")
	take(3, "from the grant")
	srv.Pause()
	done := make(chan error, 1)
	go func() { done <- node.SyncAsync(ctx) }()
	waitFor(t, 10*time.Second, "the sync in flight", func() bool {
		sh := node.async.shard("{k}")
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.m["{k}"] != nil && sh.m["{k}"].syncing
	})
	take(4, "while the sync is in flight")
	srv.Resume()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	remaining(1000 - 1 - 3)
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	remaining(1000 - 1 - 3 - 4)
}

// TestAsyncWindowIdleKeepsShare checks that an async node keeps a window
// key through its window: a client quiet for many sync intervals comes
// back to the share the node holds, with no store call, and an idle key
// costs no sync; once its window is over the key is forgotten. It fails
// if the node forgets idle keys after two intervals (a store call on the
// client's return) or syncs keys nobody asked for.
func TestAsyncWindowIdleKeepsShare(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	url := "redis://" + testenv.RedisAddr(t) + "/0"
	node := openAsyncNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 1, Config{SyncInterval: 100 * time.Millisecond})[0]
	l := sluice.Limit{Rate: 1000, Period: time.Hour}
	ctx := context.Background()
	take := func(what string) {
		t.Helper()
		if d, err := sluice.Take(ctx, node, "{idle}", l, 1); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", what, d, err)
		}
	}
	take("the first, which Redis decides")
	take("the second, from the share")
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	calls := node.Stats().StoreCalls
	for range 50 { // quiet for 50 intervals, the table swept each
		clk.Advance(100 * time.Millisecond)
		if err := node.SyncAsync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := node.Stats().StoreCalls; got != calls {
		t.Fatalf("%d store calls while the key was idle, want none", got-calls)
	}
	take("back after 5s, in the same window")
	if got := node.Stats().StoreCalls; got != calls {
		t.Fatalf("%d store calls for a client back in its window, want none", got-calls)
	}
	clk.Advance(time.Hour)                      // its window is over
	if err := node.SyncAsync(ctx); err != nil { // writes the last hit back
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := node.SyncAsync(ctx); err != nil { // forgets the key
		t.Fatal(err)
	}
	calls = node.Stats().StoreCalls
	take("in a new window, after the node forgot the key")
	if got := node.Stats().StoreCalls; got != calls+1 {
		t.Fatalf("%d store calls for a key the node forgot, want 1 (the store decides it)", got-calls)
	}
}

// TestAsyncServersJoin runs async mode with --async-nodes 2 typed while 4
// servers run: 2 hammer a hot key, 2 more join mid-window, and all 4
// hammer until none admits any more. The servers count themselves
// (heartbeats in Redis), so the hits admitted stay within the bound
// stated for 4 servers; on the limits below 4 × k that bound is the rate
// itself, where servers that believed the flag shared out by 2 and passed
// it. Closing a server takes it out of the count.
func TestAsyncServersJoin(t *testing.T) {
	const interval = 100 * time.Millisecond
	for name, url := range contractURLs() {
		t.Run(name, func(t *testing.T) { testAsyncServersJoin(t, url(t), interval) })
	}
}

func testAsyncServersJoin(t *testing.T, url string, interval time.Duration) {
	for _, l := range []sluice.Limit{
		{Algorithm: sluice.FixedWindow, Rate: 150, Period: time.Minute},
		{Algorithm: sluice.FixedWindow, Rate: 151, Period: time.Minute},
		{Algorithm: sluice.SlidingWindow, Rate: 153, Period: time.Minute},
		{Algorithm: sluice.FixedWindow, Rate: 1000, Period: time.Minute},
	} {
		t.Run(l.String(), func(t *testing.T) {
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
			prefix := fmt.Sprintf("localfirsttest:%x:", rand.Uint64())
			cfg := Config{Sync: Async, AsyncNodes: 2, SyncInterval: interval, syncByHand: true}
			nodes := openNodes(t, url, prefix, clk.Now, 2, cfg)
			var admitted int64
			round := func() (n int64) {
				for range 5 {
					for _, s := range nodes {
						d, err := sluice.Take(context.Background(), s, "{hot}", l, 1)
						if err != nil {
							t.Fatal(err)
						}
						if d.Allowed {
							n++
						}
					}
				}
				for _, s := range nodes {
					if err := s.SyncAsync(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				clk.Advance(interval)
				admitted += n
				return n
			}
			for admitted < l.Rate/3 {
				round()
			}
			nodes = append(nodes, openNodes(t, url, prefix, clk.Now, 2, cfg)...)
			for round() > 0 {
			}
			round() // one more: nothing left to admit
			bound := l.Rate + asyncOver(l, 4, defaultAsyncShare, interval)
			t.Logf("%v: %d admitted by 2 servers, then 4 (bound for 4 servers %d)", l, admitted, bound)
			if admitted > bound {
				t.Fatalf("%v: admitted %d, more than the %d stated for 4 servers", l, admitted, bound)
			}
			if admitted < l.Rate {
				t.Fatalf("%v: admitted %d, fewer than the rate: the test does not test the bound", l, admitted)
			}
			if got := nodes[0].Stats().AsyncServers; got != 4 {
				t.Fatalf("the first server counts %d servers, want 4", got)
			}
			if err := nodes[3].Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			round()
			if got := nodes[0].Stats().AsyncServers; got != 3 {
				t.Fatalf("with one server closed, the first counts %d servers, want 3", got)
			}
		})
	}
}
