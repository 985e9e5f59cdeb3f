package decide

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// elasticRef is one limit with throttling: elastic of a request: its store
// key and group, as collect makes them for every limit, and the cost.
type elasticRef struct {
	ref
	key, group string
	cost       int64
}

// excessPrefix begins the store key of an elastic limit's excess counter:
// no limit's key begins with it (they begin with a hex ID).
const excessPrefix = "+"

// elastic decides the elastic limits of b, once the request's other
// limits have passed. Each is three counters, each taken on its own:
//
//  1. the limit itself (rules.Limit.Limit) in the client's group: a request
//     within it passes, and is counted against the pool (2) too;
//  2. the domain's pool (rules.Limit.Pool, the rules' `capacity`) in a group
//     of its own, so a Redis Cluster keeps it in its own slot;
//  3. the excess (rules.Limit.Excess, the ceiling less the limit) in the
//     client's group: a request past the limit takes the excess first and
//     then the pool, and passes only if both have room.
//
// The steps are not one atomic call (the pool lives on another shard), so
// they are ordered to be safe: what a step takes is never given back, and a
// request passes only once every counter it needs has taken it. So a client
// never passes its ceiling (1 + 3 count every request it passed), and the
// pool admits past-limit requests only while it has room (its count is
// exact). What this costs is under-admission, never over-admission: a
// past-limit request the pool refuses has used one hit of the client's
// excess (at most the excess per window), and a request within its limit
// that finds the pool full is not counted in it (the pool is full anyway).
// A request denied here keeps the hits its other limits took.
//
// "Spare" is the pool's room and, when the caller can tell (r.Spare, the
// proxy's and the middleware's load shedder), the service's own: a
// request past its limit while the service has no spare capacity is
// denied before it takes anything from the excess or the pool.
func (s *Service) elastic(ctx, tctx context.Context, r *Request, resp *Response, b *batch) {
	for _, e := range b.elastic {
		st := &resp.Statuses[e.desc]
		l := e.limit
		own := s.takeOne(ctx, tctx, resp, sluice.Request{Key: e.key, Group: e.group, Limit: l.Limit, Cost: e.cost})
		pool := sluice.Request{Key: l.Pool.ID, Group: l.Pool.ID, Limit: l.Pool.Limit, Cost: e.cost}
		d := own
		switch {
		case own.Allowed:
			s.takeOne(ctx, tctx, resp, pool) // counted; the pool's verdict does not matter here
		case r.Spare != nil && !r.Spare():
			// The service is saturated: nothing past the limit. Its own
			// refill is the time to retry (the service's is unknown).
		default:
			ex := s.takeOne(ctx, tctx, resp, sluice.Request{Key: excessPrefix + e.key, Group: e.group, Limit: l.Excess(), Cost: e.cost})
			if ex.Allowed {
				p := s.takeOne(ctx, tctx, resp, pool)
				if p.Allowed {
					d = sluice.Decision{Allowed: true, Limit: own.Limit, Remaining: 0, ResetAfter: own.ResetAfter}
				} else {
					d.RetryAfter = min(own.RetryAfter, p.RetryAfter) // its limit refills, or the pool gets room
				}
			} else {
				d.RetryAfter = min(own.RetryAfter, ex.RetryAfter) // past its ceiling
			}
		}
		elasticStatus(st, l, d)
	}
}

// elasticStatus writes an elastic limit's decision into its descriptor's
// status, if it binds tighter than the descriptor's other limits.
func elasticStatus(st *Status, l *rules.Limit, d sluice.Decision) {
	if st.Limit != nil && !binds(d, st.Decision) {
		return
	}
	st.decide(l, d)
}

// takeOne takes one request from the store, or decides it as fallback
// says when the store does not (denied: until the breaker's cool-down),
// noting the mode in resp.
func (s *Service) takeOne(ctx, tctx context.Context, resp *Response, req sluice.Request) sluice.Decision {
	reqs, ds := []sluice.Request{req}, make([]sluice.Decision, 1)
	switch s.decideFrom(ctx, tctx, resp, reqs, ds) {
	case decided:
		return ds[0]
	case denied:
		return sluice.Decision{Limit: req.Limit.Capacity(), ResetAfter: s.coolDown, RetryAfter: s.coolDown}
	}
	return sluice.Decision{Allowed: true, Limit: req.Limit.Capacity(), Remaining: req.Limit.Capacity()}
}

// bound returns ctx bounded by the store timeout, as Decide bounds its
// store calls.
func (s *Service) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout > 0 {
		return context.WithTimeout(ctx, s.latency.now())
	}
	return ctx, func() {}
}
