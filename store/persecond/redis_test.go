package persecond

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/redis"
)

// TestRedis routes between two real Redis servers, as Envoy's
// REDIS_PERSECOND: a per-second limit's key lands only in the second
// Redis, an hourly one's only in the first; a TakeAll the per-second
// limit denies writes nothing to the first Redis, not even the denial's
// key.
func TestRedis(t *testing.T) {
	t.Parallel()
	mainRedis, perSecond := testenv.StartRedis(t), testenv.StartRedis(t)
	open := func(addr string) *redis.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := redis.Open(ctx, "redis://"+addr, redis.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	s, err := New(open(perSecond.Addr), open(mainRedis.Addr), Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys := func(r *testenv.RedisServer) string { return strings.TrimSpace(r.CLI("--raw", "keys", "*")) }

	perSec := sluice.Limit{Rate: 1, Period: time.Second}
	daily := sluice.Limit{Rate: 5, Period: 24 * time.Hour}
	reqs := []sluice.Request{
		{Key: "user=alice/day", Limit: daily, Cost: 1, Group: "alice"},
		{Key: "user=alice/second", Limit: perSec, Cost: 1, Group: "alice"},
	}
	ds := make([]sluice.Decision, 2)
	// A fresh per-second key admits one hit, and the second Redis keeps
	// it; then the same per-second limit denies within its second (or, if
	// the second turned, the test is retried by the loop below).
	for attempt := 0; ; attempt++ {
		if got := keys(mainRedis); got != "" {
			t.Fatalf("the first Redis has keys %q before any daily hit", got)
		}
		if err := s.TakeAll(ctx, reqs[1:], ds); err != nil || !ds[0].Allowed {
			t.Fatalf("the per-second hit: %+v, %v", ds[0], err)
		}
		if err := s.TakeAll(ctx, reqs, ds); err != nil {
			t.Fatal(err)
		}
		if !ds[1].Allowed {
			break // denied within the second, as wanted
		}
		if attempt == 20 {
			t.Fatal("the per-second limit never denied its second hit")
		}
		// The second turned between the two calls and both passed: the
		// daily key was taken; start over on new keys.
		reqs[0].Key, reqs[1].Key = reqs[0].Key+"+", reqs[1].Key+"+"
		mainRedis.CLI("flushall")
	}
	if !ds[0].Allowed || ds[0].Remaining != 4 {
		t.Errorf("the daily decision of the denied TakeAll = %+v, want what it would have been: allowed, 4 left", ds[0])
	}
	if got := keys(mainRedis); got != "" {
		t.Errorf("the first Redis has keys %q after a TakeAll the per-second limit denied, want none", got)
	}
	if got := keys(perSecond); !strings.Contains(got, "user=alice/second") || strings.Contains(got, "day") {
		t.Errorf("the second Redis has keys %q, want the per-second key alone", got)
	}

	// Allowed: the daily key lands in the first Redis only.
	reqs[0].Key = "user=bob/day"
	if d, err := sluice.Take(ctx, s, reqs[0].Key, daily, 1); err != nil || !d.Allowed {
		t.Fatalf("a daily hit: %+v, %v", d, err)
	}
	if got := keys(mainRedis); !strings.Contains(got, "user=bob/day") {
		t.Errorf("the first Redis has keys %q, want the daily key", got)
	}
	if got := keys(perSecond); strings.Contains(got, "day") {
		t.Errorf("the second Redis has keys %q, want no daily key", got)
	}
}
