package localfirst

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/redis"
)

// TestAsyncUnderLimit drives users under their limit (each at half of 100
// a second, fixed window, hits at random instants: in a 100 ms interval a
// user asks for 5 on average, sometimes 11 or more) through 1 and 3 async
// nodes, each syncing every 100 ms of the test's clock on its own phase,
// for 4 windows, and fails on any denial: async mode denies a request
// only when the store's count, as a sync read it, leaves no room. (Before
// issue 31 a node denied once the share paced to the interval was spent,
// however far the user was under its limit: 0.1-0.3% of these calls.)
// TestAsyncUnderLimitBucket is TestAsyncUnderLimit on a token bucket of
// 100 a second, burst 100, on the fake: a request whose grant is spent
// while the bucket is at most half full syncs its key (before issue 31 it
// was denied: 1.3% of these calls on 1 node, 14.6% on 3).
func TestAsyncUnderLimitBucket(t *testing.T) {
	for _, nodes := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			testAsyncUnderLimitOf(t, memURL, nodes, sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 100, Period: time.Second, Burst: 100})
		})
	}
}

func TestAsyncUnderLimit(t *testing.T) {
	for name, url := range contractURLs() {
		for _, nodes := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/%d nodes", name, nodes), func(t *testing.T) {
				testAsyncUnderLimit(t, url(t), nodes)
			})
		}
	}
}

func testAsyncUnderLimit(t *testing.T, url string, n int) {
	testAsyncUnderLimitOf(t, url, n, sluice.Limit{Rate: 100, Period: time.Second})
}

