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

// asyncBound is async mode's stated bound for nodes nodes sharing out
// with k: over the limit by at most nodes × max(⌊rate / (k × nodes)⌋, 1)
// on the window limits (those below k × nodes decide exactly); no bound
// under it.
func asyncBound(k int64) storetest.Bound {
	return storetest.Bound{
		Over: func(l sluice.Limit, nodes int) int64 {
			if !redis.Leasable(l) || l.Rate < k*int64(nodes) {
				return 0
			}
			return int64(nodes) * max(l.Rate/(k*int64(nodes)), 1)
		},
		Under: func(l sluice.Limit, _ int) int64 { return l.Capacity() },
	}
}

// openAsyncNodes returns n async-mode Stores over Redis stores of their own
// on url sharing prefix, deciding by now, with AsyncNodes n; closed (their
// hits written back) when the test ends.
func openAsyncNodes(t testing.TB, url, prefix string, now func() time.Time, n int, cfg Config) []*Store {
	t.Helper()
	nodes := make([]*Store, n)
	for i := range nodes {
		rc := redis.DefaultConfig()
		rc.KeyPrefix, rc.Now, rc.ExpiryMargin = prefix, now, 10*time.Minute
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := redis.Open(ctx, url, rc)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Sync, c.Now, c.AsyncNodes = Async, now, int64(n)
		s, err := New(r, c)
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = s
		t.Cleanup(func() {
			if err := s.Close(context.Background()); err != nil {
				t.Error(err)
			}
			r.Close()
		})
	}
	return nodes
}

// TestAsyncContract runs the store suite's contract tier on async mode
// over Redis and Redis Cluster, 1 and 3 nodes, with the bound async mode
// states (k = 2 here, so that the suite's small limits are shared out:
// at most half the limit over).
func TestAsyncContract(t *testing.T) {
	for name, url := range backendURLs() {
		t.Run(name, func(t *testing.T) {
			u := url(t)
			storetest.RunContract(t, func(t *testing.T, now func() time.Time, n int) []sluice.Store {
				prefix := fmt.Sprintf("localfirsttest:%x:", rand.Uint64())
				var out []sluice.Store
				for _, s := range openAsyncNodes(t, u, prefix, now, n, Config{AsyncShare: 2, SyncInterval: 5 * time.Millisecond}) {
					out = append(out, s)
				}
				return out
			}, asyncBound(2))
		})
	}
}

// TestAsyncOvershoot drives 3 async nodes, each syncing on its own
// schedule (staggered at random, as servers' timers are), on one hot key
// of 1,000 a minute until no node admits any more, many times over: the
// hits admitted never pass 1,000 + 3 × ⌊1,000/150⌋ = 1,018, the stated bound, and the
// test reports the largest overshoot seen.
func TestAsyncOvershoot(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	url := "redis://" + testenv.RedisAddr(t) + "/0"
	nodes := openAsyncNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{SyncInterval: time.Hour})
	l := sluice.Limit{Rate: 1000, Period: time.Minute}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 7))
	worst, rounds := int64(-1000), 0
	for run := range 10 {
		clk.Advance(time.Minute) // a fresh window
		key := fmt.Sprintf("{hot%d}", run)
		var admitted int64
		for round := 0; round < 1500; round++ {
			// Between two syncs of a node, the nodes take turns at random.
			for range 20 {
				d, err := nodes[rng.IntN(3)].Take(context.Background(), key, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
			}
			if err := nodes[rng.IntN(3)].SyncAsync(context.Background()); err != nil {
				t.Fatal(err)
			}
			rounds++
		}
		for _, s := range nodes {
			if err := s.SyncAsync(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if admitted > 1000+3*(1000/(50*3)) {
			t.Fatalf("run %d: admitted %d, more than 1000 + 3 × ⌊1000/150⌋", run, admitted)
		}
		worst = max(worst, admitted-1000)
	}
	t.Logf("10 windows, 3 nodes, %d staggered syncs: the largest overshoot %d (bound 18)", rounds, worst)
	if worst < 0 {
		t.Fatalf("never reached the limit (largest overshoot %d): the test does not test the bound", worst)
	}
}
