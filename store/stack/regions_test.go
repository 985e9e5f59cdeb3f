package stack_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/regions"
	"github.com/sluicehq/sluice/store/stack"
)

// TestRegions composes two regions' stacks on two real Redis servers,
// each listing the other: a global key's hits in both are counted against
// one limit, each stack's rounds find the other live, and the key's use
// is known by region; a key of scope region stays its region's.
func TestRegions(t *testing.T) {
	t.Parallel()
	eu, us := testenv.StartRedis(t), testenv.StartRedis(t)
	open := func(region, home, peer, peerAddr string) *stack.Stack {
		s, err := stack.New(stack.Config{URL: "redis://" + home, Region: region,
			Peers: []stack.Peer{{Name: peer, URL: "redis://" + peerAddr}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s
	}
	stacks := []*stack.Stack{open("eu", eu.Addr, "us", us.Addr), open("us", us.Addr, "eu", eu.Addr)}
	ctx := context.Background()
	l := sluice.Limit{Rate: 10, Period: time.Hour}
	take := func(s *stack.Stack, scope sluice.Scope) bool {
		key := map[sluice.Scope]string{sluice.GlobalScope: "g", sluice.RegionScope: "r"}[scope]
		var d [1]sluice.Decision
		if err := s.TakeAll(ctx, []sluice.Request{{Key: key, Limit: l, Cost: 1, Scope: scope, Sync: sluice.Exact}}, d[:]); err != nil {
			t.Fatal(err)
		}
		return d[0].Allowed
	}
	testenv.WaitFor(t, "each region to read the other live", func() bool {
		for _, s := range stacks {
			take(s, sluice.GlobalScope)
			if st := s.Regions().Status(); len(st.Peers) != 1 || st.Peers[0].State != regions.Live || st.Cut {
				return false
			}
		}
		return true
	})
	until := stacks[0].Regions().Status().Rounds + 20
	testenv.WaitFor(t, "20 rounds of taking in both regions", func() bool {
		for _, s := range stacks {
			take(s, sluice.GlobalScope)
		}
		return stacks[0].Regions().Status().Rounds >= until
	})
	// what was admitted, the takes while waiting above included, from a view
	testenv.WaitFor(t, "a round after the last take", func() bool {
		u, _ := stacks[0].Regions().Usage("g")
		return time.Since(u.At) < 50*time.Millisecond
	})
	u, ok := stacks[0].Regions().Usage("g")
	if !ok || len(u.Regions) != 2 {
		t.Fatalf("usage %+v, %v", u, ok)
	}
	total := u.Regions[0].Count + u.Regions[1].Count
	if b := l.Rate - 1 + 2*1; total > b {
		t.Errorf("the regions admitted %d together, more than the bound %d", total, b)
	}
	for _, s := range stacks {
		for range l.Rate {
			if !take(s, sluice.RegionScope) {
				t.Fatal("a key of scope region did not admit its limit in its region")
			}
		}
	}
}
