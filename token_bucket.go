package sluice

import "time"

// tokenBucket is a bucket of capacity tokens, refilled continuously at rate
// tokens per period; a request takes cost tokens and passes when the bucket
// holds them. A full bucket lets a client burst capacity hits at once, then
// sustain the rate: never more than capacity + rate × elapsed / period over
// any interval.
//
// The arithmetic is exact: the state counts the tokens taken out, scaled by
// the period, in hit·µs, so a refill of elapsed µs is elapsed × rate with
// nothing rounded.
func tokenBucket(rate, period, capacity int64, s *State, now, cost int64) Decision {
	return bucket(rate, period, capacity, s, now, cost, false)
}

// bucket is the transition shared by token_bucket and leaky_bucket, which
// are one algorithm seen from two sides: tokens left in a bucket, or water
// queued in one. With queue, an admitted request's Wait is how long the
// water ahead of it takes to drain.
//
// State: t is the time of the last update, n the level (tokens taken, water
// queued) in hit·µs, at most capacity × period.
func bucket(rate, period, capacity int64, s *State, now, cost int64, queue bool) Decision {
	level := s.n
	if now > s.t { // a clock that went back drains nothing
		level = drain(level, now-s.t, rate)
		s.t = now
	}
	full := capacity * period
	allowed := false
	var retry, wait time.Duration
	switch {
	case cost > capacity:
		retry = Never
	case level+cost*period <= full:
		allowed = true
		if queue && level > 0 {
			wait = micros(ceilDiv(level, rate))
		}
		level += cost * period
	default:
		retry = micros(ceilDiv(level+cost*period-full, rate))
	}
	s.n = level
	return Decision{Allowed: allowed, Limit: capacity, Remaining: max((full-level)/period, 0), ResetAfter: micros(ceilDiv(level, rate)), RetryAfter: retry, Wait: wait}
}
