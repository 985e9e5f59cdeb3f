package sluice

import "time"

// gcra is the generic cell rate algorithm: one timestamp per key, the
// theoretical arrival time (TAT) at which the key would be idle again. Each
// hit moves it one emission interval T = period / rate later; a request
// passes when the new TAT is at most capacity × T ahead of now. It decides
// as a token bucket of the same rate and capacity does, in one number.
//
// T is rounded up to whole microseconds, so a rate that does not divide the
// period is enforced a little below its nominal value, never above it.
//
// State: t is the TAT, n the time of the latest admitted request: a clock
// that goes back is taken to be at n, so that hits are never spent in a
// past that has since refilled the bucket. (Only admissions move n, so that
// a denied request leaves the state as it was, as every store expects.)
func gcra(rate, period, capacity int64, s *State, now, cost int64) Decision {
	if now < s.n {
		now = s.n
	}
	T := ceilDiv(period, rate)
	tolerance := capacity * T
	tat := max(s.t, now)
	allowed := false
	var retry time.Duration
	if cost > capacity {
		retry = Never
	} else if next := tat + cost*T; next-now <= tolerance {
		tat, s.t, s.n = next, next, now
		allowed = true
	} else {
		retry = micros(next - now - tolerance)
	}
	return Decision{Allowed: allowed, Limit: capacity, Remaining: max((tolerance-(tat-now))/T, 0), ResetAfter: micros(tat - now), RetryAfter: retry}
}
