package decide

import "context"

// Admitter is a step of admission after the rate decision (Config.Admit):
// package admit's concurrency slots. Decide calls Admit once for each
// request its rate limits allow (resp.Overall OK), before the global
// shadow mode, the fail-mode accounting and the Observers, so that they
// see its verdict. Admit may deny the request: it marks the statuses it
// denies and sets resp.Overall to OverLimit. It sets resp.Mode to its fail
// mode's when its own store fails, and hands what the request holds to
// resp.Hold, which Response.Done gives back.
type Admitter interface {
	Admit(ctx context.Context, r *Request, resp *Response)
}

// Holding is what a request holds until its Response's Done: admit's
// concurrency slots. Release gives it all back; it is called once.
type Holding interface {
	Release(ctx context.Context)
}

// Hold makes Done give h back; an Admitter calls it.
func (r *Response) Hold(h Holding) { r.held = h }

// Done gives back what the request holds (its concurrency slots: see
// Config.Admit), at once; a caller that asked to hold them (Request.Hold)
// calls it when the request ends, however it ends. Without it they are
// held until their lease ends. ctx bounds the store calls: pass one that
// outlives a client that is gone (context.WithoutCancel). Done is safe to
// call more than once and on a nil Response.
func (r *Response) Done(ctx context.Context) {
	if r == nil || r.held == nil {
		return
	}
	h := r.held
	r.held = nil
	h.Release(ctx)
}

// admitStep hands a request its rate limits allow to Config.Admit. A
// Service without one leaves concurrency limits alone, and says so once
// at Warn the first time a rule with one is decided, so that a rules file's
// `concurrency` does not lapse unseen where an embedder composed no admit.
func (s *Service) admitStep(ctx context.Context, r *Request, resp *Response) {
	if s.admit != nil {
		s.admit.Admit(ctx, r, resp)
		return
	}
	if s.unadmitted.Load() {
		return
	}
	for i := range resp.Statuses {
		if rule := resp.Statuses[i].Rule; rule != nil && rule.Concurrency > 0 {
			if s.unadmitted.CompareAndSwap(false, true) {
				s.log.Warn("a concurrency limit is not enforced: the decision service has no admission step (decide.Config.Admit: admit.New)",
					"domain", r.Domain, "key", rule.Key, "concurrency", rule.Concurrency)
			}
			return
		}
	}
}
