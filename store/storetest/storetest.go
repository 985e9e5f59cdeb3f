// Package storetest is the conformance suite of sluice.Store, in two tiers.
//
// The contract tier (RunContract) is what every store meets, exact or
// not: at one instant it admits the limit's capacity within the store's
// stated Bound, spread over any number of nodes and goroutines; a denied
// TakeAll consumes nothing; cost 0 consumes nothing; a key is whole again
// once its limit has reset; decisions are well formed; a cancelled context
// and too few decisions are errors. A store that decides locally and
// reconciles with a shared store later (a lease or write-back store)
// states its Bound, and the tier checks that bound.
//
// The exactness tier (RunExact) is for exact stores: every decision must be
// identical to what the sluice.Limit transitions decide on local states
// that saw the same requests at the same times.
//
// Run runs both tiers, for an exact store:
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
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// NewStore returns a store that decides by the clock now. A store that
// keeps state elsewhere (Redis) need not start empty: the suite's keys
// carry a random prefix, and all keys of one scenario share a Redis hash
// tag ("storetest:{...}:"), so that a Redis Cluster store keeps each batch
// on one slot.
type NewStore func(t *testing.T, now func() time.Time) sluice.Store

// NewNodes returns n stores (n >= 1) that share the states of their keys,
// as n sluice servers over one Redis do, all deciding by the clock now.
type NewNodes func(t *testing.T, now func() time.Time, n int) []sluice.Store

// Shared returns the NewNodes whose n nodes are one store from newStore:
// for a store that every server shares directly.
func Shared(newStore NewStore) NewNodes {
	return func(t *testing.T, now func() time.Time, n int) []sluice.Store {
		s := newStore(t, now)
		nodes := make([]sluice.Store, n)
		for i := range nodes {
			nodes[i] = s
		}
		return nodes
	}
}

// Bound is how far the hits a store admits may stray from what its limit
// admits, at one instant on one key whose traffic is spread over nodes
// stores (NewNodes). The zero Bound is an exact store's: neither more nor
// fewer.
type Bound struct {
	// Over returns the most hits beyond the limit's capacity that the
	// store may admit at one instant; nil means 0.
	Over func(l sluice.Limit, nodes int) int64
	// Under returns the most hits short of the limit's capacity that the
	// store may admit at one instant when every node keeps asking; nil
	// means 0.
	Under func(l sluice.Limit, nodes int) int64
}

// over and under return the bound's figures, 0 for nil functions.
func (b Bound) over(l sluice.Limit, nodes int) int64 {
	if b.Over == nil {
		return 0
	}
	return b.Over(l, nodes)
}

func (b Bound) under(l sluice.Limit, nodes int) int64 {
	if b.Under == nil {
		return 0
	}
	return b.Under(l, nodes)
}

// Run runs both tiers on an exact store: RunContract with the zero Bound,
// every node being one store (Shared), and RunExact.
func Run(t *testing.T, newStore NewStore) {
	t.Helper()
	t.Run("Contract", func(t *testing.T) { RunContract(t, Shared(newStore), Bound{}) })
	t.Run("Exact", func(t *testing.T) { RunExact(t, newStore) })
}

// seed returns the seed of the random scenarios, and logs it.
func seed(t *testing.T) uint64 {
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
	return seed
}

// newEnv returns the env of scenario i named name: a clock at a random
// instant of a day in 2026, and a random key prefix.
func newEnv(seed uint64, i int, name string) *env {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	c := &clock{}
	c.us.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixMicro() + rng.Int64N(int64(24*time.Hour/time.Microsecond)))
	return &env{
		clock: c,
		rng:   rng,
		// A hash tag: a scenario's keys share a Redis Cluster slot.
		prefix: fmt.Sprintf("storetest:{%016x:%s}:", rng.Uint64(), name),
		model:  model{},
	}
}

// RunExact runs the exactness tier, each scenario as a subtest with a new
// store from newStore. It requires of a store:
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
//   - A context that is already cancelled makes TakeAll (of one request
//     or more) return an error that wraps context.Canceled, and apply nothing.
//   - TakeAll with fewer decisions than requests returns an error.
func RunExact(t *testing.T, newStore NewStore) {
	t.Helper()
	seed := seed(t)
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
			e := newEnv(seed, i, sc.name)
			e.store = newStore(t, e.clock.now)
			if e.store == nil {
				t.Fatal("newStore returned nil")
			}
			sc.run(t, e)
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
	got, err := sluice.Take(context.Background(), e.store, key, l, cost)
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
		return l.Capacity() + 1
	default:
		return 1
	}
}
