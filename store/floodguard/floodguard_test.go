package floodguard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/store/floodguard"
	"github.com/sluicehq/sluice/store/memory"
)

var t0 = time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)

func newMemory(t testing.TB, clk *clocktest.Clock, cfg memory.Config) *memory.Store {
	t.Helper()
	cfg.Now = clk.Now
	m, err := memory.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

var perMinute = sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Minute}

// TestBound plays random traffic of 3,000 keys for 30 minutes through a
// guard that rotates often (every 200 keys, at most once a minute): in
// every minute window each key is admitted at most 5 + ceil(1m/1m) + 1 = 7
// times, the stated bound, and the guard did rotate and leave requests
// uncounted.
func TestBound(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(t0)
	g, err := floodguard.New(newMemory(t, clk, memory.Config{}), floodguard.Config{Capacity: 200, Interval: time.Minute, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	admitted := map[string]map[int64]int{}
	over := 0
	for range 200_000 {
		clk.Advance(time.Duration(rng.IntN(18000)) * time.Microsecond) // 30 minutes in all
		// Hot keys come often, most keys rarely: a Zipf draw.
		key := fmt.Sprintf("k%d", int(rng.ExpFloat64()*300)%3000)
		ds := make([]sluice.Decision, 1)
		if err := g.TakeAll(context.Background(), []sluice.Request{{Key: key, Limit: perMinute, Cost: 1}}, ds); err != nil {
			t.Fatal(err)
		}
		if !ds[0].Allowed {
			continue
		}
		w := clk.Now().Unix() / 60
		if admitted[key] == nil {
			admitted[key] = map[int64]int{}
		}
		admitted[key][w]++
		if n := admitted[key][w]; n > 7 {
			t.Fatalf("%s admitted %d times in minute %d, bound 7", key, n, w)
		} else if n > 5 {
			over++
		}
	}
	st := g.Stats()
	t.Logf("minutes %v, rotations %d, uncounted %d, windows over the limit %d", clk.Now().Sub(t0), st.Rotations, st.Uncounted, over)
	if st.Rotations < 10 || st.Uncounted == 0 {
		t.Errorf("stats %+v: the test did not exercise rotations", st)
	}
}

// TestKnownKeysCounted: a key seen at least once an Interval is counted
// exactly from its second request on, however many rotations there are.
func TestKnownKeysCounted(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(t0)
	g, err := floodguard.New(newMemory(t, clk, memory.Config{}), floodguard.Config{Capacity: 10, Interval: time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	take := func(key string) sluice.Decision {
		d, err := sluice.Take(context.Background(), g, key, perMinute, 1)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	admitted := 0
	for i := range 200 { // 50 s, in one minute window
		clk.Advance(250 * time.Millisecond)
		take(fmt.Sprintf("flood-%d", i)) // a rotation every 10 keys, 2.5 s
		if i%4 == 0 {                    // alice every second, the Interval
			if take("alice").Allowed {
				admitted++
			}
		}
	}
	if admitted != 6 {
		t.Errorf("alice admitted %d times in a minute of 5, want 6: her first uncounted, the rest counted", admitted)
	}
	// Alice once and each flood key once, less the flood keys a filter's
	// false positive sent to the store (1% of them, about 2).
	if st := g.Stats(); st.Rotations < 5 || st.Uncounted > 201 || st.Uncounted < 190 {
		t.Errorf("stats %+v: want rotations and 190 to 201 uncounted", st)
	}
}

// TestTakeAll: a new key's request is answered as its first and not
// counted, a key's second request goes to the store, a new key given twice
// goes to the store at once, and a denial elsewhere means nothing passes.
func TestTakeAll(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(t0)
	mem := newMemory(t, clk, memory.Config{})
	g, err := floodguard.New(mem, floodguard.Config{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	one := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Minute}
	ds := make([]sluice.Decision, 2)
	take := func(reqs ...sluice.Request) []sluice.Decision {
		t.Helper()
		if err := g.TakeAll(context.Background(), reqs, ds); err != nil {
			t.Fatal(err)
		}
		return ds[:len(reqs)]
	}
	if d := take(sluice.Request{Key: "a", Limit: one, Cost: 1}); !d[0].Allowed {
		t.Fatal("a's first request denied")
	}
	if keys, _ := mem.Usage(); keys != 0 {
		t.Fatalf("the store holds %d keys after a new key's request, want 0", keys)
	}
	take(sluice.Request{Key: "a", Limit: one, Cost: 1}) // counted: 1 of 1
	if d := take(sluice.Request{Key: "a", Limit: one, Cost: 1}); d[0].Allowed {
		t.Error("a's third request allowed, want denied (its second was counted)")
	}
	if d := take(sluice.Request{Key: "b", Limit: one, Cost: 1}, sluice.Request{Key: "b", Limit: one, Cost: 1}); !d[0].Allowed || d[1].Allowed {
		t.Errorf("new key twice: %+v, want the second to see the first", d)
	}
	before := g.Stats().Uncounted
	if d := take(sluice.Request{Key: "c", Limit: one, Cost: 1}, sluice.Request{Key: "a", Limit: one, Cost: 1}); d[1].Allowed {
		t.Errorf("%+v: a is over its limit", d)
	}
	if g.Stats().Uncounted != before {
		t.Error("a denied request counted as an uncounted admission")
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(t0)
	mem := newMemory(t, clk, memory.Config{})
	for _, cfg := range []floodguard.Config{{Capacity: -1}, {Capacity: floodguard.MaxCapacity + 1}, {FalsePositive: 0.6}, {FalsePositive: -1}, {Interval: -time.Second}} {
		if _, err := floodguard.New(mem, cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	g, err := floodguard.New(mem, floodguard.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if b := g.Bytes(); b != 4<<20 {
		t.Errorf("default filters %d bytes, want 4 MiB", b)
	}
}

// randomIPv6 returns n distinct-enough random IPv6 addresses' strings,
// made as they are needed.
func randomIPv6(rng *rand.Rand) string {
	var a [16]byte
	for i := range a {
		a[i] = byte(rng.Uint32())
	}
	return netip.AddrFrom16(a).String()
}

// BenchmarkFlood sends 10 million distinct random IPv6 clients (one request
// each, 100,000 a second on the clock) and 1,000 real clients (each every
// 100 ms) under a limit of 100,000 an hour (so no entry expires) through
// the memory store with --max-memory 64 MiB, with and without the guard
// (its defaults but Interval 1 s), and reports the store's keys and bytes,
// the guard's bytes, the heap after a GC, and how many real clients the
// store still counts. Run it once:
//
//	go test ./store/floodguard -run XXX -bench Flood -benchtime 1x
func BenchmarkFlood(b *testing.B) {
	for _, guard := range []bool{false, true} {
		b.Run(fmt.Sprintf("guard=%v", guard), func(b *testing.B) {
			for b.Loop() {
				clk := clocktest.New(t0)
				mem := newMemory(b, clk, memory.Config{MaxBytes: 64 << 20})
				var st sluice.Store = mem
				var g *floodguard.Store
				if guard {
					var err error
					if g, err = floodguard.New(mem, floodguard.Config{Interval: time.Second, Now: clk.Now}); err != nil {
						b.Fatal(err)
					}
					st = g
				}
				rng := rand.New(rand.NewPCG(5, 6))
				ctx := context.Background()
				l := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 100_000, Period: time.Hour}
				for i := range 10_000_000 {
					clk.Advance(10 * time.Microsecond)
					if _, err := sluice.Take(ctx, st, randomIPv6(rng), l, 1); err != nil {
						b.Fatal(err)
					}
					if i%10 == 0 { // a real client every 100 µs: each of 1,000 every 100 ms
						if _, err := sluice.Take(ctx, st, fmt.Sprintf("real-%d", i/10%1000), l, 1); err != nil {
							b.Fatal(err)
						}
					}
				}
				kept := 0 // real clients whose count the store still has
				for i := range 1000 {
					d, err := sluice.Take(ctx, st, fmt.Sprintf("real-%d", i), l, 0)
					if err != nil {
						b.Fatal(err)
					}
					if d.Remaining < l.Rate {
						kept++
					}
				}
				b.ReportMetric(float64(kept), "real-kept")
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				keys, bytes := mem.Usage()
				b.ReportMetric(float64(keys), "store-keys")
				b.ReportMetric(float64(bytes)/(1<<20), "store-MiB")
				b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
				if g != nil {
					b.ReportMetric(float64(g.Bytes())/(1<<20), "guard-MiB")
					b.ReportMetric(float64(g.Stats().Rotations), "rotations")
				}
			}
		})
	}
}
