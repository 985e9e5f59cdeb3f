package sluice

import (
	"math/bits"
	"time"
)

// slidingWindow is the sliding window counter: it keeps the hit counts of
// the current and the previous epoch-aligned window and estimates the hits
// of the last period as
//
//	previous × (period − elapsed) / period + current
//
// where elapsed is the time into the current window. A request passes when
// the estimate plus its cost stays within the rate. With a limit of 100 a
// minute, 88 hits in the previous window and 12 in the current one, 15 s in:
// 88 × 45/60 + 12 = 78, so the next request passes. The weighted previous
// count is rounded up, so the estimate never undercounts.
//
// State: t is the current window's start, n its count, p the previous
// window's count.
func slidingWindow(rate, period int64, s *State, now, cost int64) Decision {
	ws := windowStart(now, period, s.t)
	if ws < s.t { // the clock went back: stay in the window we know
		ws, now = s.t, s.t
	}
	switch {
	case ws == s.t:
	case ws == s.t+period:
		s.t, s.p, s.n = ws, s.n, 0
	default:
		s.t, s.p, s.n = ws, 0, 0
	}
	elapsed := now - ws
	weighted := weigh(s.p, period-elapsed, period)
	free := rate - s.n - weighted
	allowed := cost <= free
	var retry, reset time.Duration
	switch {
	case allowed:
		s.n += cost
		free -= cost
	case cost > rate:
		retry = Never
	default:
		retry = micros(slidingRetry(rate, period, s.p, s.n, elapsed, cost))
	}
	switch {
	case s.n > 0:
		reset = micros(ws + 2*period - now)
	case s.p > 0:
		reset = micros(ws + period - now)
	}
	return Decision{Allowed: allowed, Limit: rate, Remaining: max(free, 0), ResetAfter: reset, RetryAfter: retry}
}

// weigh returns ⌈count × left / period⌉ for 0 <= left <= period, without
// overflow.
func weigh(count, left, period int64) int64 {
	if count <= 0 || left <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(count), uint64(left))
	var q, r uint64
	if hi == 0 { // the common case, and a plain division is cheaper
		q, r = lo/uint64(period), lo%uint64(period)
	} else {
		q, r = bits.Div64(hi, lo, uint64(period)) // q <= count: no overflow
	}
	if r != 0 {
		q++
	}
	return int64(q)
}

// slidingRetry returns how many µs after elapsed (into the current window)
// a request of cost, cost <= rate, first passes, given the previous and
// current counts.
func slidingRetry(rate, period, prev, cur, elapsed, cost int64) int64 {
	if k := rate - cur - cost; k >= 0 {
		// Within this window once ⌈prev × (period − e) / period⌉ <= k.
		return period - leftFor(prev, k, period) - elapsed
	}
	// In the next window cur becomes the previous count.
	return 2*period - leftFor(cur, rate-cost, period) - elapsed
}

// leftFor returns the largest x <= period with ⌈count × x / period⌉ <= k,
// how much of the window may be left for count to weigh at most k.
func leftFor(count, k, period int64) int64 {
	if count <= k {
		return period
	}
	// count × x <= k × period  ⇔  x <= ⌊k × period / count⌋
	hi, lo := bits.Mul64(uint64(k), uint64(period))
	q, _ := bits.Div64(hi, lo, uint64(count)) // k < count: q < period
	return int64(q)
}
