package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

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
			run(t, goroutines, func(int) error {
				for range each {
					d, err := sluice.Take(context.Background(), e.store, k, l, 1)
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
		run(t, goroutines, func(int) error {
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
		d, err := sluice.Take(context.Background(), e.store, ka, la, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining != 15 {
			t.Fatalf("%s has %d remaining, want 15: denied batches consumed", ka, d.Remaining)
		}
	})
}

// run runs f in n goroutines, numbered 0 to n-1, and waits for them,
// failing t on errors.
func run(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if err := f(i); err != nil {
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
			if _, err := sluice.Take(ctx, e.store, k, l, 1); !errors.Is(err, context.Canceled) {
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
