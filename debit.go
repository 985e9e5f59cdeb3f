package sluice

import (
	"math/bits"
	"time"
)

// Bucket is the arithmetic of a bucket limit (token_bucket, leaky_bucket,
// gcra) in the units its state counts in: a hit adds Hit units to the
// bucket's level, the bucket holds Full = capacity × Hit, and its level
// drains by Drain units a µs down to 0. For token_bucket and leaky_bucket
// a unit is a hit·µs (Hit is the period in µs, Drain the rate); for gcra a
// µs of the theoretical arrival time ahead of now (Hit is the emission
// interval ⌈period/rate⌉, Drain 1). A request of cost hits passes when
// level + cost × Hit <= Full.
//
// A level above Full is a debt: hits admitted elsewhere and written back
// later (Limit.Debit), which drain, as any level does, before a request
// passes again.
type Bucket struct {
	Hit, Full, Drain int64
}

// maxLevel is where a level saturates: a debt this deep (2^62 units, more
// than 146,000 years of draining at a unit a µs) is beyond any use, and
// saturating keeps the arithmetic in int64.
const maxLevel = 1 << 62

// Bucket returns l's bucket arithmetic, and false for a window algorithm
// or an invalid limit.
func (l Limit) Bucket() (Bucket, bool) {
	p := int64(l.Period / time.Microsecond)
	if l.Rate <= 0 || p <= 0 || l.Burst < 0 {
		return Bucket{}, false
	}
	c := l.Capacity()
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		return Bucket{Hit: p, Full: c * p, Drain: l.Rate}, true
	case GCRA:
		T := ceilDiv(p, l.Rate)
		return Bucket{Hit: T, Full: c * T, Drain: 1}, true
	}
	return Bucket{}, false
}

// Drained returns level after elapsed µs of draining: never below 0, and
// level itself for elapsed <= 0 (a clock that went back drains nothing).
func (b Bucket) Drained(level, elapsed int64) int64 {
	return drain(level, elapsed, b.Drain)
}

// drain returns level after elapsed µs at rate units a µs, at least 0.
func drain(level, elapsed, rate int64) int64 {
	if elapsed <= 0 {
		return level
	}
	if hi, drained := bits.Mul64(uint64(elapsed), uint64(rate)); hi != 0 || drained >= uint64(level) {
		return 0
	}
	return level - elapsed*rate
}

// Level returns the level of s, a state of the bucket limit l, at now (µs
// since the Unix epoch), in the units of l.Bucket, a debt included; 0 for
// a window limit.
func (l Limit) Level(s State, now int64) int64 {
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		if l.Rate <= 0 {
			return 0
		}
		return drain(s.n, now-s.t, l.Rate)
	case GCRA:
		// gcra takes a clock that went back to be at the latest admission.
		return max(s.t-max(now, s.n), 0)
	}
	return 0
}

// BucketState returns the state of the bucket limit l whose level at now
// is level (units of l.Bucket): the state Level reads level from, and on
// which Take decides as on any state of that level. For a window limit,
// the zero State.
func (l Limit) BucketState(level, now int64) State {
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		return State{t: now, n: max(level, 0)}
	case GCRA:
		return State{t: now + max(level, 0), n: now}
	}
	return State{}
}

// Debit adds cost hits of the bucket limit l to s at now (µs since the
// Unix epoch) whether or not they fit: hits admitted elsewhere and written
// back (store/localfirst's async mode). The level may pass the capacity: a
// debt, which drains at the limit's rate before any request passes again;
// nothing is lost, but past 2^62 units the level saturates. It returns
// false, changing nothing, for a window limit, an invalid one or a
// negative cost.
func (l Limit) Debit(s *State, now, cost int64) bool {
	b, ok := l.Bucket()
	if !ok || cost < 0 {
		return false
	}
	add := func(level int64) int64 {
		if cost > (maxLevel-max(level, 0))/b.Hit {
			return maxLevel
		}
		return level + cost*b.Hit
	}
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		level := drain(s.n, now-s.t, l.Rate)
		s.t = max(s.t, now)
		s.n = add(level)
	case GCRA:
		now = max(now, s.n)
		s.t = now + add(max(s.t-now, 0))
		s.n = now
	}
	return true
}