func testAsyncUnderLimitOf(t *testing.T, url string, n int, l sluice.Limit) {
	const (
		interval = 100 * time.Millisecond
		tick     = time.Millisecond
		users    = 200
		windows  = 4
	)
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC))
	nodes := openAsyncNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, n, Config{SyncInterval: interval})
	rng := rand.New(rand.NewPCG(rand.Uint64(), 31))
	per := int64(interval / tick)
	phase := make([]int64, n)
	for i := range phase {
		phase[i] = rng.Int64N(per)
	}
	// Each user's chance of a hit in a tick: half its limit.
	p := 0.5 * float64(l.Rate) * float64(tick) / float64(l.Period)
	ctx := context.Background()
	var calls, denied int64
	for range int64(windows) * int64(l.Period/tick) {
		for u := range users {
			if rng.Float64() >= p {
				continue
			}
			d, err := sluice.Take(ctx, nodes[rng.IntN(n)], fmt.Sprintf("{u%d}", u), l, 1)
			if err != nil {
				t.Fatal(err)
			}
			calls++
			if !d.Allowed {
				denied++
			}
		}
		clk.Advance(tick)
		for i, s := range nodes {
			if (clk.Now().UnixMilli()/int64(tick/time.Millisecond)+phase[i])%per == 0 {
				if err := s.SyncAsync(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	var store uint64
	for _, s := range nodes {
		store += s.Stats().StoreCalls
	}
	t.Logf("%d nodes: %d of %d calls denied (%.3f%%), %.4f store calls a decision", n, denied, calls,
		100*float64(denied)/float64(calls), float64(store)/float64(calls))
	if denied > 0 {
		t.Errorf("denied %d of %d calls of users at half their limit", denied, calls)
	}
}

// TestAsyncWindowSyncInFlight pauses Redis while an async node's sync of a
// window key is in flight: the node goes on admitting from the allowance
// it holds (it denied every request of the key until the sync landed: the
// 4-19% of calls under their limit that issue 31 measured, more as syncs
// of more keys took longer), a request that finds the allowance spent
// waits for the sync to land and is admitted from the next allowance, and
// the hits admitted meanwhile are written by the next sync, none lost and
// none written twice; Remaining falls at every hit, the hits in flight
// counted.
func TestAsyncWindowSyncInFlight(t *testing.T) {
	srv := testenv.StartRedis(t)
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	url := "redis://" + srv.Addr + "/0"
	prefix := fmt.Sprintf("inflight:%x:", rand.Uint64())
	node := openAsyncNodes(t, url, prefix, clk.Now, 1, Config{SyncInterval: 100 * time.Millisecond})[0]
	r := openRedisPrefix(t, url, prefix, clk.Now)
	l := sluice.Limit{Rate: 1000, Period: time.Hour} // allowances of ⌊(1000 − counted) / 50⌋
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	last := l.Rate
	take := func(n int, what string) {
		t.Helper()
		for range n {
			d, err := sluice.Take(ctx, node, "{k}", l, 1)
			if err != nil || !d.Allowed {
				t.Fatalf("%s: %+v, %v", what, d, err)
			}
			// The hits in flight count: Remaining never rises in a window
			// (decide's ledger takes a rise for a store that lost counts
			// and puts them back, counting them twice).
			if d.Remaining >= last {
				t.Fatalf("%s: Remaining %d after %d", what, d.Remaining, last)
			}
			last = d.Remaining
		}
	}
	take(1, "the first, which Redis decides")
	take(3, "from the allowance of 19")
	srv.Pause()
	done := make(chan error, 1)
	go func() { done <- node.SyncAsync(ctx) }()
	inFlight := func() bool {
		sh := node.async.shard("{k}")
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.m["{k}"] != nil && sh.m["{k}"].syncing
	}
	waitFor(t, 10*time.Second, "the sync in flight", inFlight)
	take(16, "while the sync is in flight, from the allowance")
	waited := make(chan error, 1)
	go func() {
		d, err := sluice.Take(ctx, node, "{k}", l, 1)
		if err == nil && !d.Allowed {
			err = fmt.Errorf("denied: %+v", d)
		}
		waited <- err
	}()
	waitFor(t, 10*time.Second, "a request waiting for the sync", func() bool {
		sh := node.async.shard("{k}")
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.m["{k}"].landed != nil
	})
	srv.Resume()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the request that waited for the sync: %v", err)
	}
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := sluice.Take(ctx, r, "{k}", l, 0); err != nil || d.Remaining != 1000-1-3-16-1 {
		t.Fatalf("Redis: %+v, %v; want %d remaining", d, err, 1000-1-3-16-1)
	}
}

// TestAsyncBurstUnderLimit sends 60 requests of one key at once to one of
// 3 async nodes (a share of about 3 hits a sync) on a limit of 100 a
// second, as a server that resumes after a stall answers what queued up:
// all are admitted, each from a share, a sync of the key, or, when
// concurrent requests took every share it waited for, the store. (A
// request that lost 4 shares in a row was denied, under its limit, on
// the weather suite's host stall.)
func TestAsyncBurstUnderLimit(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC))
	url := "redis://" + testenv.RedisAddr(t) + "/0"
	nodes := openAsyncNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{SyncInterval: 100 * time.Millisecond})
	l := sluice.Limit{Rate: 100, Period: time.Second}
	ctx := context.Background()
	if d, err := sluice.Take(ctx, nodes[0], "{burst}", l, 1); err != nil || !d.Allowed { // the key's first, by the store
		t.Fatalf("%+v, %v", d, err)
	}
	errs := make(chan error, 60)
	for range 60 {
		go func() {
			d, err := sluice.Take(ctx, nodes[0], "{burst}", l, 1)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied: %+v", d)
			}
			errs <- err
		}()
	}
	for range 60 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// stalledSyncer is a Redis store whose SyncCounts, once armed, returns
// stall later on the node's clock than Redis read it: the node was
// stopped (SIGSTOP, a host stall) while the answer waited in its socket.
type stalledSyncer struct {
	*redis.Store
	clk   *clocktest.Clock
	stall atomic.Int64 // ns, for the next SyncCounts only
}

func (s *stalledSyncer) SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error) {
	counts, at, err := s.Store.SyncCounts(ctx, reqs, windows)
	s.clk.Advance(time.Duration(s.stall.Swap(0)))
	return counts, at, err
}

