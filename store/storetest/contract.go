package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// nodeCounts are the numbers of nodes the contract tier spreads a key's
// traffic over.
var nodeCounts = []int{1, 3}

// goroutinesPerNode is how many goroutines ask each node at once.
const goroutinesPerNode = 4

// RunContract runs the contract tier, each scenario as a subtest with new
// nodes from newNodes, for 1 and 3 nodes. It requires of a store, with b
// its stated bound (the zero Bound for an exact store):
//   - At one instant, cost-1 requests on one key, from several goroutines
//     spread over the nodes, admit at least the limit's capacity minus
//     b.Under and at most its capacity plus b.Over; so do sequential
//     requests of mixed costs. Keys are independent.
//   - A TakeAll with a denied request reports that request denied and
//     consumes nothing: afterwards its other keys admit what they did
//     before, within the bound; concurrent TakeAlls admit whole batches
//     only, within the bound of the batch's tightest limit.
//   - Cost 0 is allowed, reports, and consumes nothing.
//   - A key admits its capacity again, within the bound, once its limit
//     has reset.
//   - Decisions are well formed: Limit is the capacity, Remaining lies in
//     [0, capacity], an allowed request has no RetryAfter, a denied one
//     has a positive one, Never when its cost exceeds the capacity.
//   - A cancelled context makes TakeAll (of one request or more) return
//     an error wrapping context.Canceled, and consume nothing; TakeAll
//     with fewer decisions than requests returns an error.
//   - Over time, on the bucket limits: requests at instants that advance
//     at random, spread over the nodes, with the nodes' syncs (Syncer)
//     at random among them, admit in every interval of length d at most
//     capacity + rate × d / period + b.Over: what the limit's bucket
//     admits over any interval, and the bound.
func RunContract(t *testing.T, newNodes NewNodes, b Bound) {
	t.Helper()
	seed := seed(t)
	scenarios := []struct {
		name string
		run  func(t *testing.T, c *contract)
	}{
		{"Bound", testBound},
		{"Sequential", testSequential},
		{"TakeAll", testContractTakeAll},
		{"ConcurrentTakeAll", testContractConcurrentTakeAll},
		{"CostZero", testContractCostZero},
		{"Reset", testReset},
		{"Errors", testErrors},
		{"Intervals", testIntervals},
	}
	for i, sc := range scenarios {
		for _, n := range nodeCounts {
			name := fmt.Sprintf("%s/nodes=%d", sc.name, n)
			t.Run(name, func(t *testing.T) {
				e := newEnv(seed, i*len(nodeCounts)+n, name)
				nodes := newNodes(t, e.clock.now, n)
				if len(nodes) != n {
					t.Fatalf("newNodes(%d) returned %d stores", n, len(nodes))
				}
				for _, s := range nodes {
					if s == nil {
						t.Fatal("newNodes returned a nil store")
					}
				}
				e.store = nodes[0]
				sc.run(t, &contract{env: e, nodes: nodes, bound: b})
			})
		}
	}
}

// contract is what a scenario of the contract tier works with.
type contract struct {
	*env
	nodes []sluice.Store
	bound Bound
}

// node returns the node that the i-th request goes to.
func (c *contract) node(i int) sluice.Store { return c.nodes[i%len(c.nodes)] }

// within fails t unless admitted lies within the store's bound of want
// hits of l.
func (c *contract) within(t *testing.T, what string, l sluice.Limit, admitted, want int64) {
	t.Helper()
	n := len(c.nodes)
	lo, hi := want-c.bound.under(l, n), want+c.bound.over(l, n)
	if admitted < lo || admitted > hi {
		t.Fatalf("%s on %v over %d nodes: admitted %d, want %d (bound [%d, %d])", what, l, n, admitted, want, lo, hi)
	}
}

// take calls Take on node i and checks that the decision is well formed.
func (c *contract) take(t *testing.T, i int, key string, l sluice.Limit, cost int64) sluice.Decision {
	t.Helper()
	d, err := sluice.Take(context.Background(), c.node(i), key, l, cost)
	if err != nil {
		t.Fatalf("Take(%q, %v, %d) on node %d: %v", key, l, cost, i%len(c.nodes), err)
	}
	if err := wellFormed(l, cost, d); err != nil {
		t.Fatalf("Take(%q, %v, %d) on node %d: %v", key, l, cost, i%len(c.nodes), err)
	}
	return d
}

