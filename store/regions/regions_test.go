package regions

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
)

// TestMain checks that no goroutine outlives the tests: every Store's
// rounds stop at Close. rueidis ends one of its own a moment after its
// client closes (a refresh after an error waits up to a second first).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

// perMinute is the limit of the tests: 1,000 a minute, as the issue's.
var ctxBG = context.Background()

var perMinute = sluice.Limit{Rate: 1000, Period: time.Minute}

// bound returns what the package doc says R regions admit in a window of
// l at most: L − 1 + R × max(⌊L / (R × k)⌋, 1).
func bound(l sluice.Limit, regions, k int64) int64 {
	return l.Rate - 1 + regions*share(l.Rate, regions, k)
}

// hammer sends every node of w `per` requests every step of the clock for
// d, running a round on every node every interval, and returns what each
// region admitted.
func hammer(w *world, key string, l sluice.Limit, d, step, interval time.Duration, per int) []int64 {
	got := make([]int64, len(w.nodes))
	end := w.clock.Now().Add(d)
	for next := w.clock.Now(); w.clock.Now().Before(end); w.clock.Advance(step) {
		if !w.clock.Now().Before(next) {
			w.sync()
			next = next.Add(interval)
		}
		for a, ns := range w.nodes {
			for n := range ns {
				for range per {
					if w.take(a, n, key, l, 1).Allowed {
						got[a]++
					}
				}
			}
		}
	}
	return got
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// TestHammerFixedWindow: three regions of two nodes hammer one global key
// of 1,000 a minute for the whole minute; together they admit within the
// bound, and fill it.
func TestHammerFixedWindow(t *testing.T) {
	w := newWorld(t, 3, 2, nil)
	got := hammer(w, "client", perMinute, time.Minute, 10*time.Millisecond, 100*time.Millisecond, 3)
	total, b := sum(got), bound(perMinute, 3, defaultShare)
	t.Logf("admitted %v = %d; bound %d, each region alone %d", got, total, b, 3*perMinute.Rate)
	if total > b {
		t.Errorf("admitted %d, more than the bound %d", total, b)
	}
	if total < perMinute.Rate-perMinute.Rate/20 {
		t.Errorf("admitted %d, less than 95%% of %d", total, perMinute.Rate)
	}
}

// TestScopeRegion: a request of scope region passes through untouched:
// each region admits its limit.
func TestScopeRegion(t *testing.T) {
	w := newWorld(t, 3, 2, nil)
	w.scope = sluice.RegionScope
	got := hammer(w, "client", perMinute, 30*time.Second, 10*time.Millisecond, 100*time.Millisecond, 3)
	for a, n := range got {
		if n != perMinute.Rate {
			t.Errorf("region %d admitted %d, want its limit %d", a, n, perMinute.Rate)
		}
	}
}

// TestUnseenKey: a key no round has capped yet is decided against the
// share one round would give: a region that admitted more waits for its
// first round, and is told to retry when it lands.
func TestUnseenKey(t *testing.T) {
	w := newWorld(t, 3, 2, nil)
	w.clock.Advance(time.Second) // not at a window's edge, where no cap holds
	alpha := share(perMinute.Rate, 3, defaultShare)
	var n int64
	for w.take(0, 0, "k", perMinute, 1).Allowed {
		n++
	}
	if n != alpha {
		t.Fatalf("a key never capped admitted %d, want %d", n, alpha)
	}
	// the other node of the region has no cap either: the region's count is past the share
	if d := w.take(0, 1, "k", perMinute, 1); d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
		t.Fatalf("second node: %+v, want a denial until the next round", d)
	}
	// The first round finds the other regions' boards empty (not yet
	// beaten): cut off from them, it gives nothing; the second reads them.
	w.sync()
	w.sync()
	if d := w.take(0, 1, "k", perMinute, 1); !d.Allowed || d.Limit != perMinute.Rate {
		t.Fatalf("after a round: %+v, want allowed with Limit %d", d, perMinute.Rate)
	}
}

// TestCostOverLimit: a cost above the limit is never admitted.
func TestCostOverLimit(t *testing.T) {
	w := newWorld(t, 2, 1, nil)
	w.sync()
	if d := w.take(0, 0, "k", perMinute, perMinute.Rate+1); d.Allowed || d.RetryAfter != sluice.Never {
		t.Fatalf("cost over the limit: %+v", d)
	}
}

// TestFullWindowRetry: once the regions together used the window, a
// denial says to retry when the window ends, not at the next round.
func TestFullWindowRetry(t *testing.T) {
	w := newWorld(t, 2, 1, nil)
	l := sluice.Limit{Rate: 10, Period: time.Minute}
	for range 50 {
		w.clock.Advance(100 * time.Millisecond)
		w.sync()
		w.take(0, 0, "k", l, 1)
		w.take(1, 0, "k", l, 1)
	}
	for w.clock.Now().Before(t0.Add(10 * time.Second)) {
		w.clock.Advance(100 * time.Millisecond)
		w.sync()
		w.take(0, 0, "k", l, 0) // keeps the key in use
	}
	d := w.take(0, 0, "k", l, 1)
	if d.Allowed || d.RetryAfter != 50*time.Second {
		t.Fatalf("in a full window 10s in: %+v, want denied until the window ends in 50s", d)
	}
	u, ok := w.nodes[0][0].Usage("k")
	if !ok || !u.Full || u.Regions[0].Count+u.Regions[1].Count < l.Rate {
		t.Fatalf("usage %+v, %v", u, ok)
	}
}