// TestAsyncStalledSync stops a node for 3 s while its sync's answer
// waits (the weather suite's host stall), then sends it the 45 requests
// of a client under its limit of 50 a second that queued meanwhile: all
// are admitted, in the window of the store's clock, where the store
// counts them. The store's clock read at the sync, 3 s before the node
// read the answer, is no later than it is but 3 s early; the node took
// it, decided the queued requests in the window that had ended, on top of
// its 10 hits (5 denied), and wrote them back there, where they counted
// for nothing (the host stall's 1.2% of under-limit calls denied in async
// mode, on one server).
func TestAsyncStalledSync(t *testing.T) {
	t0 := time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC) // a window's start
	clk := clocktest.New(t0.Add(100 * time.Millisecond))
	url := "redis://" + testenv.RedisAddr(t) + "/0"
	prefix := fmt.Sprintf("localfirsttest:%x:", rand.Uint64())
	r := &stalledSyncer{Store: openRedisPrefix(t, url, prefix, clk.Now), clk: clk}
	node := newStore(t, r, Config{Now: clk.Now, Sync: Async, SyncInterval: 100 * time.Millisecond, syncByHand: true})
	t.Cleanup(func() { _ = node.Close(context.Background()) })
	l := sluice.Limit{Rate: 50, Period: time.Second}
	ctx := context.Background()
	take := func(n int, what string) {
		t.Helper()
		for i := range n {
			if d, err := sluice.Take(ctx, node, "{k}", l, 1); err != nil || !d.Allowed {
				t.Fatalf("%s, request %d of %d: %+v, %v", what, i+1, n, d, err)
			}
		}
	}
	take(1, "the first, which the store decides")
	clk.Set(t0.Add(500 * time.Millisecond))
	take(9, "in the first window")
	clk.Set(t0.Add(900 * time.Millisecond))
	r.stall.Store(int64(3 * time.Second))
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := clk.Now(), t0.Add(3900*time.Millisecond); !got.Equal(want) {
		t.Fatalf("clock %v after the stalled sync, want %v", got, want)
	}
	take(45, "queued during the stall, 3 windows later")
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := sluice.Take(ctx, openRedisPrefix(t, url, prefix, clk.Now), "{k}", l, 0); err != nil || d.Remaining != 5 {
		t.Fatalf("the store's window: %+v, %v; want 45 counted, 5 remaining", d, err)
	}
}

// TestAsyncClockReadings checks how a node reads the store's clock from
// its syncs (asyncTable.measure), the store 2 s ahead of the node: the
// first reading is taken; one whose answer waited 3 s is no later than
// the store's clock but 3 s early, and leaves the offset where the last
// reading put it, aged by 1 ms a second (about 4 ms); a better one is taken; one that
// contradicts the offset (its round trip ended before the store's clock,
// as the node reads it, had come: the node's clock stepped forward 10 s)
// is taken.
func TestAsyncClockReadings(t *testing.T) {
	t0 := time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)
	store := func(d time.Duration) int64 { return t0.Add(2*time.Second + d).UnixMicro() } // the store's clock at node time t0 + d
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	a := newAsyncTable(1<<20, 1, 50, 100*time.Millisecond)
	for _, tc := range []struct {
		name          string
		read          int64 // the store's clock as read
		before, after time.Time
		want          time.Duration
	}{
		{"first, 4 ms round trip", store(2 * time.Millisecond), at(0), at(4 * time.Millisecond), 2*time.Second - 2*time.Millisecond},
		{"answer read 3 s late", store(time.Second), at(time.Second), at(4 * time.Second), 2*time.Second - 2*time.Millisecond - 3996*time.Microsecond},
		{"a better one", store(5 * time.Second), at(5 * time.Second), at(5*time.Second + 100*time.Microsecond), 2*time.Second - 100*time.Microsecond},
		{"the node's clock stepped 10 s forward", store(6 * time.Second), at(16 * time.Second), at(16*time.Second + time.Millisecond), -8*time.Second - time.Millisecond},
	} {
		a.measure(tc.read, tc.before, tc.after)
		if a.offset != tc.want {
			t.Errorf("%s: offset %v, want %v", tc.name, a.offset, tc.want)
		}
	}
}
