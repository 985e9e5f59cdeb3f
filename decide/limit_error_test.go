package decide_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/redis"
)

// inexactRules has a limit the Redis store can decide (user) beside one it
// cannot compute exactly (1,000,003 a day in a token bucket).
const inexactRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: report
    rate_limit: {unit: day, requests_per_unit: 1000003, algorithm: token_bucket}
`

// TestLimitErrorKeepsTheBreakerShut checks, on a real Redis, that requests
// on a limit the store refuses (redis.ErrInexact, a sluice.ErrLimit) are
// decided by the fail mode without counting as store failures: however many
// there are, the breaker stays shut and a user over another limit is still
// denied. Before, they opened the breaker, and fail open then admitted the
// over-limit user.
func TestLimitErrorKeepsTheBreakerShut(t *testing.T) {
	t.Parallel()
	cfg := redis.DefaultConfig()
	cfg.KeyPrefix = fmt.Sprintf("decidetest:%x:", rand.Uint64())
	// Bounds on a hang only: the defaults (1s) failed handshakes and calls
	// on a loaded machine.
	cfg.DialTimeout, cfg.Timeout = 10*time.Second, 10*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := redis.Open(ctx, "redis://"+testenv.RedisAddr(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })

	set := loadRules(t, inexactRules)
	if err := set.Check(st.CheckLimit); err == nil {
		t.Fatal("the store's check accepts the inexact limit; the test needs one it refuses")
	}
	clk := newClock()
	dc := decide.DefaultConfig()
	dc.Store, dc.Fail = st, decide.FailOpen
	dc.StoreTimeout = time.Second // a loaded machine; a timeout would count as a failure
	dc.BreakerFailures = 2
	s := newService(t, set, clk, dc)

	if resp := decideOK(t, s, req("api", []string{"user", "alice"})); resp.Overall != decide.OK || resp.Mode != decide.ModeStore {
		t.Fatalf("alice's first request: %v in mode %v, want OK from the store", resp.Overall, resp.Mode)
	}
	for i := range 10 {
		resp := decideOK(t, s, req("api", []string{"report", "r"}))
		if resp.Overall != decide.OK || resp.Mode != decide.ModeOpen {
			t.Fatalf("inexact request %d: %v in mode %v, want OK by fail open", i, resp.Overall, resp.Mode)
		}
	}
	if s.Mode() != decide.ModeStore {
		t.Errorf("Mode() = %v after the refused limits, want store: the breaker opened", s.Mode())
	}
	resp := decideOK(t, s, req("api", []string{"user", "alice"}))
	if resp.Overall != decide.OverLimit || resp.Mode != decide.ModeStore {
		t.Fatalf("alice over her limit: %v in mode %v, want OVER_LIMIT from the store", resp.Overall, resp.Mode)
	}
}

// refusing is a store that refuses one limit with an error wrapping
// sluice.ErrLimit, as a store that cannot apply it does, and passes the
// rest on to a real store.
type refusing struct {
	sluice.Store
	refuse sluice.Limit
}

func (r *refusing) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	for _, q := range reqs {
		if q.Limit == r.refuse {
			return fmt.Errorf("take %s: %w", q.Key, sluice.ErrLimit)
		}
	}
	return r.Store.TakeAll(ctx, reqs, ds)
}

// TestLimitErrorProbe checks that a probe of an open breaker that meets a
// refused limit neither closes nor reopens the breaker: the next request
// probes again.
func TestLimitErrorProbe(t *testing.T) {
	t.Parallel()
	clk := newClock()
	set := loadRules(t, inexactRules)
	sw := &switchable{Store: &refusing{Store: newMemory(t, clk), refuse: set.Rules("api")[1].Limits[0].Enforced()}}
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.BreakerFailures, cfg.BreakerCoolDown, cfg.Fail = sw, 1, time.Second, decide.FailOpen
	s := newService(t, set, clk, cfg)
	sw.down.Store(true)
	decideOK(t, s, req("api", []string{"user", "alice"})) // opens the breaker
	sw.down.Store(false)
	clk.Advance(time.Second)
	if resp := decideOK(t, s, req("api", []string{"report", "r"})); resp.Mode != decide.ModeOpen {
		t.Fatalf("probe on a refused limit: mode %v, want fail_open", resp.Mode)
	}
	if resp := decideOK(t, s, req("api", []string{"user", "alice"})); resp.Mode != decide.ModeStore {
		t.Fatalf("the next request: mode %v, want a probe that closes the breaker", resp.Mode)
	}
	if !errors.Is(fmt.Errorf("x: %w", redis.ErrInexact), sluice.ErrLimit) {
		t.Error("redis.ErrInexact does not wrap sluice.ErrLimit")
	}
}
