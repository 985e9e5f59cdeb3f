package decide_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// TestScopeReachesStore: a limit's scope: global reaches the store as
// the request's Scope, decided exactly (its Sync); the other limits of the
// request keep scope region.
func TestScopeReachesStore(t *testing.T) {
	t.Parallel()
	set := loadRules(t, `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000, scope: global}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
	clk := newClock()
	rec := &recorder{Store: newMemory(t, clk)}
	s := newService(t, set, clk, decide.Config{Store: rec})
	decideOK(t, s, req("api", []string{"user", "u1"}, []string{"ip", "1.2.3.4"}))
	reqs := rec.requests()
	if len(reqs) != 2 {
		t.Fatalf("the store saw %d requests, want 2", len(reqs))
	}
	for _, r := range reqs {
		global := r.Limit.Rate == 1000
		if want := map[bool]sluice.Scope{true: sluice.GlobalScope, false: sluice.RegionScope}[global]; r.Scope != want {
			t.Errorf("request of %v: scope %v, want %v", r.Limit, r.Scope, want)
		}
		if global && r.Sync != sluice.Exact {
			t.Errorf("global request: sync %v, want exact", r.Sync)
		}
	}
}
