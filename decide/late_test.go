package decide_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// hangStore is a memory store (blocking, as Redis) whose calls, while
// hang is set, wait for their context to end and report its Err on
// ended: a store that never answers, a fault a real one cannot be made
// to show on demand for a given call.
type hangStore struct {
	sluice.Store
	hang  atomic.Bool
	calls atomic.Int64
	ended chan error
	seen  func(ctx context.Context) // called with every call's context, if set
}

func (h *hangStore) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	h.calls.Add(1)
	if h.seen != nil {
		h.seen(ctx)
	}
	if h.hang.Load() {
		<-ctx.Done()
		h.ended <- ctx.Err()
		return ctx.Err()
	}
	return h.Store.TakeAll(ctx, reqs, ds)
}

// lateService returns a Service with the fail mode local over h, with a
// store timeout of timeout and a hard timeout of hard.
func lateService(t *testing.T, h *hangStore, timeout, hard time.Duration, maxLate int) *decide.Service {
	t.Helper()
	cfg := decide.DefaultConfig()
	cfg.Store = h
	cfg.StoreTimeout, cfg.StoreMaxTimeout, cfg.StoreHardTimeout = timeout, timeout, hard
	cfg.MaxLateCalls = maxLate
	cfg.BreakerFailures = 1000 // the breaker stays out of these tests
	return newService(t, loadRules(t, weatherRules), newClock(), cfg)
}

// endedWith waits (10s at most) for a hung call of h to end, and returns
// its context's Err.
func endedWith(t *testing.T, h *hangStore) error {
	t.Helper()
	select {
	case err := <-h.ended:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the hung store call did not end")
		return nil
	}
}

type lateKey struct{}

// TestLateCallContext: the context of a store call of the fail mode local
// carries the caller's values and the hard timeout as its deadline, and
// a call that ended in time leaves the next ones a context that has not
// ended (the calls' contexts are reused).
func TestLateCallContext(t *testing.T) {
	t.Parallel()
	const hard = time.Hour
	h := &hangStore{Store: newMemory(t, newClock())}
	var bad atomic.Int64
	h.seen = func(ctx context.Context) {
		d, ok := ctx.Deadline()
		left := time.Until(d)
		done := false
		select {
		case <-ctx.Done():
			done = true
		default:
		}
		if !ok || left <= hard-time.Minute || left > hard || ctx.Err() != nil || done || ctx.Value(lateKey{}) != "v" {
			bad.Add(1)
			t.Errorf("the store call's context: deadline in %v (%v), Err %v, done %v, value %v; want in %v, nil, false, v",
				left, ok, ctx.Err(), done, ctx.Value(lateKey{}), hard)
		}
	}
	s := lateService(t, h, 10*time.Second, hard, 0)
	ctx := context.WithValue(context.Background(), lateKey{}, "v")
	for i := range 50 {
		resp, err := s.Decide(ctx, req("api", []string{"user", "u"}))
		if err != nil || resp.Overall != decide.OK || resp.Mode != decide.ModeStore {
			t.Fatalf("decision %d: %+v, %v; want OK from the store", i, resp, err)
		}
		if bad.Load() > 0 {
			break
		}
	}
	if n := h.calls.Load(); n != 50 {
		t.Errorf("%d store calls, want 50", n)
	}
}

// TestLateCallHardTimeout: a store call that does not answer is decided
// locally and ended at the hard timeout, whether that comes after the
// store timeout or before it.
func TestLateCallHardTimeout(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		timeout, hard time.Duration
	}{
		{name: "after the store timeout", timeout: 20 * time.Millisecond, hard: 100 * time.Millisecond},
		{name: "before the store timeout", timeout: 200 * time.Millisecond, hard: 20 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := &hangStore{Store: newMemory(t, newClock()), ended: make(chan error, 1)}
			h.hang.Store(true)
			s := lateService(t, h, tt.timeout, tt.hard, 0)
			resp := decideOK(t, s, req("api", []string{"user", "u"}))
			if resp.Overall != decide.OK || resp.Mode != decide.ModeLocal {
				t.Errorf("decision: %v in mode %v, want OK, locally", resp.Overall, resp.Mode)
			}
			if err := endedWith(t, h); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the call ended with %v, want the hard timeout", err)
			}
		})
	}
}

// TestLateCallCloseCuts: Close with a context that has ended cuts the
// store calls in flight short at once, long before their hard timeout.
func TestLateCallCloseCuts(t *testing.T) {
	t.Parallel()
	h := &hangStore{Store: newMemory(t, newClock()), ended: make(chan error, 2)}
	h.hang.Store(true)
	s := lateService(t, h, 20*time.Millisecond, time.Hour, 0)
	for _, u := range []string{"u", "v"} {
		if resp := decideOK(t, s, req("api", []string{"user", u})); resp.Mode != decide.ModeLocal {
			t.Errorf("decision of %s in mode %v, want local", u, resp.Mode)
		}
	}
	closeNow(s)
	for range 2 {
		if err := endedWith(t, h); !errors.Is(err, context.Canceled) {
			t.Errorf("a call ended with %v, want canceled by Close", err)
		}
	}
}

// TestLateCallMax: past MaxLateCalls in flight, decisions are made
// locally without a store call.
func TestLateCallMax(t *testing.T) {
	t.Parallel()
	h := &hangStore{Store: newMemory(t, newClock()), ended: make(chan error, 1)}
	h.hang.Store(true)
	s := lateService(t, h, 20*time.Millisecond, time.Hour, 1)
	for _, u := range []string{"u", "v", "w"} {
		if resp := decideOK(t, s, req("api", []string{"user", u})); resp.Mode != decide.ModeLocal {
			t.Errorf("decision of %s in mode %v, want local", u, resp.Mode)
		}
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("%d store calls, want 1 (MaxLateCalls)", n)
	}
	closeNow(s)
	if err := endedWith(t, h); !errors.Is(err, context.Canceled) {
		t.Errorf("the call ended with %v, want canceled by Close", err)
	}
}
