package sluice

import "time"

// Leases of bucket limits (token_bucket, leaky_bucket, gcra).
//
// A lease is a Take of k hits that a store debits at one instant g, the
// grant, and that a node then admits by itself, one request at a time, at
// later instants. In the terms of gcra (T the emission interval, TAT the
// theoretical arrival time; a token bucket is the same in hit·µs), the
// grant moves TAT from max(TAT, g) = B to B + k·T: it gives the lease the
// k slots [B + i·T, B + (i+1)·T), i = 0 … k−1. The node may admit the
// lease's i-th hit only at an instant t <= B + i·T, the start of its slot:
// its due instant. Then the admitted sequence, across any number of nodes
// and the store's own decisions, is one the exact algorithm admits at the
// real instants: every hit has a slot of its own that starts no earlier
// than the hit and ends no later than the hit plus the capacity's
// tolerance (the store's check at g <= t), and hits that fit such slots are
// exactly those gcra admits. A hit admitted past its due instant could fall
// where the real bucket had refilled to full and wasted the refill, which
// the store, counting it at g, did not see: over the limit. A lease whose
// next hit is past due has ended; its unused hits stay counted, as hits
// admitted at the grant would be, and drain at the limit's rate.

// LeaseDue returns the instant, µs on the store's clock, by which the next
// hit of a lease of l must be admitted, when grant is the state the store
// left when it debited the lease and left of the lease's hits are unused:
// the instant at which a bucket holding grant drains down to left hits.
// ok is false for a window algorithm, an invalid limit, or left outside
// [0, capacity].
func (l Limit) LeaseDue(grant State, left int64) (due int64, ok bool) {
	b, ok := l.Bucket()
	if !ok || l.Validate() != nil || left < 0 || left > l.Capacity() {
		return 0, false
	}
	switch l.Algorithm {
	case GCRA: // t is the TAT
		return grant.t - left*b.Hit, true
	default: // t is the last update, n the level then
		return grant.t + floorDiv(grant.n-left*b.Hit, b.Drain), true
	}
}

// LeaseTake decides cost hits of a lease of l at now (µs on the store's
// clock), where grant is the state the store left when it debited the
// lease and left of the lease's hits are unused. ok is false, and the
// lease cannot admit the request, when cost is above left, now is past
// LeaseDue(grant, left), or l is not a bucket limit. Otherwise the request
// is admitted with the decision l takes at now on the state the key would
// have had the lease's other left − cost hits never been taken: Remaining
// counts them as the store's, and a leaky_bucket's Wait is how long until
// the start of the request's slot, so that requests delayed by it leave
// at no more than the rate. It does not change grant.
func (l Limit) LeaseTake(grant State, left, now, cost int64) (d Decision, ok bool) {
	b, ok := l.Bucket()
	if !ok || l.Validate() != nil || cost < 0 || cost > left || left > l.Capacity() {
		return Decision{}, false
	}
	level := l.Level(grant, now) - left*b.Hit // the bucket before this request, without the lease's unused hits
	if level < 0 {
		return Decision{}, false // past due
	}
	s := l.BucketState(level, now)
	d = l.TakeMicros(&s, now, cost)
	return d, d.Allowed
}

// floorDiv returns ⌊a/b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// ReturnLease gives back hits unused hits of a lease of l to s, the key's
// state, at now (µs on the store's clock), where giving them back is
// exact, and returns how many it gave back; grant is the state the lease's
// grant left. store/redis's lease.lua is this rule in Lua.
//   - fixed_window, sliding_window: counts add up, so the hits come off
//     the count of the lease's window as if never taken, while that window
//     is the key's current one (a sliding_window's also while it is the
//     previous one, whose count still weighs), never below 0.
//   - gcra, token_bucket, leaky_bucket: only while nothing was admitted on
//     the key since the grant (s is grant, drained since), and only the
//     whole slots of the unused hits still ahead of now (see the leases of
//     bucket limits above): after anything else, later hits may be due in
//     those slots.
//
// It gives nothing back for a sliding_log, a sliding_window of more than
// one sub-window (Precision), an invalid limit or hits <= 0.
func (l Limit) ReturnLease(s *State, grant State, hits, now int64) int64 {
	p := int64(l.Period / time.Microsecond)
	if hits <= 0 || l.Validate() != nil || l.SubWindows() > 1 {
		return 0
	}
	hits = min(hits, l.Capacity()) // no lease is larger
	switch l.Algorithm {
	case FixedWindow, SlidingWindow:
		cur := windowStart(now, p, s.t)
		sliding := l.Algorithm == SlidingWindow
		var from *int64
		switch {
		case s.t == grant.t && (cur == grant.t || sliding && cur == grant.t+p):
			from = &s.n // the lease's window is the key's latest
		case sliding && s.t == grant.t+p && cur == s.t:
			from = &s.p // it is the previous one
		default:
			return 0
		}
		back := min(hits, max(*from, 0))
		*from -= back
		return back
	case GCRA: // t is the TAT, Hit the emission interval
		b, _ := l.Bucket()
		if s.t != grant.t || s.t <= now {
			return 0
		}
		keep := max(s.t-hits*b.Hit, now)
		back := (s.t - keep) / b.Hit
		s.t = keep
		return back
	case TokenBucket, LeakyBucket: // n is the level at t, in hit·µs
		d := s.t - grant.t // the level drained since the grant, and nothing added, or not the grant's
		if d < 0 || d > grant.n/l.Rate || grant.n-s.n != d*l.Rate {
			return 0
		}
		if now > s.t {
			s.n, s.t = drain(s.n, now-s.t, l.Rate), now
		}
		take := min(hits*p, s.n)
		s.n -= take
		return take / p
	}
	return 0
}
