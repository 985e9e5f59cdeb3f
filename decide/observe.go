package decide

import "context"

// Decider decides requests. *Service is the one implementation; a
// transport takes a Decider (or declares the one method it needs), and
// what watches decisions is an Observer of the Service, not a Decider
// around it.
type Decider interface {
	Decide(ctx context.Context, r *Request) (*Response, error)
}

var _ Decider = (*Service)(nil)

// Observer is told of every decision (Config.Observers): package metrics
// counts them, observe keeps heavy hitters and a denial log, tracing ends
// a span. Observe is called once per Decide, after the decision, with the
// request and the response, or with the error of an invalid request (resp
// nil). It runs on the decision's path: it must be quick, safe for
// concurrent use, and must neither change nor keep r and resp.
type Observer interface {
	Observe(ctx context.Context, r *Request, resp *Response, err error)
}

// Starter is an Observer that also hears of a decision before it is made:
// Start returns the context the decision runs in, which the store calls
// and Observe then receive (package tracing starts a span there, the
// parent of the store calls' spans).
type Starter interface {
	Observer
	Start(ctx context.Context, r *Request) context.Context
}

// shadowAll puts every descriptor of a decided request in shadow mode, as
// Envoy's SHADOW_MODE does (Config.Shadow): one over its limit is answered
// OK and reported as a shadow over-limit, and so is the request.
func shadowAll(resp *Response) {
	if resp.Overall != OverLimit {
		return
	}
	resp.Overall = OK
	for i := range resp.Statuses {
		if st := &resp.Statuses[i]; st.Code == OverLimit {
			st.Code, st.Shadow, st.ShadowOverLimit = OK, true, true
		}
	}
}
