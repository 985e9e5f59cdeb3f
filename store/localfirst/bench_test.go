package localfirst

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// BenchmarkTake measures a decision of the decorator over a real Redis, in
// exact mode (every decision a Redis call, but for the near cache) and in
// lease mode, from parallel goroutines over 64 hot keys of a limit they
// never reach, after a warm-up in which leases grow to their size: a fixed
// window, and token_bucket and gcra limits of 10 a second with a burst of
// 2^30, which the keys drain (far faster than 10 a second, even in exact
// mode) but never empty, so that a lease's hits are due far ahead. It reports the p50 and
// p99 of one decision's latency and the store calls per decision.
//
//	go test -run '^$' -bench 'Take/' -benchtime 200000x -count 6 ./store/localfirst
func BenchmarkTake(b *testing.B) {
	url := "redis://" + testenv.RedisAddr(b) + "/0"
	window := sluice.Limit{Rate: 1 << 40, Period: time.Hour}
	bucket := func(a sluice.Algorithm) sluice.Limit {
		return sluice.Limit{Algorithm: a, Rate: 10, Period: time.Second, Burst: 1 << 30}
	}
	for _, c := range []struct {
		name string
		mode Sync
		l    sluice.Limit
	}{
		{"exact", Exact, window},
		{"lease", Lease, window},
		{"exact-token_bucket", Exact, bucket(sluice.TokenBucket)},
		{"lease-token_bucket", Lease, bucket(sluice.TokenBucket)},
		{"lease-gcra", Lease, bucket(sluice.GCRA)},
	} {
		mode, l := c.mode, c.l
		b.Run(c.name, func(b *testing.B) {
			r := openRedis(b, url, nil)
			s, err := New(r, Config{Sync: mode})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = fmt.Sprintf("{bench%d}", i)
			}
			// Warm up: leases grow to their size, the connections are made.
			for range 2000 {
				for _, k := range keys {
					if _, err := sluice.Take(context.Background(), s, k, l, 1); err != nil {
						b.Fatal(err)
					}
				}
			}
			before := s.Stats().StoreCalls
			var mu sync.Mutex
			var all []time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
				lat := make([]time.Duration, 0, 1<<16)
				for pb.Next() {
					t0 := time.Now()
					d, err := sluice.Take(context.Background(), s, keys[rng.IntN(len(keys))], l, 1)
					lat = append(lat, time.Since(t0))
					if err != nil || !d.Allowed {
						b.Errorf("%+v, %v", d, err)
						return
					}
				}
				mu.Lock()
				all = append(all, lat...)
				mu.Unlock()
			})
			b.StopTimer()
			slices.Sort(all)
			if len(all) > 0 {
				b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "p99-ns")
				b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "p50-ns")
			}
			b.ReportMetric(float64(s.Stats().StoreCalls-before)/float64(b.N), "calls/op")
		})
	}
}