// TestReadsCountNothing: a round only reads; rounds repeated with no
// traffic, or a reading used twice, leave every count as it was.
func TestReadsCountNothing(t *testing.T) {
	w := newWorld(t, 3, 1, nil)
	hammer(w, "k", perMinute, 5*time.Second, 10*time.Millisecond, 100*time.Millisecond, 1)
	w.sync()
	before, _ := w.nodes[1][0].Usage("k")
	for range 20 {
		w.sync()
	}
	after, _ := w.nodes[1][0].Usage("k")
	for i := range before.Regions {
		if before.Regions[i] != after.Regions[i] {
			t.Fatalf("counts moved with no traffic: %v then %v", before.Regions, after.Regions)
		}
	}
	if before.Cap != after.Cap {
		t.Fatalf("cap moved with no traffic: %d then %d", before.Cap, after.Cap)
	}
}

// TestHammerBuckets: a global token_bucket or gcra of 1,000 a minute,
// burst 1,000, hammered for two minutes in three regions: each region's
// own bucket shapes its requests, and the regions together admit within
// the bound in each window of their count (1,000 per minute: capacity ×
// period / rate).
func TestHammerBuckets(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.TokenBucket, sluice.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			l := sluice.Limit{Algorithm: alg, Rate: 1000, Period: time.Minute, Burst: 1000}
			w := newWorld(t, 3, 2, nil)
			b := bound(sluice.Limit{Rate: l.Capacity(), Period: time.Minute}, 3, defaultShare)
			var total int64
			for win := range 2 {
				got := hammer(w, "client", l, time.Minute, 10*time.Millisecond, 100*time.Millisecond, 3)
				t.Logf("window %d: admitted %v = %d; bound %d", win, got, sum(got), b)
				if sum(got) > b {
					t.Errorf("window %d: admitted %d, more than the bound %d", win, sum(got), b)
				}
				total += sum(got)
			}
			if u, ok := w.nodes[0][0].Usage("client"); !ok || len(u.Regions) != 3 {
				t.Errorf("usage of a global bucket: %+v, %v", u, ok)
			}
			if total < 2*l.Capacity()*9/10 {
				t.Errorf("admitted %d in two minutes, less than 90%% of the limit's", total)
			}
		})
	}
}

// TestDecidesAndVeto: the layer decides the requests of scope global of
// the limits it keeps one of; its own veto refuses a bucket whose count
// across regions the store below cannot keep, and needs that store's veto.
func TestDecidesAndVeto(t *testing.T) {
	for _, tc := range []struct {
		r    sluice.Request
		want bool
	}{
		{sluice.Request{Limit: perMinute, Scope: sluice.GlobalScope}, true},
		{sluice.Request{Limit: perMinute}, false},
		{sluice.Request{Limit: sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 1, Period: time.Second}, Scope: sluice.GlobalScope}, false},
		{sluice.Request{Limit: sluice.Limit{Algorithm: sluice.GCRA, Rate: 1, Period: time.Second}, Scope: sluice.GlobalScope}, true},
	} {
		if got := Decides(tc.r); got != tc.want {
			t.Errorf("Decides(%v %v) = %v", tc.r.Limit, tc.r.Scope, got)
		}
	}
	long := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Period: time.Hour, Burst: 1_000_000}
	var checked sluice.Limit
	check := func(l sluice.Limit) error {
		checked = l
		if l.Period > time.Duration(1<<51)*time.Microsecond {
			return sluice.ErrLimit
		}
		return nil
	}
	if err := CheckLimit(long, check); !errors.Is(err, sluice.ErrLimit) || checked.Algorithm != sluice.FixedWindow || checked.Rate != 1_000_000 {
		t.Errorf("veto of %v: %v, having checked %v", long, err, checked)
	}
	if err := CheckLimit(perMinute, check); err != nil {
		t.Errorf("veto of a window: %v", err)
	}
}

// TestGlobalRemaining: an admitted request of a global limit says the
// global room as the region sees it (the limit less what the round
// counted for every region, this one's count now included), not the
// region's room this round; /v1/keys's figures (Usage) say what was
// charged for each region and the cap.
func TestGlobalRemaining(t *testing.T) {
	w := newWorld(t, 2, 1, nil)
	warm(w)
	for range 10 {
		w.take(1, 0, "k", perMinute, 1)
	}
	w.sync()
	d := w.take(0, 0, "k", perMinute, 1)
	if !d.Allowed || d.Remaining != perMinute.Rate-10-1 {
		t.Errorf("remaining %d (allowed %v): want %d, the global room", d.Remaining, d.Allowed, perMinute.Rate-10-1)
	}
	u, ok := w.nodes[0][0].Usage("k")
	if !ok || u.Regions[1].Count != 10 || u.Regions[1].Charged != 10 || u.Cap <= 0 {
		t.Errorf("usage %+v", u)
	}
	w.cutOff(0, true)
	w.sync()
	u, _ = w.nodes[0][0].Usage("k")
	if u.Regions[1].Count != 10 || u.Regions[1].Charged <= 10 {
		t.Errorf("cut off, usage %+v: want region 1 charged more than its count", u)
	}
}