// wellFormed reports how d is not a decision a store may make on a
// request of cost hits of l.
func wellFormed(l sluice.Limit, cost int64, d sluice.Decision) error {
	capa := l.Capacity()
	switch {
	case d.Limit != capa:
		return fmt.Errorf("decision %+v: Limit %d, want the capacity %d", d, d.Limit, capa)
	case d.Remaining < 0 || d.Remaining > capa:
		return fmt.Errorf("decision %+v: Remaining outside [0, %d]", d, capa)
	case d.ResetAfter < 0 || d.Wait < 0:
		return fmt.Errorf("decision %+v: a negative duration", d)
	case d.Allowed && d.RetryAfter != 0:
		return fmt.Errorf("decision %+v: allowed with a RetryAfter", d)
	case !d.Allowed && d.RetryAfter <= 0:
		return fmt.Errorf("decision %+v: denied without a RetryAfter", d)
	case cost > capa && (d.Allowed || d.RetryAfter != sluice.Never):
		return fmt.Errorf("decision %+v: cost %d above the capacity %d, want denied with Never", d, cost, capa)
	case cost == 0 && !d.Allowed:
		return fmt.Errorf("decision %+v: cost 0 denied", d)
	}
	return nil
}

// drain sends cost-1 requests on key from goroutinesPerNode goroutines per
// node, at the clock's instant, enough to exhaust capacity plus the
// store's bound twice over, and returns how many were admitted.
func (c *contract) drain(t *testing.T, key string, l sluice.Limit) int64 {
	t.Helper()
	n := len(c.nodes)
	total := 2 * (l.Capacity() + c.bound.over(l, n) + 1)
	workers := n * goroutinesPerNode
	each := (total + int64(workers) - 1) / int64(workers)
	var admitted atomic.Int64
	run(t, workers, func(w int) error {
		s := c.nodes[w%n]
		for range each {
			d, err := sluice.Take(context.Background(), s, key, l, 1)
			if err != nil {
				return err
			}
			if err := wellFormed(l, 1, d); err != nil {
				return err
			}
			if d.Allowed {
				admitted.Add(1)
			}
		}
		return nil
	})
	return admitted.Load()
}

func testBound(t *testing.T, c *contract) {
	c.align(time.Hour)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l := limitOf(a, 40, time.Hour)
			ka, kb := c.key(a.String()+":a"), c.key(a.String()+":b")
			c.within(t, "concurrent requests at one instant", l, c.drain(t, ka, l), 40)
			c.within(t, "another key's requests", l, c.drain(t, kb, l), 40)
		})
	}
}

func testSequential(t *testing.T, c *contract) {
	c.align(time.Hour)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l := limitOf(a, 30, time.Hour)
			k := c.key(a.String())
			var admitted int64
			i := 0
			// Mixed costs, including ones above the capacity, then cost 1
			// until the key is surely exhausted.
			for ; i < 40; i++ {
				cost := c.cost(l)
				if c.take(t, i, k, l, cost).Allowed {
					admitted += cost
				}
			}
			for range 2 * (l.Capacity() + c.bound.over(l, len(c.nodes)) + 1) {
				if c.take(t, i, k, l, 1).Allowed {
					admitted++
				}
				i++
			}
			c.within(t, "sequential requests of mixed costs at one instant", l, admitted, 30)
		})
	}
}

