package sluice

import (
	"math/bits"
	"time"
)

// slidingWindow is the sliding window counter. It cuts time into
// sub-windows of g = period/subs µs aligned to the Unix epoch, keeps the hit
// counts of the current sub-window and of the subs before it, and estimates
// the hits of the last period as
//
//	c[subs] × (g − elapsed) / g + c[subs−1] + … + c[1] + c[0]
//
// where c[0] is the current sub-window's count, c[i] the count i
// sub-windows before it, and elapsed the time into the current sub-window:
// the oldest sub-window weighs by the part of it still inside the period.
// A request passes when the estimate plus its cost stays within the rate.
// With subs = 1 (precision 1, the default) it is the two-window counter:
// previous × (period − elapsed) / period + current. With a limit of 100 a
// minute, 88 hits in the previous window and 12 in the current one, 15 s
// in: 88 × 45/60 + 12 = 78, so the next request passes. The weighted count
// is rounded up, so the estimate never undercounts the model of evenly
// spread hits within a sub-window; docs/rules.md bounds its error
// against the exact count.
//
// State: t is the current sub-window's start, n its count, p the oldest
// sub-window's (c[subs]); with subs > 1, log holds the nonzero counts of the
// sub-windows between, each at its start, oldest first (nil when none).
func slidingWindow(rate, period, subs int64, s *State, now, cost int64) Decision {
	g := period / subs
	ws := windowStart(now, g, s.t)
	if ws < s.t { // the clock went back: stay in the sub-window we know
		ws, now = s.t, s.t
	}
	if ws != s.t {
		s.slide(ws, g, subs)
	}
	elapsed := now - ws
	var mid int64
	if s.log != nil {
		mid = s.log.sum
	}
	free := rate - s.n - mid - weigh(s.p, g-elapsed, g)
	allowed := cost <= free
	var retry, reset time.Duration
	switch {
	case allowed:
		s.n += cost
		free -= cost
	case cost > rate:
		retry = Never
	default:
		var buf [MaxPrecision + 1]int64
		retry = micros(slidingRetry(rate, g, s.counts(buf[:subs+1], g), elapsed, cost))
	}
	// The newest nonzero count stops weighing subs + 1 sub-windows after
	// its own began.
	switch {
	case s.n > 0:
		reset = micros(ws + (subs+1)*g - now)
	case mid > 0:
		last := s.log.hits[len(s.log.hits)-1].t
		reset = micros(last + (subs+1)*g - now)
	case s.p > 0:
		reset = micros(ws + g - now)
	}
	return Decision{Allowed: allowed, Limit: rate, Remaining: max(free, 0), ResetAfter: reset, RetryAfter: retry}
}

// slide moves s on to the sub-window that starts at ws > s.t: the counts
// of sub-windows that began before ws − subs × g are dropped, the one that
// began then becomes p (the weighted one), and the current count joins the
// sub-windows between when it is one of them.
func (s *State) slide(ws, g, subs int64) {
	oldest := ws - subs*g
	var p int64
	switch {
	case s.t == oldest:
		p = s.n
	case subs > 1 && s.t > oldest && s.n > 0:
		if s.log == nil { // at most subs entries: the subs − 1 between and the one about to expire
			s.log = &hitLog{hits: make([]hit, 0, subs)}
		}
		s.log.add(s.t, s.n)
	}
	if l := s.log; l != nil {
		for _, h := range l.hits[l.head:] {
			if h.t > oldest {
				break
			}
			if h.t == oldest {
				p = h.n
			}
		}
		l.expire(oldest)
		if l.sum == 0 {
			s.log = nil
		}
	}
	s.t, s.n, s.p = ws, 0, p
}

// counts fills c (subs + 1 long, zeroed) with the counts of s, current
// first: c[i] is the count of the sub-window i × g before the current one.
func (s *State) counts(c []int64, g int64) []int64 {
	last := len(c) - 1
	c[0], c[last] = s.n, s.p
	if s.log != nil {
		for _, h := range s.log.hits[s.log.head:] {
			if i := (s.t - h.t) / g; i > 0 && i < int64(last) {
				c[i] += h.n
			}
		}
	}
	return c
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

// slidingRetry returns how many µs after elapsed (into the current
// sub-window of g µs) a request of cost, cost <= rate, first passes, given
// the counts c, current first (see counts). k sub-windows on, c[0..subs−1−k]
// count in full and c[subs−k] weighs; the full part only falls as k grows,
// so the first k where it leaves room is the one, and by k = subs it is
// empty.
func slidingRetry(rate, g int64, c []int64, elapsed, cost int64) int64 {
	subs := len(c) - 1
	var full int64
	for _, n := range c[:subs] {
		full += n
	}
	for k := 0; ; k++ {
		if room := rate - cost - full; room >= 0 {
			// Within that sub-window once ⌈c[subs−k] × (g − e) / g⌉ <= room.
			return int64(k+1)*g - leftFor(c[subs-k], room, g) - elapsed
		}
		full -= c[subs-1-k]
	}
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
