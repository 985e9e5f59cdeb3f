package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
)

// accounted returns the bytes the store accounts for and the most it may.
func accounted(s *Store) (bytes, most int64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		bytes += sh.bytes
		most += sh.maxBytes
		sh.mu.Unlock()
	}
	return bytes, most
}

// liveHeap returns the heap in use after a collection.
func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestLargeKeysStayWithinBytes sends keys from a few bytes to 1 MiB, under
// every algorithm, sliding_log logs growing too, and checks that the store
// never accounts for more than its budget, that a 1 MiB key costs 1 MiB of
// it, and that the heap it holds (measured by the runtime) is what it
// accounts for, within 10% and a page per shard.
func TestLargeKeysStayWithinBytes(t *testing.T) {
	const maxBytes = 64 << 20
	c := clocktest.New(t0)
	before := liveHeap()
	s := newStore(t, Config{MaxBytes: maxBytes, Shards: 4, Now: c.Now})
	ctx := context.Background()
	_, most := accounted(s)
	if want := liveBytes(maxBytes); most > want || most < want-4 {
		t.Fatalf("the store may hold %d bytes of live data, want %d", most, want)
	}

	// One 1 MiB key costs 1 MiB.
	big := strings.Repeat("k", 1<<20)
	l := sluice.Limit{Rate: 5, Period: time.Hour}
	b0, _ := accounted(s)
	if _, err := sluice.Take(ctx, s, big, l, 1); err != nil {
		t.Fatal(err)
	}
	if b1, _ := accounted(s); b1-b0 < 1<<20 {
		t.Fatalf("a 1 MiB key costs %d bytes of the budget", b1-b0)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{8, 40, 300, 4 << 10, 64 << 10, 1 << 20}
	algs := []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog, sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA}
	sent := int64(0)
	for i := range 20000 {
		n := sizes[rng.IntN(len(sizes))]
		if n >= 64<<10 && rng.IntN(8) != 0 {
			n = 40 // fewer huge keys, so that many keys of every size meet
		}
		key := fmt.Sprintf("%0*d", n, i)
		a := algs[rng.IntN(len(algs))]
		l := sluice.Limit{Algorithm: a, Rate: 1000, Period: time.Hour}
		if err := s.TakeAll(ctx, []sluice.Request{{Key: key, Limit: l, Cost: 1}}, make([]sluice.Decision, 1)); err != nil {
			t.Fatal(err)
		}
		sent += int64(n)
		// A few sliding_log keys whose logs keep growing.
		for k := range 4 {
			lk := fmt.Sprintf("log:%d", k)
			ll := sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 1 << 20, Period: time.Hour}
			if _, err := sluice.Take(ctx, s, lk, ll, 1); err != nil {
				t.Fatal(err)
			}
		}
		c.Advance(time.Millisecond)
		if i%2000 == 0 {
			entries(t, s) // checks the accounting and the budget, shard by shard
		}
	}
	n := entries(t, s)
	got, _ := accounted(s)
	heap := liveHeap() - before
	t.Logf("sent %d MiB of keys; the store holds %d keys, accounts for %.1f MiB of %.1f MiB; the heap grew by %.1f MiB",
		sent>>20, n, float64(got)/(1<<20), float64(most)/(1<<20), float64(heap)/(1<<20))
	if sent < 4*maxBytes {
		t.Fatalf("sent only %d bytes of keys: the test does not fill the store", sent)
	}
	if got < most*3/4 {
		t.Fatalf("the store holds %d bytes of %d: it evicts far too much", got, most)
	}
	if tol := got/10 + 4*pageBytes; heap > got+tol || heap < got-tol {
		t.Fatalf("the heap grew by %d bytes, the store accounts for %d", heap, got)
	}
	runtime.KeepAlive(s)
}

// TestKeyLargerThanShard checks that a key too large for a shard is not
// kept, decides as a fresh key, and evicts nothing.
func TestKeyLargerThanShard(t *testing.T) {
	c := clocktest.New(t0)
	s := newStore(t, Config{MaxBytes: 1 << 20, Shards: 2, Now: c.Now})
	ctx := context.Background()
	l := sluice.Limit{Rate: 1, Period: time.Hour}
	for i := range 100 {
		if _, err := sluice.Take(ctx, s, fmt.Sprintf("small:%d", i), l, 1); err != nil {
			t.Fatal(err)
		}
	}
	huge := strings.Repeat("h", 1<<20)
	for range 3 {
		d, err := sluice.Take(ctx, s, huge, l, 1)
		if err != nil || !d.Allowed {
			t.Fatalf("a key too large to keep: %+v, %v; want a fresh key's decision", d, err)
		}
	}
	if s.holds(huge) {
		t.Fatal("the store keeps a key larger than a shard's budget")
	}
	if n := entries(t, s); n != 100 {
		t.Fatalf("%d keys held after a key too large to keep, want the 100 before it", n)
	}
}

// TestBudgetFollowsGOGC checks that the live data a byte budget allows
// follows the collector's setting: 7/8 of MaxBytes ÷ (1 + GOGC/100).
func TestBudgetFollowsGOGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		gogc int
		want int64 // of 64 MiB
	}{
		{100, 64 << 20 * 7 / 16},
		{50, 64 << 20 * 7 / 8 * 100 / 150},
		{300, 64 << 20 * 7 / 32},
	} {
		debug.SetGCPercent(tc.gogc)
		s := newStore(t, Config{MaxBytes: 64 << 20, Shards: 4, Now: time.Now})
		if _, most := accounted(s); most > tc.want || most < tc.want-4 {
			t.Errorf("GOGC=%d: the store may hold %d bytes of live data, want %d", tc.gogc, most, tc.want)
		}
	}
}
