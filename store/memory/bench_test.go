package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
)

// benchLimit is a valid limit of algorithm a that admits everything the
// benchmarks send, so that every decision updates the state.
func benchLimit(b *testing.B, a sluice.Algorithm) sluice.Limit {
	l := sluice.Limit{Algorithm: a, Rate: 1 << 30, Period: time.Second}
	if a.HasBurst() {
		l.Burst = 1 << 30
	}
	if a == sluice.GCRA {
		l.Rate = 1_000_000 // gcra: at most one hit per µs
	}
	if err := l.Validate(); err != nil {
		b.Fatal(err)
	}
	return l
}

// loopCPU runs b.Loop with f and, where the system tells a thread's CPU
// time, reports it per operation as cpu-ns/op: unlike ns/op, it does not
// count the time the thread waits for a core that other work holds, so it
// compares benchmarks fairly on a busy machine.
func loopCPU(b *testing.B, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, ok := threadCPU()
	n := 0
	for b.Loop() {
		f()
		n++
	}
	if end, ok2 := threadCPU(); ok && ok2 && n > 0 {
		b.ReportMetric(float64(end-start)/float64(n), "cpu-ns/op")
	}
}

// taker decides one request at a time with TakeAll, allocating nothing:
// the store's cost without sluice.Take's. Not safe for concurrent use.
type taker struct {
	reqs [1]sluice.Request
	ds   [1]sluice.Decision
}

// take applies a hit of l to key in s.
func (t *taker) take(ctx context.Context, s *Store, key string, l sluice.Limit) (sluice.Decision, error) {
	r := &t.reqs[0] // its other fields stay zero
	r.Key, r.Limit, r.Cost = key, l, 1
	err := s.TakeAll(ctx, t.reqs[:], t.ds[:])
	return t.ds[0], err
}

// BenchmarkOneKey measures one decision on one key from one goroutine,
// the store's clock read included, and golang.org/x/time/rate's
// Limiter.Allow, which reads the system clock, as the reference.
func BenchmarkOneKey(b *testing.B) {
	// The reference: a limiter that limits (a billion a second, so that
	// every call is allowed and updates it, as the store's benchmarks do).
	b.Run("x-time-rate", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(rate.Limit(1e9), 1<<30)
		loopCPU(b, func() {
			if !lim.Allow() {
				b.Fatal("denied")
			}
		})
	})
	// rate.Inf skips the limiter's arithmetic: what is left is the clock
	// read and the lock.
	b.Run("x-time-rate-inf", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(rate.Inf, 1)
		loopCPU(b, func() { lim.Allow() })
	})
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
		b.Run(a.String(), func(b *testing.B) {
			b.ReportAllocs()
			s := newStore(b, DefaultConfig())
			ctx := context.Background()
			l := benchLimit(b, a)
			reqs := []sluice.Request{{Key: "user:123456", Limit: l, Cost: 1}}
			ds := make([]sluice.Decision, 1)
			loopCPU(b, func() {
				if err := s.TakeAll(ctx, reqs, ds); err != nil || !ds[0].Allowed {
					b.Fatal(ds[0], err)
				}
			})
		})
	}
}

// BenchmarkTakeAll measures a batch of two limits of one client, as
// decide sends for a descriptor with two rate limits.
func BenchmarkTakeAll(b *testing.B) {
	b.ReportAllocs()
	s := newStore(b, DefaultConfig())
	ctx := context.Background()
	reqs := []sluice.Request{
		{Key: "user:123456:second", Limit: benchLimit(b, sluice.TokenBucket), Cost: 1},
		{Key: "user:123456:hour", Limit: benchLimit(b, sluice.FixedWindow), Cost: 1},
	}
	ds := make([]sluice.Decision, len(reqs))
	for b.Loop() {
		if err := s.TakeAll(ctx, reqs, ds); err != nil {
			b.Fatal(err)
		}
	}
}

// benchKeys returns n keys like "user:123456".
func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%06d", i)
	}
	return keys
}

