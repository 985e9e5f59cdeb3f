package sluice

import "time"

// fixedWindow counts hits in windows of period µs aligned to multiples of
// the period since the Unix epoch, as Envoy's ratelimit service does, and
// admits rate hits per window. A client may send rate hits at the end of one
// window and rate more at the start of the next: up to twice the rate
// within one period across a boundary.
//
// State: t is the window start, n the hits admitted in it.
func fixedWindow(rate, period int64, s *State, now, cost int64) Decision {
	ws := windowStart(now, period, s.t)
	if ws < s.t { // the clock went back: stay in the window we know
		ws = s.t
	}
	if ws != s.t {
		s.t, s.n = ws, 0
	}
	// The decision is built once, from locals, at the return: cheaper than
	// setting the fields of a Decision one by one.
	n, end := s.n, ws+period
	allowed := cost <= rate-n
	var retry, reset time.Duration
	switch {
	case allowed:
		n += cost
		s.n = n
	case cost > rate:
		retry = Never
	default:
		retry = micros(end - now)
	}
	if n > 0 {
		reset = micros(end - now)
	}
	return Decision{Allowed: allowed, Limit: rate, Remaining: max(rate-n, 0), ResetAfter: reset, RetryAfter: retry}
}
