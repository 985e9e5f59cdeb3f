package decide

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Inspection is the state of a request's descriptors under every limit of
// the rules they match, as Service.Inspect finds it.
type Inspection struct {
	// UnknownDomain reports that no rules define the request's domain:
	// the descriptors have no rule.
	UnknownDomain bool
	Descriptors   []DescriptorState // one per descriptor, in order
}

// DescriptorState is one descriptor's state under each limit of its rule.
type DescriptorState struct {
	// Rule is the rule the descriptor matches, nil if none.
	Rule *rules.Rule
	// Limits are the rule's limits, in its order.
	Limits []LimitState
	// Binding indexes the limit in Limits that Decide would report for a
	// request of cost 0 (Status.Limit): one that denies, or else the one
	// with the least remaining; -1 when no limit is counted.
	Binding int
}

// LimitState is one limit's counter as a request of cost 0 finds it.
type LimitState struct {
	Limit *rules.Limit
	// Decision is the take of cost 0 from the limit's own counter, in the
	// rule's terms (with soft throttling, Remaining is what is left of the
	// nominal limit). For a limit that blocks every request (Block) it
	// denies, with ResetAfter and RetryAfter the limit's period; zero for
	// an unlimited or a replaced limit, which have no counter.
	Decision sluice.Decision
	// Replaced reports that another limit of the request replaces this
	// one by name (Envoy's replaces), so that Decide does not take it.
	Replaced bool
	// Excess and Pool are, for an elastic limit, the takes of cost 0 from
	// its excess (past the limit, up to its ceiling) and from the domain's
	// pool (the rules' capacity); zero otherwise.
	Excess, Pool sluice.Decision
	// Key is the store key of the limit's counter as Decide takes it, by
	// which a store that keeps more of it tells it (store/regions: a
	// global limit's count in each region); empty for a limit without
	// one, or an elastic limit's.
	Key string
}

// DeniesNext reports whether a request of cost 1 would be over the limit
// now: nothing remains of it (of an elastic limit: nothing remains of it,
// and nothing of its excess or of the pool), or it blocks every request.
func (ls *LimitState) DeniesNext() bool {
	l := ls.Limit
	switch {
	case l.Unlimited || ls.Replaced:
		return false
	case l.Block:
		return true
	}
	over := !ls.Decision.Allowed || ls.Decision.Remaining < 1
	if l.Throttling == rules.Elastic {
		return over && (ls.Excess.Remaining < 1 || ls.Pool.Remaining < 1)
	}
	return over
}

// Inspect reports the state of r's descriptors under every limit of the
// rules they match, each limit's own, by a take of cost 0 from the store
// (which counts nothing): the limits Decide would take (with the same
// store keys) and, for an elastic limit, its excess and the domain's pool.
// It is for operators ("why was I limited?"), not for the hot path:
// descriptors' costs are ignored, no concurrency slot is taken, and the
// store is asked in one TakeAll, bounded by the store timeout, whatever the
// circuit breaker says. A store that fails makes Inspect fail (the fail
// mode does not answer for it). The other errors are invalid requests
// (wrapping ErrInvalidRequest).
func (s *Service) Inspect(ctx context.Context, r *Request) (*Inspection, error) {
	digest, err := s.caps.validate(r)
	if err != nil {
		return nil, err
	}
	n := len(r.Descriptors)
	ins := &Inspection{Descriptors: make([]DescriptorState, n)}
	for i := range ins.Descriptors {
		ins.Descriptors[i].Binding = -1
	}
	set := s.rules()
	if set == nil {
		ins.UnknownDomain = true
		return ins, nil
	}
	resp := &Response{Statuses: make([]Status, n)}
	replaces, err := match(set, r, resp)
	if err != nil {
		return nil, err
	}
	if resp.UnknownDomain {
		ins.UnknownDomain = true
		return ins, nil
	}
	ins.limits(resp, replaces)

	b := s.batches.Get().(*batch)
	defer s.release(b)
	b.reset(n)
	s.collect(b, r, resp, replaces, digest)
	reqs := inspectRequests(b)
	ds := make([]sluice.Decision, len(reqs))
	if len(reqs) > 0 {
		tctx, cancel := s.bound(ctx)
		err := s.store.TakeAll(tctx, reqs, ds)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("inspect: %w", err)
		}
	}
	ins.fill(b, reqs, ds)
	ins.bind()
	return ins, nil
}

// limits writes the limits of the rule each descriptor matched (resp's
// statuses), each marked when another limit of the request replaces it.
func (ins *Inspection) limits(resp *Response, replaces bool) {
	for i := range ins.Descriptors {
		rule := resp.Statuses[i].Rule
		ds := &ins.Descriptors[i]
		ds.Rule = rule
		if rule == nil {
			continue
		}
		ds.Limits = make([]LimitState, len(rule.Limits))
		for j, l := range rule.Limits {
			ds.Limits[j] = LimitState{Limit: l, Replaced: replaces && replaced(l, resp)}
		}
	}
}

// inspectRequests returns every counter of b in one TakeAll of cost 0:
// b.reqs as collect made them, then each elastic limit's own, excess and
// pool counters, as Service.elastic takes them.
func inspectRequests(b *batch) []sluice.Request {
	reqs := make([]sluice.Request, 0, len(b.reqs)+3*len(b.elastic))
	for _, q := range b.reqs {
		q.Cost = 0
		reqs = append(reqs, q)
	}
	for _, e := range b.elastic {
		l := e.limit
		reqs = append(reqs,
			sluice.Request{Key: e.key, Group: e.group, Limit: l.Limit},
			sluice.Request{Key: excessPrefix + e.key, Group: e.group, Limit: l.Excess()},
			sluice.Request{Key: l.Pool.ID, Group: l.Pool.ID, Limit: l.Pool.Limit})
	}
	return reqs
}

// at returns the state of limit l of descriptor desc, or nil.
func (ins *Inspection) at(desc int, l *rules.Limit) *LimitState {
	for j := range ins.Descriptors[desc].Limits {
		if ls := &ins.Descriptors[desc].Limits[j]; ls.Limit == l {
			return ls
		}
	}
	return nil // collect takes only the rule's limits
}

// fill writes the decisions ds of inspectRequests' reqs of b into the
// limits' states, and those of the limits that block every request.
func (ins *Inspection) fill(b *batch, reqs []sluice.Request, ds []sluice.Decision) {
	for k, ref := range b.refs {
		if ls := ins.at(ref.desc, ref.limit); ls != nil {
			ls.Decision, ls.Key = nominal(ref.limit, ds[k]), reqs[k].Key
		}
	}
	for k, e := range b.elastic {
		if ls := ins.at(e.desc, e.limit); ls != nil {
			d := ds[len(b.refs)+3*k:]
			ls.Decision, ls.Excess, ls.Pool = d[0], d[1], d[2]
		}
	}
	for _, br := range b.blocked {
		if ls := ins.at(br.desc, br.limit); ls != nil {
			p := br.limit.Limit.Period
			ls.Decision = sluice.Decision{ResetAfter: p, RetryAfter: p}
		}
	}
}

// bind sets each descriptor's binding limit: the one that binds tightest
// of those neither unlimited nor replaced.
func (ins *Inspection) bind() {
	for i := range ins.Descriptors {
		ds := &ins.Descriptors[i]
		for j := range ds.Limits {
			ls := &ds.Limits[j]
			if ls.Limit.Unlimited || ls.Replaced {
				continue
			}
			if ds.Binding < 0 || binds(ls.Decision, ds.Limits[ds.Binding].Decision) {
				ds.Binding = j
			}
		}
	}
}
