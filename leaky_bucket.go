package sluice

// leakyBucket is a queue of capacity hits that drains at rate hits per
// period; a request joins when its cost fits and is denied when the queue is
// full. An admitted request's Decision.Wait says how long the water ahead of
// it takes to drain, so a caller can delay it that long instead of letting
// it through at once (traffic shaping): delayed so, requests leave at no
// more than the rate.
func leakyBucket(rate, period, capacity int64, s *State, now, cost int64) Decision {
	return bucket(rate, period, capacity, s, now, cost, true)
}
