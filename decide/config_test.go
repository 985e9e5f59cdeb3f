package decide_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// TestZeroConfig checks that zero fields mean their defaults: a store that
// hangs is left after the default StoreTimeout (before, zero meant no
// timeout and the decision hung with the store), its call going on in the
// background for at most the default StoreHardTimeout, and the breaker opens
// after the default BreakerFailures (before, zero disabled it) once they
// span the default BreakerWindow; and that the negative values disable
// them.
func TestZeroConfig(t *testing.T) {
	t.Parallel()
	def := decide.DefaultConfig()
	tests := []struct {
		name     string
		cfg      decide.Config
		deadline bool // the caller's context has one
		// want: whether the store's call had a deadline of the default
		// StoreHardTimeout (not the caller's, 4 × StoreTimeout), and the calls that reach the store in
		// def.BreakerFailures+3 decisions.
		timeout bool
		calls   int64
	}{
		{name: "zero", timeout: true, calls: int64(def.BreakerFailures)},
		// Only the caller's deadline ends the calls: not the store's fault,
		// so the breaker counts none.
		{name: "negative timeout", cfg: decide.Config{StoreTimeout: -1}, deadline: true, calls: int64(def.BreakerFailures) + 3},
		{name: "negative breaker", cfg: decide.Config{BreakerFailures: -1}, timeout: true, calls: int64(def.BreakerFailures) + 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			var mu sync.Mutex
			var bounded []bool
			fake := &fakeStore{takeAll: func(ctx context.Context, _ []sluice.Request, _ []sluice.Decision) error {
				dl, ok := ctx.Deadline()
				mu.Lock()
				left := time.Until(dl)
				bounded = append(bounded, ok && left > 4*def.StoreTimeout && left <= def.StoreHardTimeout)
				mu.Unlock()
				<-ctx.Done()
				return ctx.Err()
			}}
			cfg := tt.cfg
			cfg.Store = fake
			s := newService(t, loadRules(t, oneLimit), clk, cfg)
			for i := range def.BreakerFailures + 3 {
				ctx := context.Background()
				if tt.deadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, 4*def.StoreTimeout)
					defer cancel()
				}
				done := make(chan *decide.Response, 1)
				go func() {
					// A key of its own each: a key with hits in flight is
					// decided locally until the store has them.
					resp, _ := s.Decide(ctx, req("api", []string{"user", fmt.Sprint("alice", i)}))
					done <- resp
				}()
				select {
				case resp := <-done:
					if resp == nil || resp.Mode == decide.ModeStore {
						t.Fatalf("decision %d: %+v, want one not by the store", i, resp)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("decision %d still waiting on a hung store after 10s", i)
				}
				if i == 0 {
					// The next failures span the window, while the server
					// runs (its Probe every 250 ms): a jump with nothing
					// running is a pause, no time the store failed.
					for range def.BreakerWindow / (250 * time.Millisecond) {
						clk.Advance(250 * time.Millisecond)
						_ = s.Probe(context.Background())
					}
				}
			}
			if got := fake.calls.Load(); got != tt.calls {
				t.Errorf("%d calls reached the store, want %d", got, tt.calls)
			}
			mu.Lock()
			defer mu.Unlock()
			for i, b := range bounded {
				if b != tt.timeout {
					t.Errorf("call %d bounded by the default hard store timeout: %v, want %v", i, b, tt.timeout)
				}
			}
		})
	}
}

// TestConfigErrors checks that a field no default can fix is an error.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	mem := newMemory(t, newClock())
	for _, cfg := range []decide.Config{
		{},
		{Store: mem, Fail: decide.FailClosed + 1},
		{Store: mem, StoreMaxTimeout: -1},
		{Store: mem, StoreHardTimeout: -1},
		{Store: mem, MaxLateCalls: -1},
		{Store: mem, LedgerBytes: -1},
		{Store: mem, BreakerCoolDown: -1},
		{Store: mem, BreakerWindow: -1},
		{Store: mem, MaxDescriptors: -1},
		{Store: mem, MaxEntries: -1},
		{Store: mem, MaxValueBytes: -1},
		{Store: mem, DigestAbove: -1},
	} {
		if _, err := decide.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted it", cfg)
		}
	}
}
