// Package storetest is the conformance suite of sluice.Store: scenarios
// that every store runs, and in which it must decide exactly as the
// sluice.Limit transitions do on local states.
//
// A store's tests call Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
//			s, err := memory.New(memory.Config{..., Now: now})
//			...
//			return s
//		})
//	}
//
// The store must decide by the clock now it is given (not by its own or a
// server's clock), at microsecond resolution. The suite sets that clock to
// random instants that never go back.
//
// Random scenarios log their seed; set SLUICE_STORETEST_SEED to a logged
// seed to replay one.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// Run runs the conformance suite, each scenario as a subtest with a new
// store from newStore. A store that keeps state elsewhere (Redis) need not
// start empty: the suite's keys carry a random prefix. All keys of one
// scenario share a Redis hash tag ("storetest:{...}:"), so that a Redis
// Cluster store keeps each batch on one slot.
//
// What the suite requires of a store:
//   - Take decides as sluice.Limit.Take does on a local sluice.State that
//     saw the same requests at the same times, for every algorithm, with
//     identical Decision structs.
//   - TakeAll is all or nothing: when one request is denied, no request
//     consumes anything, and each reports what it would have decided. A key
//     given twice in one batch sees its first request's hits.
//   - Cost 0 reports without consuming.
//   - Keys are independent, and a key used under another algorithm than
//     before starts afresh.
//   - Concurrent requests on one key, at one instant, admit exactly the
//     limit.
//   - A context that is already cancelled makes Take and TakeAll return an
//     error that wraps context.Canceled, and apply nothing.
//   - TakeAll with fewer decisions than requests returns an error.
func Run(t *testing.T, newStore func(t *testing.T, now func() time.Time) sluice.Store) {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("SLUICE_STORETEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_STORETEST_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with SLUICE_STORETEST_SEED=%d)", seed, seed)

	scenarios := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"Decisions", testDecisions},
		{"Batches", testBatches},
		{"TakeAllAllOrNothing", testAllOrNothing},
		{"TakeAllRepeatedKey", testRepeatedKey},
		{"CostZero", testCostZero},
		{"IndependentKeys", testIndependentKeys},
		{"AlgorithmChange", testAlgorithmChange},
		{"Concurrent", testConcurrent},
		{"CanceledContext", testCanceledContext},
		{"ShortDecisions", testShortDecisions},
	}
	for i, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			c := &clock{}
			c.us.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixMicro() + rng.Int64N(int64(24*time.Hour/time.Microsecond)))
			s := newStore(t, c.now)
			if s == nil {
				t.Fatal("newStore returned nil")
			}
			sc.run(t, &env{
				store: s,
				clock: c,
				rng:   rng,
				// A hash tag: a scenario's keys share a Redis Cluster slot.
				prefix: fmt.Sprintf("storetest:{%016x:%s}:", rng.Uint64(), sc.name),
				model:  model{},
			})
		})
	}
}

// env is what a scenario works with.
type env struct {
	store  sluice.Store
	clock  *clock
	rng    *rand.Rand
	prefix string // of every key, so that stores shared between runs do not mix them
	model  model
}

// key returns the scenario's key named name.
func (e *env) key(name string) string { return e.prefix + name }

// align moves the clock to the start of the next period-long window, plus
// a second, so that a scenario's few steps stay in one window.
func (e *env) align(period time.Duration) {
	p := period.Microseconds()
	now := e.clock.us.Load()
	e.clock.us.Store(now - now%p + p + int64(time.Second/time.Microsecond))
}

// take calls Take at the clock's time and checks the decision against the
// model's.
func (e *env) take(t *testing.T, key string, l sluice.Limit, cost int64) sluice.Decision {
	t.Helper()
	now := e.clock.us.Load()
	got, err := e.store.Take(context.Background(), key, l, cost)
	if err != nil {
		t.Fatalf("Take(%q, %v, %d): %v", key, l, cost, err)
	}
	want := e.model.take(key, l, now, cost)
	if got != want {
		t.Fatalf("Take(%q, %v, %d) at %s:\n got %+v\nwant %+v", key, l, cost, e.clock.now().Format(time.RFC3339Nano), got, want)
	}
	return got
}

