package server

import (
	"context"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/metrics"
)

// shadowAll puts every limit in shadow mode, as Envoy's SHADOW_MODE does:
// a descriptor over its limit is answered OK and reported as a shadow
// over-limit (so metrics count it), and so is the request.
type shadowAll struct{ next metrics.Service }

// Decide implements metrics.Service.
func (s shadowAll) Decide(ctx context.Context, r *decide.Request) (*decide.Response, error) {
	resp, err := s.next.Decide(ctx, r)
	if err != nil || resp.Overall != decide.OverLimit {
		return resp, err
	}
	resp.Overall = decide.OK
	for i := range resp.Statuses {
		if st := &resp.Statuses[i]; st.Code == decide.OverLimit {
			st.Code, st.Shadow, st.ShadowOverLimit = decide.OK, true, true
		}
	}
	return resp, nil
}

// Mode passes on the decorated service's Mode, for readiness and metrics.
func (s shadowAll) Mode() decide.Mode {
	if m, ok := s.next.(interface{ Mode() decide.Mode }); ok {
		return m.Mode()
	}
	return decide.ModeStore
}