// TestFixedCapOutlivesCapLife: a fixed_window's cap holds past CapLife,
// for 2 × (MaxPeerTimeout + SyncInterval), so that rounds that wait for a
// lagging peer leave no gap between its caps; a sliding_window's expires
// after CapLife, and its key is decided as a key never seen.
func TestFixedCapOutlivesCapLife(t *testing.T) {
	w := newWorld(t, 2, 1, func(c *Config) { c.MaxPeerTimeout = 2 * time.Second })
	sliding := sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: perMinute.Rate, Period: time.Minute}
	w.clock.Advance(time.Second)
	w.take(0, 0, "fixed", perMinute, 0)
	w.take(0, 0, "sliding", sliding, 0)
	for range 3 {
		w.sync()
	}
	n := w.nodes[0][0]
	unseen := func() uint64 { return n.Status().Unseen }
	before := unseen()
	w.clock.Advance(n.cfg.CapLife + 100*time.Millisecond) // past CapLife (1.2s), within 4s
	if d := w.take(0, 0, "fixed", perMinute, 1); !d.Allowed || unseen() != before {
		t.Errorf("fixed_window after CapLife: %+v, %d decisions without a cap, want its cap (%d)", d, unseen(), before)
	}
	w.take(0, 0, "sliding", sliding, 1)
	if unseen() != before+1 {
		t.Errorf("sliding_window after CapLife: %d decisions without a cap, want %d", unseen(), before+1)
	}
	w.clock.Advance(2*w.nodes[0][0].cfg.MaxPeerTimeout + time.Second) // past 2 × (MaxPeerTimeout + SyncInterval)
	w.take(0, 0, "fixed", perMinute, 1)
	if unseen() != before+2 {
		t.Errorf("fixed_window after 2 × MaxPeerTimeout: %d decisions without a cap, want %d", unseen(), before+2)
	}
}

// TestHomeFailureDropsCaps: a round whose home read fails drops the
// server's caps, since the Redis may come back empty and a cap is on the
// count it held: after the restart, until a round caps the key, it is
// decided as a key never seen less what the last round counted of the
// region's own in the window, here nothing: not under its cap from before
// (which admitted the whole limit again), nor as a key never seen (a
// key's first share of the emptied count, 50 more).
func TestHomeFailureDropsCaps(t *testing.T) {
	w := newWorld(t, 2, 1, nil)
	warm(w)
	got := make([]int64, 2)
	run(w, got, 20*time.Second, []int{0}, nil, 50)
	if got[0] != perMinute.Rate {
		t.Fatalf("region 0 admitted %d, want the limit %d", got[0], perMinute.Rate)
	}
	home := w.links[0][0]
	home.cut.Store(true)
	if err := w.nodes[0][0].Sync(ctxBG); err == nil {
		t.Fatal("a round with its home cut off: no error")
	}
	w.sites[0].restart()
	home.cut.Store(false)
	var after int64
	for w.take(0, 0, "k", perMinute, 1).Allowed {
		after++
	}
	if after > 0 {
		t.Errorf("after the empty restart, before a round: %d more admitted, want none", after)
	}
}

// TestRestartSeenDropsCaps: a Redis that restarted empty between two of a
// server's home reads, none failing, is found by the next home read (a
// board gone, or a new incarnation): the caps on the count it held are
// dropped there, before the round's peers are read and its caps land, so
// the key at 1,000 of 1,000 admits none meanwhile. Before, it admitted
// the whole limit again under its old cap until the round ended.
func TestRestartSeenDropsCaps(t *testing.T) {
	w := newWorld(t, 2, 1, nil)
	warm(w)
	got := make([]int64, 2)
	run(w, got, 20*time.Second, []int{0}, nil, 50)
	if got[0] != perMinute.Rate {
		t.Fatalf("region 0 admitted %d, want the limit %d", got[0], perMinute.Rate)
	}
	w.sites[0].restart()
	s := w.nodes[0][0]
	s.roundMu.Lock()
	p, err := s.begin(ctxBG)
	if err != nil {
		s.roundMu.Unlock()
		t.Fatal(err)
	}
	var during int64
	for range 2000 {
		if w.take(0, 0, "k", perMinute, 1).Allowed {
			during++
		}
	}
	if err := s.finish(ctxBG, p); err != nil {
		t.Error(err)
	}
	s.roundMu.Unlock()
	if during > 0 {
		t.Errorf("after the empty restart, between the round's home read and its end: %d more admitted, want none", during)
	}
}