// takeAll calls TakeAll at the clock's time and checks the decisions
// against the model's.
func (e *env) takeAll(t *testing.T, reqs []sluice.Request) []sluice.Decision {
	t.Helper()
	now := e.clock.us.Load()
	got := make([]sluice.Decision, len(reqs))
	if err := e.store.TakeAll(context.Background(), reqs, got); err != nil {
		t.Fatalf("TakeAll(%v): %v", reqs, err)
	}
	want := e.model.takeAll(reqs, now)
	for i := range reqs {
		if got[i] != want[i] {
			t.Fatalf("TakeAll at %s, request %d of %v:\n got %+v\nwant %+v", e.clock.now().Format(time.RFC3339Nano), i, reqs, got[i], want[i])
		}
	}
	return got
}

// clock is the fake clock a scenario's store decides by.
type clock struct{ us atomic.Int64 }

func (c *clock) now() time.Time { return time.UnixMicro(c.us.Load()).UTC() }

// algorithms are all the algorithms, in order.
var algorithms = []sluice.Algorithm{
	sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog,
	sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA,
}

// limitOf returns a limit of algorithm a admitting capacity hits at once,
// refilled (or windowed) over period.
func limitOf(a sluice.Algorithm, capacity int64, period time.Duration) sluice.Limit {
	l := sluice.Limit{Algorithm: a, Rate: capacity, Period: period}
	if a.HasBurst() { // a rate below the burst, so that bursts and refills both matter
		l.Rate = max(capacity/2, 1)
		l.Burst = capacity
	}
	return l
}

// capacity returns how many hits l admits at once.
func capacity(l sluice.Limit) int64 {
	if l.Algorithm.HasBurst() && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// arrival advances the clock by a random gap: often within the limit's
// pace, sometimes not at all, sometimes to or just before a window
// boundary, sometimes past several periods.
func (e *env) arrival(l sluice.Limit) {
	p := l.Period.Microseconds()
	now := e.clock.us.Load()
	var next int64
	switch r := e.rng.IntN(20); {
	case r < 2:
		next = now
	case r < 4: // to the next boundary, or one µs before it
		next = now - now%p + p - int64(r-2)
	case r < 5:
		next = now + p + e.rng.Int64N(3*p)
	default:
		next = now + 1 + e.rng.Int64N(2*p/max(l.Rate, 1))
	}
	e.clock.us.Store(max(next, now))
}

// cost returns a random cost: mostly 1, sometimes 0, a few, or more than
// the limit admits at once.
func (e *env) cost(l sluice.Limit) int64 {
	switch r := e.rng.IntN(20); {
	case r < 2:
		return 0
	case r < 6:
		return 2 + e.rng.Int64N(3)
	case r < 7:
		return capacity(l) + 1
	default:
		return 1
	}
}

func testDecisions(t *testing.T, e *env) {
	for _, a := range algorithms {
		for _, l := range []sluice.Limit{
			limitOf(a, 10, time.Second),
			limitOf(a, 7, 300*time.Millisecond+7*time.Microsecond), // rates that do not divide the period
		} {
			t.Run(fmt.Sprintf("%s/%v", a, l), func(t *testing.T) {
				keys := []string{e.key(l.String() + ":a"), e.key(l.String() + ":b"), e.key(l.String() + ":c")}
				allowed, denied := 0, 0
				for range 300 {
					e.arrival(l)
					if e.take(t, keys[e.rng.IntN(len(keys))], l, e.cost(l)).Allowed {
						allowed++
					} else {
						denied++
					}
				}
				if allowed == 0 || denied == 0 {
					t.Fatalf("%d allowed, %d denied: the traffic does not test the limit", allowed, denied)
				}
			})
		}
	}
}

func testBatches(t *testing.T, e *env) {
	// One key per algorithm, small limits, so that batches are often denied.
	var keys []string
	var limits []sluice.Limit
	for _, a := range algorithms {
		keys = append(keys, e.key(a.String()))
		limits = append(limits, limitOf(a, 4, 200*time.Millisecond))
	}
	allowed, denied := 0, 0
	for range 300 {
		e.arrival(limits[0])
		reqs := make([]sluice.Request, 1+e.rng.IntN(4))
		for i := range reqs {
			k := e.rng.IntN(len(keys))
			reqs[i] = sluice.Request{Key: keys[k], Limit: limits[k], Cost: e.cost(limits[k])}
		}
		all := true
		for _, d := range e.takeAll(t, reqs) {
			all = all && d.Allowed
		}
		if all {
			allowed++
		} else {
			denied++
		}
	}
	if allowed == 0 || denied == 0 {
		t.Fatalf("%d batches allowed, %d denied: the traffic does not test the store", allowed, denied)
	}
}

func testAllOrNothing(t *testing.T, e *env) {
	e.align(time.Minute)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			free, full := e.key(a.String()+":free"), e.key(a.String()+":full")
			lf := limitOf(a, 10, time.Minute)
			ls := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Period: time.Minute}
			e.take(t, free, lf, 3)
			e.take(t, full, ls, 1)
			e.clock.us.Add(1000)
			ds := e.takeAll(t, []sluice.Request{{Key: free, Limit: lf, Cost: 2}, {Key: full, Limit: ls, Cost: 1}})
			if !ds[0].Allowed || ds[1].Allowed {
				t.Fatalf("decisions %+v: want the first to report it would pass, the second denied", ds)
			}
			if d := e.take(t, free, lf, 0); d.Remaining != 7 {
				t.Fatalf("after a denied batch, %d remaining: want 7, the batch consumed none", d.Remaining)
			}
		})
	}
}

