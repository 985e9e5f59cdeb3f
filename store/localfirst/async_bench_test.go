package localfirst

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// BenchmarkTakeAsync measures a decision in async mode over a real Redis,
// on a window limit and on a bucket limit (whose grant follows the
// refill), from parallel goroutines over 64 hot keys of a limit they
// never reach, the node syncing every 100 ms by itself. It reports the
// store calls per decision.
//
//	go test -run '^$' -bench 'TakeAsync/' -benchtime 200000x -count 6 ./store/localfirst
func BenchmarkTakeAsync(b *testing.B) {
	url := "redis://" + testenv.RedisAddr(b) + "/0"
	for _, l := range []sluice.Limit{
		{Rate: 1_000_000, Period: time.Hour}, // rate × period within 2^52 µs: async
		{Algorithm: sluice.TokenBucket, Rate: 1_000_000, Period: time.Second, Burst: 1_000_000},
	} {
		b.Run(l.Algorithm.String(), func(b *testing.B) {
			r := openRedis(b, url, nil)
			s, err := New(r, Config{Sync: Async})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = fmt.Sprintf("{bench%d}", i)
				if _, err := sluice.Take(context.Background(), s, keys[i], l, 1); err != nil { // the node takes the key up
					b.Fatal(err)
				}
			}
			before := s.Stats().StoreCalls
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
				for pb.Next() {
					if _, err := sluice.Take(context.Background(), s, keys[rng.IntN(len(keys))], l, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(s.Stats().StoreCalls-before)/float64(b.N), "calls/op")
		})
	}
}
