package decide_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// TestRequestLimitKeepsConcurrency checks that a descriptor's own limit
// replaces the rules' rate limit only: the rule's concurrency still caps
// the requests in flight.
func TestRequestLimitKeepsConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newClock()
	cfg := decide.DefaultConfig()
	cfg.Now = clk.Now
	s := newService(t, loadRules(t, slotRules), clk, cfg)
	own := &rules.RequestLimit{RequestsPerUnit: 1000, Unit: "hour"}
	r := &decide.Request{Domain: "api", Hold: true, Descriptors: []decide.Descriptor{{Cost: 1, Limit: own,
		Entries: []decide.Entry{{Key: "user", Value: "alice"}}}}}
	for i, want := range []decide.Code{decide.OK, decide.OK, decide.OverLimit} {
		resp, err := s.Decide(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if resp.Overall != want || (want == decide.OK && st.Limit.Limit.Rate != 1000) || (want == decide.OverLimit && !st.Concurrency) {
			t.Fatalf("call %d: %v %+v, want %v (the own limit of 1000, then the concurrency of 2)", i, resp.Overall, st, want)
		}
	}
}
