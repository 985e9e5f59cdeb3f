package stack_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/stack"
)

// BenchmarkRegionsHostilePeer: decisions of a global key on a region's
// stack whose one peer is a real Redis (live), a fake one answering every
// read with a header of 2^31−1 elements (header), or with a board of
// 1,000 records of 60 KB (board): a hostile peer costs the decisions
// nothing, its replies being refused in the background rounds. ns/op is
// one decision, serial, on this machine's Redis.
func BenchmarkRegionsHostilePeer(b *testing.B) {
	home, live := testenv.StartRedis(b), testenv.StartRedis(b)
	header := testenv.StartFakeRedis(b, testenv.HeaderBomb)
	big := testenv.StartFakeRedis(b, testenv.BigBoard())
	for _, tc := range []struct{ name, peer string }{
		{"live", live.Addr}, {"header", header.Addr}, {"board", big.Addr},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := stack.New(stack.Config{URL: "redis://" + home.Addr, Region: "eu", Peers: []stack.Peer{{Name: "us", URL: "redis://" + tc.peer}}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			testenv.WaitFor(b, "ready", s.Ready)
			l := sluice.Limit{Rate: 1_000_000, Period: time.Hour} // rate × period below 2^52: its count can be read
			reqs := []sluice.Request{{Key: "g", Limit: l, Cost: 1, Scope: sluice.GlobalScope}}
			var d [1]sluice.Decision
			testenv.WaitFor(b, "rounds", func() bool {
				_ = s.TakeAll(context.Background(), reqs, d[:])
				return s.Regions().Status().Rounds >= 5
			})
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := s.TakeAll(context.Background(), reqs, d[:]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			st := s.Regions().Status()
			if st.Failed > 0 {
				b.Errorf("%d of %d rounds failed", st.Failed, st.Rounds)
			}
			b.ReportMetric(float64(st.Peers[0].Errors), "peer_errors")
		})
	}
}
