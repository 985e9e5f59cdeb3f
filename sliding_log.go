package sluice

// slidingLog keeps the time of every admitted hit and admits a request when
// the hits of the last period, (now − period, now], plus its cost stay
// within the rate. It is exact, never more than rate hits in any
// period-long window, and costs memory in proportion to the rate: one entry
// per admitted request still in the window.
//
// State: log holds the admitted requests, oldest first; t is the latest
// time seen.
func slidingLog(rate, period int64, s *State, now, cost int64) Decision {
	if now < s.t { // the clock went back: keep the time we know
		now = s.t
	}
	s.t = now
	if s.log == nil {
		s.log = &hitLog{}
	}
	l := s.log
	l.expire(now - period)
	d := Decision{Limit: rate}
	switch {
	case cost <= rate-l.sum:
		if cost > 0 {
			l.add(now, cost)
		}
		d.Allowed = true
	case cost > rate:
		d.RetryAfter = Never
	default:
		d.RetryAfter = micros(l.passes(rate-cost) + period - now)
	}
	d.Remaining = max(rate-l.sum, 0)
	if n := len(l.hits); n > l.head {
		d.ResetAfter = micros(l.hits[n-1].t + period - now)
	}
	if l.sum == 0 {
		s.log = nil // a fresh key again: drop the memory
	}
	return d
}

// hit is one admitted request: n hits at t µs.
type hit struct{ t, n int64 }

// hitLog is the log of admitted requests, oldest first, from hits[head].
type hitLog struct {
	hits []hit
	head int
	sum  int64 // hits in hits[head:]
}

// expire drops the requests at or before t.
func (l *hitLog) expire(t int64) {
	for l.head < len(l.hits) && l.hits[l.head].t <= t {
		l.sum -= l.hits[l.head].n
		l.head++
	}
	if l.head == len(l.hits) {
		l.hits, l.head = l.hits[:0], 0
	}
}

// add appends n hits at t, t >= every time in the log.
func (l *hitLog) add(t, n int64) {
	l.sum += n
	if k := len(l.hits); k > l.head && l.hits[k-1].t == t {
		l.hits[k-1].n += n
		return
	}
	if len(l.hits) == cap(l.hits) && l.head > 0 {
		k := copy(l.hits, l.hits[l.head:])
		l.hits, l.head = l.hits[:k], 0
	}
	l.hits = append(l.hits, hit{t, n})
}

// passes returns the time of the request whose expiry brings the sum down
// to at most max.
func (l *hitLog) passes(max int64) int64 {
	sum := l.sum
	for _, h := range l.hits[l.head:] {
		sum -= h.n
		if sum <= max {
			return h.t
		}
	}
	return 0 // unreachable while max >= 0
}
