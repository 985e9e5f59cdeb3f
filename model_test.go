package sluice_test

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// A model is an obviously correct, slow reference for one algorithm: it
// keeps the whole history, or exact rationals, and answers whether a
// request of some cost would pass at a time.
type model interface {
	allows(t, cost int64) bool
	admit(t, cost int64)
	clone() model
}

type admitted struct{ t, n int64 }

// history is the list of admitted requests, for the window models.
type history []admitted

func (h history) sum(from, to int64) int64 { // hits in [from, to)
	var n int64
	for _, a := range h {
		if a.t >= from && a.t < to {
			n += a.n
		}
	}
	return n
}

func floorTo(t, p int64) int64 {
	m := t % p
	if m < 0 {
		m += p
	}
	return t - m
}

type fixedModel struct {
	rate, p int64
	h       history
}

func (m *fixedModel) allows(t, c int64) bool {
	ws := floorTo(t, m.p)
	return m.h.sum(ws, ws+m.p)+c <= m.rate
}
func (m *fixedModel) admit(t, c int64) { m.h = append(m.h, admitted{t, c}) }
func (m *fixedModel) clone() model {
	c := *m
	c.h = append(history(nil), m.h...)
	return &c
}

type slidingModel struct {
	rate, g, subs int64 // g: a sub-window, the period over subs
	h             history
}

// allows is the estimate oldest × (g − e)/g + the hits of the subs
// sub-windows since + cost <= rate, in exact integers multiplied through by
// g, where oldest is the hits of the sub-window that began subs × g before
// the current one.
func (m *slidingModel) allows(t, c int64) bool {
	ws := floorTo(t, m.g)
	oldest := ws - m.subs*m.g
	prev := big.NewInt(m.h.sum(oldest, oldest+m.g))
	cur := m.h.sum(oldest+m.g, ws+m.g)
	lhs := new(big.Int).Mul(prev, big.NewInt(m.g-(t-ws)))
	lhs.Add(lhs, new(big.Int).Mul(big.NewInt(cur+c), big.NewInt(m.g)))
	rhs := new(big.Int).Mul(big.NewInt(m.rate), big.NewInt(m.g))
	return lhs.Cmp(rhs) <= 0
}
func (m *slidingModel) admit(t, c int64) { m.h = append(m.h, admitted{t, c}) }
func (m *slidingModel) clone() model {
	c := *m
	c.h = append(history(nil), m.h...)
	return &c
}

type logModel struct {
	rate, p int64
	h       history
}

func (m *logModel) allows(t, c int64) bool { return m.h.sum(t-m.p+1, t+1)+c <= m.rate }
func (m *logModel) admit(t, c int64)       { m.h = append(m.h, admitted{t, c}) }
func (m *logModel) clone() model {
	c := *m
	c.h = append(history(nil), m.h...)
	return &c
}

// bucketModel is a bucket of exact rational tokens: full at capacity,
// refilled at rate per p µs. It models token_bucket, leaky_bucket (tokens =
// capacity − water) and gcra (with rate 1 per emission interval).
type bucketModel struct {
	rate, p, capacity int64
	last              int64
	tokens            *big.Rat
}

func newBucketModel(rate, p, capacity int64) *bucketModel {
	return &bucketModel{rate: rate, p: p, capacity: capacity, last: -1 << 62, tokens: big.NewRat(capacity, 1)}
}

func (m *bucketModel) at(t int64) *big.Rat {
	refill := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(t-m.last), big.NewInt(m.rate)), big.NewInt(m.p))
	tok := new(big.Rat).Add(m.tokens, refill)
	if full := big.NewRat(m.capacity, 1); tok.Cmp(full) > 0 {
		tok = full
	}
	return tok
}
func (m *bucketModel) allows(t, c int64) bool { return m.at(t).Cmp(big.NewRat(c, 1)) >= 0 }
func (m *bucketModel) admit(t, c int64) {
	m.tokens = new(big.Rat).Sub(m.at(t), big.NewRat(c, 1))
	m.last = t
}
func (m *bucketModel) clone() model {
	c := *m
	c.tokens = new(big.Rat).Set(m.tokens)
	return &c
}

// water returns the level of the leaky bucket at t, in hits.
func (m *bucketModel) water(t int64) *big.Rat {
	return new(big.Rat).Sub(big.NewRat(m.capacity, 1), m.at(t))
}

func newModel(l sluice.Limit) model {
	p := l.Period.Microseconds()
	capacity := l.Capacity()
	switch l.Algorithm {
	case sluice.FixedWindow:
		return &fixedModel{rate: l.Rate, p: p}
	case sluice.SlidingWindow:
		return &slidingModel{rate: l.Rate, g: p / l.SubWindows(), subs: l.SubWindows()}
	case sluice.SlidingLog:
		return &logModel{rate: l.Rate, p: p}
	case sluice.TokenBucket, sluice.LeakyBucket:
		return newBucketModel(l.Rate, p, capacity)
	case sluice.GCRA:
		T := (p + l.Rate - 1) / l.Rate
		return newBucketModel(1, T, capacity)
	}
	panic("no model for " + l.Algorithm.String())
}

