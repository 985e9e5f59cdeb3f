package sluice

import "time"

// leakyBucket is a queue of capacity hits that drains at rate hits per
// period; a request joins when its cost fits and is denied when the queue is
// full. An admitted request's Decision.Wait says how long the water ahead of
// it takes to drain, so a caller can delay it that long instead of letting
// it through at once (traffic shaping): delayed so, requests leave at no
// more than the rate.
func leakyBucket(rate, period, capacity int64, s *State, now, cost int64) Decision {
	allowed, retry, ahead := bucket(rate, period, capacity, s, now, cost)
	var wait time.Duration
	if allowed && ahead > 0 {
		wait = micros(ceilDiv(ahead, rate))
	}
	return Decision{Allowed: allowed, Limit: capacity, Remaining: max((capacity*period-s.n)/period, 0), ResetAfter: micros(ceilDiv(s.n, rate)), RetryAfter: retry, Wait: wait}
}
