package regions

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// sim runs random interleavings on a world: requests, the two halves of
// rounds (a round's home read, then, any time later, its peers' reads),
// links cut and healed one way or both, nodes that stop for a while, and
// the clock moving in random steps. It records every admitted hit.
type sim struct {
	w       *world
	rng     *rand.Rand
	l       sluice.Limit
	pending [][]*pending
	hits    []hit
	minR    map[int64][]int64 // window → per region, the fewest regions a round of it counted
	k       int64
}

type hit struct {
	at     time.Time
	region int
	cost   int64
}

func newSim(t *testing.T, seed uint64, l sluice.Limit, regions, nodes int, k int64) *sim {
	w := newWorld(t, regions, nodes, func(c *Config) { c.Share = k })
	sm := &sim{w: w, k: k, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), l: l, minR: make(map[int64][]int64)}
	sm.pending = make([][]*pending, regions)
	for a := range sm.pending {
		sm.pending[a] = make([]*pending, nodes)
	}
	return sm
}

// step takes one random action.
func (sm *sim) step() {
	w, rng := sm.w, sm.rng
	a, n := rng.IntN(len(w.nodes)), rng.IntN(len(w.nodes[0]))
	s := w.nodes[a][n]
	switch x := rng.IntN(100); {
	case x < 55:
		cost := int64(1 + rng.IntN(3))
		if w.take(a, n, "k", sm.l, cost).Allowed {
			sm.hits = append(sm.hits, hit{w.clock.Now(), a, cost})
		}
	case x < 75 && sm.pending[a][n] == nil:
		s.roundMu.Lock()
		p, err := s.begin(context.Background())
		if err != nil {
			s.roundMu.Unlock()
			w.t.Fatal(err)
		}
		sm.pending[a][n] = p
	case x < 95 && sm.pending[a][n] != nil:
		if err := s.finish(context.Background(), sm.pending[a][n]); err != nil {
			w.t.Fatal(err)
		}
		sm.pending[a][n] = nil
		s.roundMu.Unlock()
		sm.noteRegions(a, s)
	case x < 98:
		b := rng.IntN(len(w.nodes))
		if b != a {
			l := w.links[a][b]
			l.cut.Store(!l.cut.Load())
		}
	default:
		w.clock.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
	}
	w.clock.Advance(time.Duration(rng.IntN(2000)) * time.Microsecond)
}

// noteRegions keeps the fewest regions a round of region a counted in the
// current window: what its caps divided by.
func (sm *sim) noteRegions(a int, s *Store) {
	l := sm.l
	if c, bucket := counted(sluice.Request{Limit: l}); bucket {
		l = c.Limit
	}
	win := windowStart(sm.w.clock.Now().UnixMicro(), l.Period.Microseconds())
	rs, ok := sm.minR[win]
	if !ok {
		rs = make([]int64, len(sm.w.nodes))
		for i := range rs {
			rs[i] = int64(len(sm.w.nodes))
		}
		sm.minR[win] = rs
	}
	rs[a] = min(rs[a], s.regions.Load())
}

// finishAll ends the rounds in flight.
func (sm *sim) finishAll() {
	for a, ps := range sm.pending {
		for n, p := range ps {
			if p != nil {
				s := sm.w.nodes[a][n]
				if err := s.finish(context.Background(), p); err != nil {
					sm.w.t.Fatal(err)
				}
				s.roundMu.Unlock()
				sm.pending[a][n] = nil
			}
		}
	}
}

// checkFixed checks that every window admitted within the bound, with
// each region's share divided by the fewest regions it counted then (a
// region seen dead takes no share, so the others' grow).
func (sm *sim) checkFixed(t *testing.T) (worst float64) {
	l := sm.l
	if c, bucket := counted(sluice.Request{Limit: l}); bucket {
		l = c.Limit // the count that makes a bucket global
	}
	p := l.Period.Microseconds()
	per := make(map[int64]int64)
	for _, h := range sm.hits {
		per[windowStart(h.at.UnixMicro(), p)] += h.cost
	}
	for win, got := range per {
		b := l.Rate - 1
		for a := range sm.w.nodes {
			r := int64(len(sm.w.nodes))
			if rs, ok := sm.minR[win]; ok {
				r = min(r, rs[a])
			}
			b += share(l.Rate, r, sm.k)
		}
		if got > b {
			t.Errorf("window %v admitted %d, more than the bound %d", time.UnixMicro(win).UTC(), got, b)
		}
		worst = max(worst, float64(got)/float64(l.Rate))
	}
	return worst
}

// TestSimulationFixedWindow runs random interleavings of requests, rounds
// split between their home and peer reads, cuts and pauses: no window
// admits more than the bound.
func TestSimulationFixedWindow(t *testing.T) {
	seeds := 12
	if testing.Short() {
		seeds = 4
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rate := int64(20 + seed*37%500)
			k := []int64{2, 10, 100}[seed%3]
			sm := newSim(t, seed, sluice.Limit{Rate: rate, Period: 5 * time.Second}, 3, 2, k)
			for range 8000 {
				sm.step()
			}
			sm.finishAll()
			t.Logf("rate %d, k %d: worst window %.3f of the limit", rate, k, sm.checkFixed(t))
		})
	}
}

// TestSimulationBuckets runs TestSimulationFixedWindow's interleavings on
// token_bucket and gcra limits: no window of their count admits more
// than the bound.
func TestSimulationBuckets(t *testing.T) {
	seeds := 6
	if testing.Short() {
		seeds = 2
	}
	for seed := range uint64(seeds) {
		alg := []sluice.Algorithm{sluice.TokenBucket, sluice.GCRA}[seed%2]
		t.Run(fmt.Sprint(alg, seed), func(t *testing.T) {
			t.Parallel()
			rate := int64(20 + seed*41%300)
			k := []int64{2, 10, 100}[seed%3]
			l := sluice.Limit{Algorithm: alg, Rate: rate, Period: 5 * time.Second, Burst: rate / 2}
			sm := newSim(t, seed, l, 3, 2, k)
			for range 8000 {
				sm.step()
			}
			sm.finishAll()
			t.Logf("rate %d, k %d: worst window %.3f of the capacity", rate, k, sm.checkFixed(t))
		})
	}
}
