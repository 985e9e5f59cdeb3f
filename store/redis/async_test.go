package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestSyncCounts writes back hits admitted without Redis, on real Redis
// and Redis Cluster: they count as a Take's hits do, in the window they
// were admitted in, a sliding window's previous one weighted; hits of a
// window past are dropped; a bucket is refused.
func TestSyncCounts(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			clk := clocktest.New(t0)
			s := open(t, b.url(t), testConfig(clk.Now))
			ctx := context.Background()
			fixed := sluice.Limit{Rate: 10, Period: time.Minute}
			sliding := sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Minute}
			w := t0.Truncate(time.Minute).UnixMicro()
			sync := func(want int64, r sluice.Request, window int64) {
				t.Helper()
				got, now, err := s.SyncCounts(ctx, []sluice.Request{r}, []int64{window})
				if err != nil {
					t.Fatal(err)
				}
				if got[0] != want || now != clk.Now().UnixMicro() {
					t.Fatalf("SyncCounts(%+v) = %d at %d, want %d at %d", r, got[0], now, want, clk.Now().UnixMicro())
				}
			}
			if d, err := sluice.Take(ctx, s, "{f}", fixed, 2); err != nil || !d.Allowed {
				t.Fatalf("%+v, %v", d, err)
			}
			sync(7, sluice.Request{Key: "{f}", Limit: fixed, Cost: 5}, w)
			if d, err := sluice.Take(ctx, s, "{f}", fixed, 0); err != nil || d.Remaining != 3 {
				t.Fatalf("a Take after 2 taken and 5 written back: %+v, %v; want 3 remaining", d, err)
			}
			sync(7, sluice.Request{Key: "{f}", Limit: fixed}, w)
			sync(4, sluice.Request{Key: "{s}", Limit: sliding, Cost: 4}, w)
			clk.Set(t0.Add(time.Minute)) // 30 s into the next window: the previous weighs half
			sync(2, sluice.Request{Key: "{s}", Limit: sliding}, w)
			sync(5, sluice.Request{Key: "{s}", Limit: sliding, Cost: 6}, w) // (4+6)/2
			sync(0, sluice.Request{Key: "{f}", Limit: fixed, Cost: 3}, w)   // a window past
			sync(6, sluice.Request{Key: "{s}", Limit: sliding, Cost: 1}, w+60e6)
			if _, _, err := s.SyncCounts(ctx, []sluice.Request{{Key: "{b}", Limit: sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 1, Period: time.Second}}}, []int64{w}); err == nil {
				t.Fatal("a sliding_log limit: no error")
			}
		})
	}
}

// TestSyncCountsBuckets writes back hits of the bucket limits admitted
// without Redis, on real Redis and Redis Cluster: they are debited at the
// script's time past the capacity too (a debt), the level comes back in
// sluice.Limit.Level's units, and a Take then denies until the debt has
// drained, when its RetryAfter said.
func TestSyncCountsBuckets(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			clk := clocktest.New(t0)
			s := open(t, b.url(t), testConfig(clk.Now))
			ctx := context.Background()
			for i, l := range []sluice.Limit{
				{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Second, Burst: 30},
				{Algorithm: sluice.LeakyBucket, Rate: 6, Period: time.Minute},
				{Algorithm: sluice.GCRA, Rate: 3, Period: time.Second, Burst: 5},
			} {
				key := fmt.Sprintf("{bucket%d}", i)
				bk, _ := l.Bucket()
				var model sluice.State
				now := clk.Now().UnixMicro()
				if d, err := sluice.Take(ctx, s, key, l, 2); err != nil || !d.Allowed {
					t.Fatalf("%v: %+v, %v", l, d, err)
				}
				l.TakeMicros(&model, now, 2)
				clk.Advance(100 * time.Millisecond)
				now = clk.Now().UnixMicro()
				c := l.Capacity() + 3 // past the capacity: a debt
				l.Debit(&model, now, c)
				got, at, err := s.SyncCounts(ctx, []sluice.Request{{Key: key, Limit: l, Cost: c}}, []int64{0})
				if err != nil {
					t.Fatal(err)
				}
				if want := l.Level(model, now); got[0] != want || at != now || want <= bk.Full {
					t.Fatalf("%v: SyncCounts = %d at %d, want %d (a debt: above %d) at %d", l, got[0], at, want, bk.Full, now)
				}
				d, err := sluice.Take(ctx, s, key, l, 1)
				if err != nil || d.Allowed || d != l.TakeMicros(&model, now, 1) {
					t.Fatalf("%v: a Take in debt: %+v, %v; want %+v", l, d, err, l.TakeMicros(&model, now, 1))
				}
				clk.Advance(d.RetryAfter - time.Microsecond)
				if got, _, err := s.SyncCounts(ctx, []sluice.Request{{Key: key, Limit: l}}, []int64{0}); err != nil || got[0]+bk.Hit <= bk.Full {
					t.Fatalf("%v: 1µs before the retry time the level is %d, %v: room for a hit", l, got[0], err)
				}
				clk.Advance(time.Microsecond)
				if d, err := sluice.Take(ctx, s, key, l, 1); err != nil || !d.Allowed {
					t.Fatalf("%v: at the retry time: %+v, %v", l, d, err)
				}
			}
		})
	}
}