// firstPass returns the earliest time t >= from at which m allows cost,
// searching up to limit; passing is monotone in time for every algorithm
// when no other request comes.
func firstPass(m model, from, limit, cost int64) (int64, bool) {
	if !m.allows(limit, cost) {
		return 0, false
	}
	lo, hi := from, limit
	for lo < hi {
		mid := lo + (hi-lo)/2
		if m.allows(mid, cost) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, true
}

// expect derives the decision the model makes on a request of cost at t,
// and applies it to the model.
func expect(l sluice.Limit, m model, t, cost int64) sluice.Decision {
	p := l.Period.Microseconds()
	capacity := l.Capacity()
	horizon := t + 2*p + (capacity+1)*(p/l.Rate+1)*2
	d := sluice.Decision{Limit: capacity}
	var before *big.Rat
	if bm, ok := m.(*bucketModel); ok && l.Algorithm == sluice.LeakyBucket {
		before = bm.water(t)
	}
	if m.allows(t, cost) {
		d.Allowed = true
		m.admit(t, cost)
		if before != nil {
			w := new(big.Rat).Mul(before, big.NewRat(p, l.Rate))
			d.Wait = time.Duration(ceilRat(w)) * time.Microsecond
		}
	} else if cost > capacity {
		d.RetryAfter = sluice.Never
	} else {
		at, ok := firstPass(m, t, horizon, cost)
		if !ok {
			panic("model never passes")
		}
		d.RetryAfter = time.Duration(at-t) * time.Microsecond
	}
	for d.Remaining < capacity && m.allows(t, d.Remaining+1) {
		d.Remaining++
	}
	if at, ok := firstPass(m, t, horizon, capacity); ok {
		d.ResetAfter = time.Duration(at-t) * time.Microsecond
	}
	return d
}

func ceilRat(r *big.Rat) int64 {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// t0 is a fixed instant the tests start from, on a minute boundary.
var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func TestAlgorithmsMatchReferenceModels(t *testing.T) {
	t.Parallel()
	limits := []sluice.Limit{
		{Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Second},
		{Algorithm: sluice.FixedWindow, Rate: 7, Period: 300 * time.Millisecond},
		{Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Second},
		{Algorithm: sluice.SlidingWindow, Rate: 100, Period: time.Minute},
		{Algorithm: sluice.SlidingWindow, Rate: 3, Period: 7 * time.Millisecond},
		{Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Second, Precision: 2},
		{Algorithm: sluice.SlidingWindow, Rate: 100, Period: time.Minute, Precision: 10},
		{Algorithm: sluice.SlidingWindow, Rate: 7, Period: 7 * time.Millisecond, Precision: 7},
		{Algorithm: sluice.SlidingWindow, Rate: 30, Period: time.Second, Precision: 50},
		{Algorithm: sluice.SlidingWindow, Rate: 60, Period: time.Minute, Precision: 60},
		{Algorithm: sluice.SlidingLog, Rate: 10, Period: time.Second},
		{Algorithm: sluice.SlidingLog, Rate: 5, Period: 13 * time.Millisecond},
		{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Second},
		{Algorithm: sluice.TokenBucket, Rate: 30, Period: time.Second, Burst: 100},
		{Algorithm: sluice.TokenBucket, Rate: 3, Period: time.Second, Burst: 2},
		{Algorithm: sluice.LeakyBucket, Rate: 10, Period: time.Second},
		{Algorithm: sluice.LeakyBucket, Rate: 7, Period: time.Second, Burst: 20},
		{Algorithm: sluice.GCRA, Rate: 10, Period: time.Second},
		{Algorithm: sluice.GCRA, Rate: 3, Period: time.Second, Burst: 5},
		{Algorithm: sluice.GCRA, Rate: 30, Period: time.Second, Burst: 100},
	}
	for _, l := range limits {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			m := newModel(l)
			var s sluice.State
			p := l.Period.Microseconds()
			now := t0.UnixMicro() + rng.Int64N(p)
			capacity := l.Capacity()
			for i := range 400 {
				now += arrival(rng, p, l.Rate)
				cost := rng.Int64N(capacity/3+2) + 0
				if rng.IntN(20) == 0 {
					cost = capacity + 1
				}
				got := l.TakeMicros(&s, now, cost)
				want := expect(l, m, now, cost)
				if got != want {
					t.Fatalf("request %d at +%dµs cost %d:\n got %+v\nwant %+v", i, now-t0.UnixMicro(), cost, got, want)
				}
			}
		})
	}
}

// arrival returns a random gap before the next request: often none, often
// a fraction of the emission interval, sometimes a long quiet spell.
func arrival(rng *rand.Rand, p, rate int64) int64 {
	switch rng.IntN(10) {
	case 0:
		return 0
	case 1:
		return rng.Int64N(3 * p)
	case 2:
		return 1
	default:
		return rng.Int64N(2*p/rate + 2)
	}
}