func testRepeatedKey(t *testing.T, e *env) {
	e.align(time.Minute)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			k := e.key(a.String())
			l := limitOf(a, 3, time.Minute)
			ds := e.takeAll(t, []sluice.Request{{Key: k, Limit: l, Cost: 2}, {Key: k, Limit: l, Cost: 2}})
			if !ds[0].Allowed || ds[1].Allowed {
				t.Fatalf("decisions %+v: the second request must see the first's 2 hits of 3", ds)
			}
			if d := e.take(t, k, l, 0); d.Remaining != 3 {
				t.Fatalf("after a denied batch, %d remaining: want 3", d.Remaining)
			}
			ds = e.takeAll(t, []sluice.Request{{Key: k, Limit: l, Cost: 1}, {Key: k, Limit: l, Cost: 0}, {Key: k, Limit: l, Cost: 2}})
			if !ds[2].Allowed || ds[1].Remaining != 2 || ds[2].Remaining != 0 {
				t.Fatalf("decisions %+v: want 1, then 2 remaining, then 2 more allowed", ds)
			}
			e.clock.us.Add(1)
			e.take(t, k, l, 1)
		})
	}
}

func testCostZero(t *testing.T, e *env) {
	e.align(time.Minute)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			k := e.key(a.String())
			l := limitOf(a, 5, time.Minute)
			for range 2 {
				if d := e.take(t, k, l, 0); !d.Allowed || d.Remaining != 5 {
					t.Fatalf("cost 0 on a fresh key: %+v, want allowed with 5 remaining", d)
				}
			}
			e.take(t, k, l, 2)
			for range 3 {
				e.clock.us.Add(1)
				if d := e.take(t, k, l, 0); d.Remaining < 3 {
					t.Fatalf("cost 0 after 2 hits of 5: %d remaining", d.Remaining)
				}
			}
			if d := e.take(t, k, l, 3); !d.Allowed {
				t.Fatalf("reports consumed hits: %+v", d)
			}
		})
	}
}

func testIndependentKeys(t *testing.T, e *env) {
	e.align(time.Minute)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l := limitOf(a, 4, time.Minute)
			ka, kb := e.key(a.String()+":a"), e.key(a.String()+":b")
			e.take(t, ka, l, 4)
			if d := e.take(t, ka, l, 1); d.Allowed {
				t.Fatalf("an exhausted key admits more: %+v", d)
			}
			if d := e.take(t, kb, l, 1); !d.Allowed || d.Remaining != 3 {
				t.Fatalf("another key's hits counted: %+v", d)
			}
		})
	}
}