func testContractTakeAll(t *testing.T, c *contract) {
	c.align(time.Hour)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			free, full, other := c.key(a.String()+":free"), c.key(a.String()+":full"), c.key(a.String()+":other")
			lf := limitOf(a, 20, time.Hour)
			ls := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Hour}
			for i := range 3 {
				if !c.take(t, i, free, lf, 1).Allowed {
					t.Fatalf("the first 3 hits of %v denied", lf)
				}
			}
			c.within(t, "a key of one hit", ls, c.drain(t, full, ls), 1)
			reqs := []sluice.Request{{Key: free, Limit: lf, Cost: 2}, {Key: full, Limit: ls, Cost: 1}}
			ds := make([]sluice.Decision, 2)
			for i := range c.nodes {
				if err := c.node(i).TakeAll(context.Background(), reqs, ds); err != nil {
					t.Fatalf("TakeAll on node %d: %v", i, err)
				}
				for j, d := range ds {
					if err := wellFormed(reqs[j].Limit, reqs[j].Cost, d); err != nil {
						t.Fatalf("TakeAll on node %d, request %d: %v", i, j, err)
					}
				}
				if ds[1].Allowed {
					t.Fatalf("TakeAll on node %d: %+v, want the exhausted key denied", i, ds)
				}
			}
			c.within(t, "a key after denied batches", lf, c.drain(t, free, lf), 17)
			// An allowed batch consumes from every key.
			reqs = []sluice.Request{{Key: other, Limit: lf, Cost: 2}, {Key: other, Limit: lf, Cost: 3}}
			if err := c.node(0).TakeAll(context.Background(), reqs, ds); err != nil {
				t.Fatalf("TakeAll: %v", err)
			}
			if !ds[0].Allowed || !ds[1].Allowed {
				t.Fatalf("TakeAll of 5 hits on a fresh key of 20: %+v", ds)
			}
			c.within(t, "a key after an allowed batch", lf, c.drain(t, other, lf), 15)
		})
	}
}

func testContractConcurrentTakeAll(t *testing.T, c *contract) {
	c.align(time.Hour)
	ka, kb := c.key("batch:a"), c.key("batch:b")
	la, lb := limitOf(sluice.FixedWindow, 40, time.Hour), limitOf(sluice.GCRA, 25, time.Hour)
	reqs := []sluice.Request{{Key: ka, Limit: la, Cost: 1}, {Key: kb, Limit: lb, Cost: 1}}
	n := len(c.nodes)
	each := 2 * (25 + c.bound.over(lb, n) + 1) / int64(goroutinesPerNode*n)
	var admitted atomic.Int64
	run(t, goroutinesPerNode*n, func(w int) error {
		ds := make([]sluice.Decision, 2)
		for range each + 1 {
			if err := c.nodes[w%n].TakeAll(context.Background(), reqs, ds); err != nil {
				return err
			}
			if ds[0].Allowed && ds[1].Allowed {
				admitted.Add(1)
			}
		}
		return nil
	})
	got := admitted.Load()
	c.within(t, "concurrent batches", lb, got, 25)
	// Denied batches consumed nothing of the looser limit.
	c.within(t, "the looser key after the batches", la, c.drain(t, ka, la), 40-got)
}

func testContractCostZero(t *testing.T, c *contract) {
	c.align(time.Hour)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			k := c.key(a.String())
			l := limitOf(a, 20, time.Hour)
			for i := range 10 {
				c.take(t, i, k, l, 0)
			}
			c.take(t, 0, k, l, 4)
			for i := range 10 {
				if d := c.take(t, i, k, l, 0); d.Remaining > 16+c.bound.over(l, len(c.nodes)) {
					t.Fatalf("cost 0 after 4 hits of 20 reports %d remaining", d.Remaining)
				}
			}
			c.within(t, "a key after reports", l, c.drain(t, k, l), 16)
		})
	}
}

func testReset(t *testing.T, c *contract) {
	c.align(time.Hour)
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			k := c.key(a.String())
			l := limitOf(a, 20, time.Minute)
			c.within(t, "a fresh key", l, c.drain(t, k, l), 20)
			// The time the limit takes to be whole after its capacity was
			// taken at once.
			var s sluice.State
			now := c.clock.us.Load()
			reset := l.TakeMicros(&s, now, l.Capacity()).ResetAfter
			c.clock.us.Add(reset.Microseconds() + 1)
			c.within(t, "a key whose limit has reset", l, c.drain(t, k, l), 20)
		})
	}
}

func testErrors(t *testing.T, c *contract) {
	c.align(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			k := c.key(a.String())
			l := limitOf(a, 10, time.Hour)
			c.take(t, 0, k, l, 1) // a key known to every layer of the store
			for i, s := range c.nodes {
				if _, err := sluice.Take(ctx, s, k, l, 1); !errors.Is(err, context.Canceled) {
					t.Fatalf("Take on node %d with a cancelled context: error %v, want one wrapping context.Canceled", i, err)
				}
				ds := make([]sluice.Decision, 1)
				if err := s.TakeAll(ctx, []sluice.Request{{Key: k, Limit: l, Cost: 2}}, ds); !errors.Is(err, context.Canceled) {
					t.Fatalf("TakeAll on node %d with a cancelled context: error %v, want one wrapping context.Canceled", i, err)
				}
				reqs := []sluice.Request{{Key: k, Limit: l, Cost: 1}, {Key: c.key(a.String() + ":b"), Limit: l, Cost: 1}}
				if err := s.TakeAll(context.Background(), reqs, ds); err == nil {
					t.Fatalf("TakeAll on node %d with 1 decision for 2 requests: no error", i)
				}
			}
			c.within(t, "a key after failed calls", l, c.drain(t, k, l), 9)
		})
	}
}

