package redis

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// benchAddr returns the Redis the benchmarks run on: $SLUICE_BENCH_REDIS_ADDR
// (a Redis of its own, for quiet figures), else the shared test Redis.
func benchAddr(b *testing.B) string {
	if a := os.Getenv("SLUICE_BENCH_REDIS_ADDR"); a != "" {
		return a
	}
	return testenv.RedisAddr(b)
}

// commandStats returns the calls and total µs of the script commands
// (EVALSHA and EVAL) from INFO commandstats.
func commandStats(b *testing.B, c rueidis.Client) (calls, usec int64) {
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls += n
			case "usec":
				usec += n
			}
		}
	}
	return calls, usec
}

// BenchmarkTake drives the store with 64 goroutines over 10,000 keys
// (GCRA, 1000/s, Redis's TIME) and reports decisions/s, the decisions one
// script call carried, and the Redis CPU µs per decision from INFO
// commandstats.
func BenchmarkTake(b *testing.B) {
	b.Run("default", func(b *testing.B) { benchmarkTake(b, DefaultConfig()) })
	for _, inFlight := range []int{1, 3, 4, 8} {
		b.Run(fmt.Sprintf("inflight=%d", inFlight), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.MaxInFlight = inFlight
			benchmarkTake(b, cfg)
		})
	}
	for _, window := range []time.Duration{-1, 10 * time.Microsecond, 40 * time.Microsecond} { // -1: never wait
		b.Run(fmt.Sprintf("inflight=2/window=%v", window), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.MaxInFlight, cfg.BatchWindow = 2, window
			benchmarkTake(b, cfg)
		})
	}
}

// BenchmarkTakeCluster is BenchmarkTake on the test Redis Cluster, where
// a script call carries the decisions of one slot only: with 10,000
// clients each in a slot of its own, about one per call.
func BenchmarkTakeCluster(b *testing.B) {
	url := "redis+cluster://" + strings.Join(testenv.RedisClusterAddrs(b), ",")
	for _, inFlight := range []int{0, 6, 48} {
		b.Run(fmt.Sprintf("inflight=%d", inFlight), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.MaxInFlight = inFlight
			cfg.KeyPrefix = fmt.Sprintf("bench%d:", time.Now().UnixNano())
			runTake(b, open(b, url, cfg), nil)
		})
	}
}

func benchmarkTake(b *testing.B, cfg Config) {
	addr := benchAddr(b)
	cfg.KeyPrefix = fmt.Sprintf("bench%d:", time.Now().UnixNano())
	s := open(b, "redis://"+addr, cfg)
	admin, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	runTake(b, s, admin)
}

// runTake runs the 64 goroutines over 10,000 keys; admin, when not nil, is
// the Redis whose commandstats give the script calls and Redis µs.
func runTake(b *testing.B, s *Store, admin rueidis.Client) {
	l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 1000, Period: time.Second}
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "{user" + strconv.Itoa(i) + "}|0"
	}
	var failed atomic.Int64
	var seq atomic.Uint64
	var calls0, usec0 int64
	if admin != nil {
		calls0, usec0 = commandStats(b, admin)
	}
	b.ReportAllocs()
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((64 + procs - 1) / procs) // 64 goroutines
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := seq.Add(7919)
		ctx := context.Background()
		for pb.Next() {
			i += 7919
			if _, err := sluice.Take(ctx, s, keys[i%uint64(len(keys))], l, 1); err != nil {
				failed.Add(1)
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d decisions failed", n)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	if admin == nil {
		return
	}
	calls1, usec1 := commandStats(b, admin)
	if calls := calls1 - calls0; calls > 0 {
		b.ReportMetric(float64(b.N)/float64(calls), "decisions/call")
		b.ReportMetric(float64(usec1-usec0)/float64(b.N), "redis-µs/decision")
	}
}

// BenchmarkLatency measures one decision at a time (light load), p50 and
// p99: "take" through the store, and "get", one plain GET through rueidis,
// the round trip that any Redis call pays; the difference is what the
// store adds.
func BenchmarkLatency(b *testing.B) {
	addr := benchAddr(b)
	b.Run("take", func(b *testing.B) {
		cfg := DefaultConfig()
		cfg.KeyPrefix = fmt.Sprintf("lat%d:", time.Now().UnixNano())
		s := open(b, "redis://"+addr, cfg)
		l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 1000, Period: time.Second}
		ctx := context.Background()
		latencies(b, func(i int) error {
			_, err := sluice.Take(ctx, s, "{u"+strconv.Itoa(i%1000)+"}", l, 1)
			return err
		})
	})
	b.Run("get", func(b *testing.B) {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		ctx := context.Background()
		latencies(b, func(i int) error {
			err := c.Do(ctx, c.B().Get().Key("lat{u"+strconv.Itoa(i%1000)+"}").Build()).Error()
			if rueidis.IsRedisNil(err) {
				err = nil
			}
			return err
		})
	})
}

// latencies runs f b.N times in a row and reports the p50 and p99 in µs.
func latencies(b *testing.B, f func(i int) error) {
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := f(i); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkScript sends script calls of n GCRA Takes each from 4
// goroutines, each call waiting for the one before, over 1,000 keys (so
// that a short run also finds its keys, as BenchmarkTake does), and
// reports the Redis CPU µs per decision from INFO commandstats: the cost
// of the script alone, without the scheduling of BenchmarkTake's 64
// goroutines and batching.
func BenchmarkScript(b *testing.B) {
	addr := benchAddr(b)
	for _, n := range []int{1, 25, 100} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.KeyPrefix = fmt.Sprintf("script%d:", time.Now().UnixNano())
			// Keys outlive a slow run (under valgrind, say), so that each
			// decision finds its key as a fast run does.
			cfg.ExpiryMargin = time.Minute
			s := open(b, "redis://"+addr, cfg)
			l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 1000, Period: time.Second}
			ctx := context.Background()
			if err := s.client.Do(ctx, s.client.B().ScriptLoad().Script(takeScript).Build()).Error(); err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			calls0, usec0 := commandStats(b, s.client)
			b.SetParallelism(4 / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var blob []byte
				keys := make([]string, n)
				next := int(seq.Add(2500))
				for pb.Next() {
					for i := range keys {
						keys[i] = cfg.KeyPrefix + "{user" + strconv.Itoa(next%1000) + "}"
						next += 7919
					}
					// as a batch of Takes of one limit: one request for n keys
					var err error
					if blob, err = s.limits.appendRequest(appendGroup(blob[:0], modeWrite, n), l, 1); err != nil {
						b.Error(err)
						return
					}
					if err := s.client.Do(ctx, s.evalsha(keys, "", blob, false)).Error(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			calls1, usec1 := commandStats(b, s.client)
			if calls1 > calls0 {
				b.ReportMetric(float64(usec1-usec0)/float64(b.N*n), "redis-µs/decision")
			}
		})
	}
}