func testAlgorithmChange(t *testing.T, e *env) {
	e.align(time.Minute)
	for _, from := range algorithms {
		for _, to := range algorithms {
			if from == to {
				continue
			}
			t.Run(from.String()+"/"+to.String(), func(t *testing.T) {
				k := e.key(from.String() + ":" + to.String())
				e.take(t, k, limitOf(from, 2, time.Minute), 2)
				e.clock.us.Add(1)
				lt := limitOf(to, 2, time.Minute)
				var fresh sluice.State
				want := lt.TakeMicros(&fresh, e.clock.us.Load(), 1)
				if d := e.take(t, k, lt, 1); d != want {
					t.Fatalf("under %s after %s: %+v, want a fresh key's %+v", to, from, d, want)
				}
			})
		}
	}
}

func testConcurrent(t *testing.T, e *env) {
	const goroutines, each = 8, 10
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			k := e.key(a.String())
			l := limitOf(a, 40, time.Hour)
			var admitted atomic.Int64
			run(t, goroutines, func() error {
				for range each {
					d, err := e.store.Take(context.Background(), k, l, 1)
					if err != nil {
						return err
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
				return nil
			})
			if n := admitted.Load(); n != 40 {
				t.Fatalf("%d goroutines × %d requests at one instant admitted %d, want exactly 40", goroutines, each, n)
			}
		})
	}
	t.Run("TakeAll", func(t *testing.T) {
		ka, kb := e.key("batch:a"), e.key("batch:b")
		la, lb := limitOf(sluice.FixedWindow, 40, time.Hour), limitOf(sluice.GCRA, 25, time.Hour)
		reqs := []sluice.Request{{Key: ka, Limit: la, Cost: 1}, {Key: kb, Limit: lb, Cost: 1}}
		var admitted atomic.Int64
		run(t, goroutines, func() error {
			ds := make([]sluice.Decision, 2)
			for range each {
				if err := e.store.TakeAll(context.Background(), reqs, ds); err != nil {
					return err
				}
				if ds[0].Allowed && ds[1].Allowed {
					admitted.Add(1)
				}
			}
			return nil
		})
		if n := admitted.Load(); n != 25 {
			t.Fatalf("admitted %d batches, want exactly 25", n)
		}
		d, err := e.store.Take(context.Background(), ka, la, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining != 15 {
			t.Fatalf("%s has %d remaining, want 15: denied batches consumed", ka, d.Remaining)
		}
	})
}

// run runs f in n goroutines and waits for them, failing t on errors.
func run(t *testing.T, n int, f func() error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			if err := f(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testCanceledContext(t *testing.T, e *env) {
	e.align(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			k := e.key(a.String())
			l := limitOf(a, 5, time.Minute)
			if _, err := e.store.Take(ctx, k, l, 1); !errors.Is(err, context.Canceled) {
				t.Fatalf("Take with a cancelled context: error %v, want one wrapping context.Canceled", err)
			}
			ds := make([]sluice.Decision, 1)
			if err := e.store.TakeAll(ctx, []sluice.Request{{Key: k, Limit: l, Cost: 2}}, ds); !errors.Is(err, context.Canceled) {
				t.Fatalf("TakeAll with a cancelled context: error %v, want one wrapping context.Canceled", err)
			}
			if d := e.take(t, k, l, 0); d.Remaining != 5 {
				t.Fatalf("cancelled calls consumed: %d remaining, want 5", d.Remaining)
			}
		})
	}
}

func testShortDecisions(t *testing.T, e *env) {
	e.align(time.Minute)
	l := limitOf(sluice.FixedWindow, 5, time.Minute)
	reqs := []sluice.Request{{Key: e.key("a"), Limit: l, Cost: 1}, {Key: e.key("b"), Limit: l, Cost: 1}}
	if err := e.store.TakeAll(context.Background(), reqs, make([]sluice.Decision, 1)); err == nil {
		t.Fatal("TakeAll with 1 decision for 2 requests: no error")
	}
	if d := e.take(t, e.key("a"), l, 0); d.Remaining != 5 {
		t.Fatalf("a failed TakeAll consumed: %d remaining, want 5", d.Remaining)
	}
}