// Syncer is an optional interface of a node that reconciles with what it
// shares with other nodes on demand, besides on its own schedule
// (store/localfirst's Store in async mode): the contract tier's interval
// scenario calls it at random among its requests.
type Syncer interface {
	SyncAsync(ctx context.Context) error
}

// admission is a request a scenario saw admitted: at µs, cost hits.
type admission struct{ at, cost int64 }

// testIntervals sends requests of 1 to 3 hits on one key of each bucket
// limit, from random nodes, at instants that advance at random, a few at
// each, sometimes a burst of dozens, several times what the limit admits,
// with the nodes' syncs at random among them (Syncer), and checks every interval between two
// admissions against the bound: no more than capacity + rate × d /
// period + b.Over hits in an interval of length d. The sum of two
// admissions' costs is checked so for every pair: O(admissions²).
func testIntervals(t *testing.T, c *contract) {
	c.align(time.Hour)
	for _, a := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			l := limitOf(a, 30, time.Minute) // 15 a minute, bursts of 30
			k := c.key(a.String())
			p := l.Period.Microseconds()
			var seen []admission
			var offered int64
			start := c.clock.us.Load()
			// syncOne syncs a random node, if it is a Syncer, at step i
			// (named in a failure).
			syncOne := func(i int) {
				if sy, ok := c.node(c.rng.IntN(len(c.nodes))).(Syncer); ok {
					if err := sy.SyncAsync(context.Background()); err != nil {
						t.Fatalf("request %d: SyncAsync: %v", i, err)
					}
				}
			}
			for i := range 700 {
				c.clock.us.Add(c.rng.Int64N(2*p/l.Rate + 1))
				n := 1 + c.rng.IntN(3)
				if c.rng.IntN(10) == 0 { // a burst at one instant, syncs among it
					n = 10 + c.rng.IntN(30)
				}
				for r := range n {
					if r > 0 && c.rng.IntN(4) == 0 {
						syncOne(i)
					}
					cost := 1 + c.rng.Int64N(3)
					if cost == 3 && c.rng.IntN(2) == 0 {
						cost = 1
					}
					offered += cost
					if c.take(t, c.rng.IntN(len(c.nodes)), k, l, cost).Allowed {
						seen = append(seen, admission{c.clock.us.Load(), cost})
					}
				}
				if c.rng.IntN(4) == 0 {
					syncOne(i)
				}
			}
			span := c.clock.us.Load() - start
			capa, over := l.Capacity(), c.bound.over(l, len(c.nodes))
			var admitted, worst int64 // worst: the most hits past rate × d / period in an interval
			for i := range seen {
				sum := int64(0)
				for j := i; j < len(seen); j++ {
					sum += seen[j].cost
					d := seen[j].at - seen[i].at
					if sum*p > (capa+over)*p+l.Rate*d {
						t.Fatalf("%v over %d nodes: %d hits admitted in the %v from %d to %d µs, more than capacity %d + rate × d / period %.2f + bound %d",
							l, len(c.nodes), sum, time.Duration(d)*time.Microsecond, seen[i].at, seen[j].at, capa, float64(l.Rate*d)/float64(p), over)
					}
					worst = max(worst, sum-l.Rate*d/p)
				}
				admitted += seen[i].cost
			}
			t.Logf("%v over %d nodes: %d of %d hits offered admitted in %v; at most capacity + %d in an interval (bound %d + %d)",
				l, len(c.nodes), admitted, offered, time.Duration(span)*time.Microsecond, worst-capa, capa, over)
			if refill := l.Rate * span / p; admitted < refill/2 {
				t.Fatalf("%v: admitted %d of %d offered, less than half of the %d refilled: the scenario does not test the bound", l, admitted, offered, refill)
			}
		})
	}
}
