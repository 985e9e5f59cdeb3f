package sluice

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
	d := Decision{Limit: rate}
	end := ws + period
	if cost <= rate-s.n {
		s.n += cost
		d.Allowed = true
	} else if cost > rate {
		d.RetryAfter = Never
	} else {
		d.RetryAfter = micros(end - now)
	}
	d.Remaining = max(rate-s.n, 0)
	if s.n > 0 {
		d.ResetAfter = micros(end - now)
	}
	return d
}
