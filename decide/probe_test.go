package decide_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/decide"
)

// TestProbe opens the breaker with a store that refuses, then brings the
// store back: Probe sends decisions back to it without any decision being
// made, and pings only while they go without it.
func TestProbe(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := &switchable{Store: newMemory(t, clk)}
	store.down.Store(true)
	var pings atomic.Int64
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.BreakerFailures, cfg.Fail = store, 2, decide.FailOpen
	cfg.Ping = func(context.Context) error {
		pings.Add(1)
		if store.down.Load() {
			return errRefused
		}
		return nil
	}
	s := newService(t, loadRules(t, oneLimit), clk, cfg)
	if err := s.Probe(context.Background()); err != nil || pings.Load() != 0 {
		t.Fatalf("Probe with the breaker closed: %v, %d pings; want nil and none", err, pings.Load())
	}
	for range 2 {
		decideOK(t, s, req("api", []string{"user", "alice"}))
	}
	if s.Mode() != decide.ModeOpen {
		t.Fatalf("Mode() = %v after two refusals, want fail_open", s.Mode())
	}
	if err := s.Probe(context.Background()); err == nil || s.Mode() != decide.ModeOpen {
		t.Errorf("Probe of a store still down: %v, Mode() %v; want its error and fail_open", err, s.Mode())
	}
	store.down.Store(false)
	calls := store.calls.Load()
	if err := s.Probe(context.Background()); err != nil || s.Mode() != decide.ModeStore {
		t.Errorf("Probe of a store back up: %v, Mode() %v; want nil and store", err, s.Mode())
	}
	if got := store.calls.Load(); got != calls {
		t.Errorf("Probe made %d decisions, want none", got-calls)
	}
	if got := pings.Load(); got != 2 {
		t.Errorf("%d pings, want 2", got)
	}
	if err := s.Probe(context.Background()); err != nil || pings.Load() != 2 {
		t.Errorf("Probe back on the store: %v, %d pings; want nil and no more", err, pings.Load())
	}
}
