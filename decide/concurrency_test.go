package decide_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/decide"
)

// TestDecideConcurrentExact decides from many goroutines at one instant on
// a shared limit and a per-user limit: exactly the shared limit's worth of
// requests pass, and each user's counter holds exactly that user's admitted
// requests, because a request the shared limit denies consumes nothing.
func TestDecideConcurrentExact(t *testing.T) {
	t.Parallel()
	const (
		shared  = 100
		perUser = 1000
		users   = 8
		each    = 40
	)
	clk := newClock()
	s := newService(t, loadRules(t, `
domain: api
descriptors:
  - key: gateway
    rate_limit: {unit: minute, requests_per_unit: `+strconv.Itoa(shared)+`}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: `+strconv.Itoa(perUser)+`}
`), clk, decide.DefaultConfig())
	admitted := make([]int64, users)
	var wg sync.WaitGroup
	for u := range users {
		wg.Go(func() {
			for range each {
				resp, err := s.Decide(context.Background(), req("api", []string{"gateway", "gw1"}, []string{"user", strconv.Itoa(u)}))
				if err != nil {
					t.Error(err)
					return
				}
				if resp.Overall == decide.OK {
					admitted[u]++
				}
			}
		})
	}
	wg.Wait()
	var total int64
	for u := range users {
		total += admitted[u]
		resp := decideOK(t, s, withCost(req("api", []string{"user", strconv.Itoa(u)}), 0))
		if got, want := resp.Statuses[0].Decision.Remaining, perUser-admitted[u]; got != want {
			t.Errorf("user %d: %d remaining after %d admitted, want %d", u, got, admitted[u], want)
		}
	}
	if total != shared {
		t.Errorf("admitted %d requests, want exactly %d", total, shared)
	}
}