// TestSyncCountsOneRoundTrip: SyncCounts and ReturnLeases call their
// script by its SHA1, without SCRIPT LOAD (which rueidis's ExecMulti sent
// before every call, with the script's text: a second round trip, across
// the WAN for store/regions), and a Redis that forgot the script gets it
// with EVAL. On a Redis of its own, whose INFO commandstats no other test
// moves.
func TestSyncCountsOneRoundTrip(t *testing.T) {
	rs := testenv.StartRedis(t)
	clk := clocktest.New(t0)
	s := open(t, "redis://"+rs.Addr+"/0", testConfig(clk.Now))
	c := s.Client()
	ctx := context.Background()
	l := sluice.Limit{Rate: 10, Period: time.Minute}
	w := t0.Truncate(time.Minute).UnixMicro()
	calls := func(cmd string) string {
		info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":"); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
				return calls
			}
		}
		return "0"
	}
	loads := calls("script|load") // Open's, of take.lua
	for want := range int64(3) {
		got, _, err := s.SyncCounts(ctx, []sluice.Request{{Key: "k", Limit: l, Cost: 1}}, []int64{w})
		if err != nil || got[0] != want+1 {
			t.Fatalf("SyncCounts: %v, %v; want a count of %d", got, err, want+1)
		}
	}
	if n, err := s.ReturnLeases(ctx, []sluice.Request{{Key: "k", Limit: l, Cost: 1}}, []sluice.State{sluice.StateOf(w, 0, 0)}); err != nil || n != 1 {
		t.Fatalf("ReturnLeases: %d, %v; want 1 given back", n, err)
	}
	if got := calls("script|load"); got != loads {
		t.Errorf("SCRIPT LOAD calls went from %s to %s", loads, got)
	}
	if got := calls("evalsha"); got != "4" {
		t.Errorf("EVALSHA calls: %s, want 4", got)
	}
	evals := calls("eval")
	if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.SyncCounts(ctx, []sluice.Request{{Key: "k", Limit: l, Cost: 1}}, []int64{w})
	if err != nil || got[0] != 3 {
		t.Fatalf("SyncCounts after SCRIPT FLUSH: %v, %v; want a count of 3", got, err)
	}
	if got := calls("eval"); got == evals {
		t.Errorf("EVAL calls after SCRIPT FLUSH: %s, as before", got)
	}
}

// TestRestoreCounts puts back counts on real Redis and Redis Cluster, as
// servers that knew them do after Redis restarted empty: a count below
// what a server knew is raised to it, in the window it was of (a
// sliding_window's previous one too); a count at or above it stays, so
// that servers that each put back the same count leave it once; a window
// past is ignored; a bucket limit is refused.
func TestRestoreCounts(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			clk := clocktest.New(t0)
			s := open(t, b.url(t), testConfig(clk.Now))
			ctx := context.Background()
			fixed := sluice.Limit{Rate: 10, Period: time.Minute}
			sliding := sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Minute}
			w := t0.Truncate(time.Minute).UnixMicro()
			restore := func(r sluice.Request, window int64) {
				t.Helper()
				if _, err := s.RestoreCounts(ctx, []sluice.Request{r}, []int64{window}); err != nil {
					t.Fatal(err)
				}
			}
			remaining := func(key string, l sluice.Limit, want int64) {
				t.Helper()
				if d, err := sluice.Take(ctx, s, key, l, 0); err != nil || d.Remaining != want {
					t.Fatalf("%s: %+v, %v; want %d remaining", key, d, err, want)
				}
			}
			restore(sluice.Request{Key: "{f}", Limit: fixed, Cost: 6}, w) // lost: from nothing
			remaining("{f}", fixed, 4)
			restore(sluice.Request{Key: "{f}", Limit: fixed, Cost: 6}, w) // a second server knew the same
			remaining("{f}", fixed, 4)
			restore(sluice.Request{Key: "{f}", Limit: fixed, Cost: 3}, w) // one that knew less
			remaining("{f}", fixed, 4)
			if d, err := sluice.Take(ctx, s, "{f}", fixed, 2); err != nil || !d.Allowed || d.Remaining != 2 {
				t.Fatalf("a Take after the restore: %+v, %v", d, err)
			}
			restore(sluice.Request{Key: "{f}", Limit: fixed, Cost: 7}, w) // 8 counted: stays
			remaining("{f}", fixed, 2)
			restore(sluice.Request{Key: "{s}", Limit: sliding, Cost: 4}, w)
			clk.Set(t0.Add(time.Minute)) // 30 s into the next window: the previous weighs half
			remaining("{s}", sliding, 8)
			restore(sluice.Request{Key: "{s}", Limit: sliding, Cost: 8}, w) // the previous window's
			restore(sluice.Request{Key: "{s}", Limit: sliding, Cost: 1}, w+60e6)
			remaining("{s}", sliding, 10-1-4)
			restore(sluice.Request{Key: "{f}", Limit: fixed, Cost: 9}, w) // a window past
			remaining("{f}", fixed, 10)
			bucket := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Period: time.Second, Burst: 5}
			if _, err := s.RestoreCounts(ctx, []sluice.Request{{Key: "{b}", Limit: bucket, Cost: 1}}, []int64{w}); err == nil {
				t.Fatal("a bucket limit: no error")
			}
		})
	}
}
