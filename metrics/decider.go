package metrics

import (
	"context"

	"github.com/sluicehq/sluice/decide"
)

// Service is what a Decider decorates: the Decide method of
// *decide.Service, which the transports also accept.
type Service interface {
	Decide(ctx context.Context, r *decide.Request) (*decide.Response, error)
}

// Decider counts the decisions of a Service. It is safe for concurrent use
// and has the same Decide method, so a transport takes either.
type Decider struct {
	m    *Metrics
	next Service
	mode func() decide.Mode
}

// Decider returns a Decider that counts the decisions of next. When next
// also has a Mode method (as *decide.Service does), sluice_mode reports it
// and the Decider's Mode passes it on; the last Decider made sets
// sluice_mode.
func (m *Metrics) Decider(next Service) *Decider {
	d := &Decider{m: m, next: next}
	if mo, ok := next.(interface{ Mode() decide.Mode }); ok {
		d.mode = mo.Mode
		m.mode.src.Store(&d.mode)
	}
	return d
}

// Decide decides r with the decorated Service and counts the result.
func (d *Decider) Decide(ctx context.Context, r *decide.Request) (*decide.Response, error) {
	resp, err := d.next.Decide(ctx, r)
	if err != nil {
		d.m.invalid.Inc()
		return nil, err
	}
	d.m.observe(r, resp)
	return resp, nil
}

// Mode returns the decorated Service's Mode, or decide.ModeStore when it
// has none.
func (d *Decider) Mode() decide.Mode {
	if d.mode == nil {
		return decide.ModeStore
	}
	return d.mode()
}