// runParallelCPU runs body in b.RunParallel's goroutines, each locked to
// its thread, and reports the threads' CPU time per operation as
// cpu-ns/op. body gets its goroutine's number, from 1, and returns how many
// operations it did. A store that scales does as much work per operation
// with -cpu 2 as with -cpu 1: on a machine with cores to spare, its
// throughput doubles. Unlike ns/op, cpu-ns/op tells this on a machine whose
// cores other work keeps busy (though it does not count time parked on a
// contended lock).
func runParallelCPU(b *testing.B, body func(w uint64, pb *testing.PB) int) {
	var cpu, ops atomic.Int64
	var worker atomic.Uint64
	var unknown atomic.Bool
	b.RunParallel(func(pb *testing.PB) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		start, ok1 := threadCPU()
		n := body(worker.Add(1), pb)
		end, ok2 := threadCPU()
		if !ok1 || !ok2 {
			unknown.Store(true)
		}
		cpu.Add(int64(end - start))
		ops.Add(int64(n))
	})
	if !unknown.Load() && ops.Load() > 0 {
		b.ReportMetric(float64(cpu.Load())/float64(ops.Load()), "cpu-ns/op")
	}
}

// BenchmarkParallel10kKeys measures decisions on 10,000 keys from
// GOMAXPROCS goroutines; compare -cpu 1 and -cpu 2 for how it scales.
//
// The baseline hashes the same keys in the same goroutines, with no store
// and nothing shared: how much parallelism the machine gives at the time.
// On a machine that other work keeps busy, the store's speedup from -cpu 1
// to -cpu 2 in ns/op is only meaningful next to the baseline's.
func BenchmarkParallel10kKeys(b *testing.B) {
	keys := benchKeys(10_000)
	b.Run("baseline", func(b *testing.B) {
		seed := maphash.MakeSeed()
		var total atomic.Uint64
		runParallelCPU(b, func(w uint64, pb *testing.PB) int {
			i, stride := w*7919, 2*w+1
			var sum uint64
			n := 0
			for pb.Next() {
				i += stride
				for range 8 { // about as long as a decision
					sum += maphash.String(seed, keys[i%uint64(len(keys))])
				}
				n++
			}
			total.Add(sum)
			return n
		})
	})
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.TokenBucket, sluice.GCRA} {
		b.Run(a.String(), func(b *testing.B) {
			b.ReportAllocs()
			s := newStore(b, DefaultConfig())
			ctx := context.Background()
			l := benchLimit(b, a)
			for _, k := range keys {
				if _, err := sluice.Take(ctx, s, k, l, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			runParallelCPU(b, func(w uint64, pb *testing.PB) int {
				// Each goroutine walks the keys with its own stride and start.
				i, stride := w*7919, 2*w+1
				n := 0
				var one taker
				for pb.Next() {
					i += stride
					if _, err := one.take(ctx, s, keys[i%uint64(len(keys))], l); err != nil {
						b.Error(err)
						return n
					}
					n++
				}
				return n
			})
		})
	}
}

// BenchmarkMillionKeys fills a store with 1,000,000 keys like
// "user:123456" and reports the heap it holds per key (B/key, after a
// garbage collection), then measures decisions on random keys of it.
func BenchmarkMillionKeys(b *testing.B) {
	const n = 1_000_000
	keys := benchKeys(n)
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.TokenBucket, sluice.GCRA, sluice.SlidingWindow} {
		b.Run(a.String(), func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			l := benchLimit(b, a)
			now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			cfg := DefaultConfig()
			cfg.MaxBytes = 1 << 30 // room for all: measure keys, not eviction
			cfg.Now = func() time.Time { return now }

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s := newStore(b, cfg)
			for _, k := range keys {
				if _, err := sluice.Take(ctx, s, k, l, 1); err != nil {
					b.Fatal(err)
				}
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			if got := entries(b, s); got != n {
				b.Fatalf("%d entries, want %d", got, n)
			}
			perKey := float64(after.HeapAlloc-before.HeapAlloc) / n

			i := uint64(0)
			var one taker
			b.ResetTimer()
			for b.Loop() {
				i += 7919
				if d, err := one.take(ctx, s, keys[i%n], l); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
			b.ReportMetric(perKey, "B/key") // after the loop, which resets metrics
		})
	}
}
