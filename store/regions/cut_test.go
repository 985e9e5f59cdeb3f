package regions

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// run advances the clock by 100ms steps for d; at each, every node not in
// paused (region indices) runs a round and asks for the key at cost 0 (so
// that it stays in use), and each node of hot sends `per` requests; it adds
// what each region admitted to got.
func run(w *world, got []int64, d time.Duration, hot []int, paused []int, per int) {
	key, l := "k", perMinute
	isPaused := func(a int) bool {
		for _, p := range paused {
			if p == a {
				return true
			}
		}
		return false
	}
	for end := w.clock.Now().Add(d); w.clock.Now().Before(end); {
		w.clock.Advance(100 * time.Millisecond)
		for a, ns := range w.nodes {
			if isPaused(a) {
				continue
			}
			for _, n := range ns {
				n.Sync(ctxBG)
			}
		}
		for a, ns := range w.nodes {
			if isPaused(a) {
				continue
			}
			for n := range ns {
				w.take(a, n, key, l, 0) // the key stays in use, read every round
			}
		}
		for _, a := range hot {
			for n := range w.nodes[a] {
				for range per {
					if w.take(a, n, key, l, 1).Allowed {
						got[a]++
					}
				}
			}
		}
	}
}

// warm runs a few rounds everywhere so that every node is live, echoed,
// not at a window's edge, and has read key "k" from every region.
func warm(w *world) {
	w.clock.Advance(time.Second)
	for a, ns := range w.nodes {
		for n := range ns {
			w.take(a, n, "k", perMinute, 0)
		}
	}
	for range 3 {
		w.sync()
	}
}

func checkBound(t *testing.T, got []int64, l sluice.Limit, k int64) {
	t.Helper()
	total, b := sum(got), bound(l, int64(len(got)), k)
	t.Logf("admitted %v = %d, bound %d", got, total, b)
	if total > b {
		t.Errorf("admitted %d, more than the bound %d", total, b)
	}
}

// TestAsymmetricCut: region 0 cannot read region 1, which still reads
// region 0. Region 1 learns from region 0's record, which no longer
// echoes it, that it is cut off, and holds to its share; region 0,
// charging region 1 its share, takes the rest. Without the echo, region 1
// would fill the window while region 0 charged it only its share.
func TestAsymmetricCut(t *testing.T) {
	const k = 100
	w := newWorld(t, 2, 1, func(c *Config) { c.Share = k })
	warm(w)
	w.links[0][1].cut.Store(true)
	got := make([]int64, 2)
	run(w, got, 30*time.Second, []int{1}, nil, 50)
	if st := w.nodes[1][0].Status(); !st.Cut || st.Peers[0].State != Unechoed {
		t.Errorf("region 1 does not know it is cut off: %+v", st)
	}
	run(w, got, 25*time.Second, []int{0}, nil, 50)
	checkBound(t, got, perMinute, k)
}

// TestNonTransitiveCut: regions 0 and 2 cannot reach each other; region 1
// reaches both. Each of 0 and 2 charges the other its share and holds to
// its own: without the latter, each would take what the other's share
// leaves.
func TestNonTransitiveCut(t *testing.T) {
	const k = 100
	w := newWorld(t, 3, 1, func(c *Config) { c.Share = k })
	warm(w)
	w.links[0][2].cut.Store(true)
	w.links[2][0].cut.Store(true)
	got := make([]int64, 3)
	run(w, got, 55*time.Second, []int{0, 2}, nil, 50)
	checkBound(t, got, perMinute, k)
	rho := ceilDiv(perMinute.Rate, 3)
	for _, a := range []int{0, 2} {
		if got[a] > rho {
			t.Errorf("region %d, cut off, admitted %d, more than its share %d", a, got[a], rho)
		}
	}
}

// TestPausedNodeCannotTrustOldCounts: region 0's only node stops for 5s,
// long enough that its record expires and region 1 counts it dead (taking
// no share) while region 1 fills the window. When region 0 comes back
// unable to read region 1, what it last knew of region 1 no longer bounds
// it: it charges region 1 the whole limit.
func TestPausedNodeCannotTrustOldCounts(t *testing.T) {
	const k = 10
	w := newWorld(t, 2, 1, func(c *Config) { c.Share = k })
	warm(w)
	got := make([]int64, 2)
	run(w, got, 5*time.Second, []int{1}, []int{0}, 50)
	if st := w.nodes[1][0].Status(); st.Peers[0].State != Dead {
		t.Fatalf("region 1 sees region 0 %v, want dead", st.Peers[0].State)
	}
	w.links[0][1].cut.Store(true)
	run(w, got, 20*time.Second, []int{0}, nil, 50)
	checkBound(t, got, perMinute, k)
}

// TestNewNodeDuringCut: a node that starts while it cannot read a peer
// has never known the peer's counts: it charges it the whole limit.
func TestNewNodeDuringCut(t *testing.T) {
	const k = 10
	w := newWorld(t, 2, 1, func(c *Config) { c.Share = k })
	warm(w)
	got := make([]int64, 2)
	run(w, got, 10*time.Second, []int{1}, nil, 50)
	w.links[0][1].cut.Store(true)
	w.nodes[0] = append(w.nodes[0], w.node(0, 1, func(c *Config) { c.Share = k }))
	w.nodes[0] = w.nodes[0][1:] // the old node stops
	run(w, got, 20*time.Second, []int{0}, nil, 50)
	checkBound(t, got, perMinute, k)
}

// TestSlopWhileEchoLags: region 0's nodes stop for longer than region 1
// waits for their echo (EchoRounds, here 10 rounds) but not long enough for
// their records to expire; region 1, which keeps reading them, grants
// until the echo is that late, then holds. Region 0 comes back cut off
// from region 1: it charges region 1 its last count known plus the grants
// it may have made unseen.
func TestSlopWhileEchoLags(t *testing.T) {
	const k = 10
	tune := func(c *Config) { c.Share, c.EchoRounds, c.NodeLife = k, 10, 10*time.Second }
	w := newWorld(t, 2, 2, tune)
	warm(w)
	got := make([]int64, 2)
	run(w, got, 1800*time.Millisecond, []int{1}, nil, 50)
	run(w, got, 1500*time.Millisecond, []int{1}, []int{0}, 50)
	w.cutOff(0, true)
	run(w, got, 50*time.Second, []int{0}, nil, 50)
	checkBound(t, got, perMinute, k)
}

// TestPartitionHeal: three regions of two nodes hammer one key of 1,000 a
// minute; region 0 is cut off from the others from 10s to 30s into the
// window. The bound holds throughout; while cut off, region 0 admits no
// more than its share, or what it had; one round after the heal every
// node's view of every region's count is the count.
func TestPartitionHeal(t *testing.T) {
	w := newWorld(t, 3, 2, nil)
	w.clock.Advance(time.Millisecond)
	got := make([]int64, 3)
	all := []int{0, 1, 2}
	run(w, got, 10*time.Second, all, nil, 3)
	w.cutOff(0, true)
	atCut := got[0]
	run(w, got, 20*time.Second, all, nil, 3)
	rho := ceilDiv(perMinute.Rate, 3)
	if got[0] > max(atCut, rho) {
		t.Errorf("cut off, region 0 went from %d to %d, past its share %d", atCut, got[0], rho)
	}
	for a := range w.nodes {
		if st := w.nodes[a][0].Status(); !st.Cut {
			t.Errorf("region %d does not know of the cut: %+v", a, st)
		}
	}
	w.cutOff(0, false)
	w.sync()
	for a := range w.nodes {
		for n := range w.nodes[a] {
			u, ok := w.nodes[a][n].Usage("k")
			if !ok {
				t.Fatalf("region %d node %d has no usage", a, n)
			}
			for _, ru := range u.Regions {
				if want := got[regionIndex(t, ru.Region)]; ru.Count != want {
					t.Errorf("after the heal, region %d node %d sees %s at %d, want %d", a, n, ru.Region, ru.Count, want)
				}
			}
		}
	}
	run(w, got, 29*time.Second, all, nil, 3)
	checkBound(t, got, perMinute, defaultShare)
}

func regionIndex(t *testing.T, name string) int {
	for a := range 10 {
		if regionName(a) == name {
			return a
		}
	}
	t.Fatalf("no region %q", name)
	return -1
}

// TestStaleKeyCountNotTrusted: region 0 stops asking for the key, so its
// rounds stop reading it, while region 1 keeps filling the window; then
// the two are cut off. What region 0 read of the key before its last
// round that reached region 1 no longer bounds region 1: until the window
// ends, region 0 charges it the whole limit.
func TestStaleKeyCountNotTrusted(t *testing.T) {
	const k = 10
	tune := func(c *Config) { c.Share, c.EchoRounds, c.CapLife = k, 2, 5*time.Second }
	w := newWorld(t, 2, 1, tune)
	warm(w)
	got := make([]int64, 2)
	run(w, got, time.Second, []int{0, 1}, nil, 50)
	for range 80 { // region 0 idle: rounds run, the key is not asked for, so not read
		w.clock.Advance(100 * time.Millisecond)
		w.sync()
		for range 50 {
			if w.take(1, 0, "k", perMinute, 1).Allowed {
				got[1]++
			}
		}
	}
	w.cutOff(0, true)
	run(w, got, 40*time.Second, []int{0}, nil, 50)
	checkBound(t, got, perMinute, k)
}

// TestCutAtStart: two regions start unable to read each other (both
// ways, or one way: region 0 cannot read region 1, which reads region 0).
// A node that never read a peer charges it the whole limit in the window
// it started in, then its share in each window that begins after its
// record was on its board: each region's nodes hold to ρ, so a deploy
// during a partition decides within the bound, and fills each region's
// share from the next window on.
func TestCutAtStart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		oneWay bool
	}{{"both ways", false}, {"one way", true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, 2, 2, nil)
			w.links[0][1].cut.Store(true)
			if !tc.oneWay {
				w.links[1][0].cut.Store(true)
			}
			w.clock.Advance(time.Second) // into the minute of t0
			first := make([]int64, 2)
			run(w, first, 10*time.Second, []int{0, 1}, nil, 20)
			if unseen := perMinute.Rate / (2 * defaultShare); first[0] > unseen {
				t.Errorf("in the window it started in, region 0 admitted %d: want at most a key's first share, %d", first[0], unseen)
			}
			for a, ns := range w.nodes {
				if st := ns[0].Status(); !st.Cut || st.Peers[0].Err == nil && st.Peers[0].State == Live {
					t.Errorf("region %d: %+v, want cut off, naming the peer", a, st)
				}
			}
			run(w, first, t0.Add(time.Minute+time.Millisecond).Sub(w.clock.Now()), nil, nil, 0) // rounds, no demand
			next := make([]int64, 2)
			run(w, next, 30*time.Second, []int{0, 1}, nil, 20)
			checkBound(t, next, perMinute, defaultShare)
			rho := ceilDiv(perMinute.Rate, 2)
			if next[0] < rho*9/10 || next[0] > rho || next[1] > rho {
				t.Errorf("in the next window the regions admitted %v: want region 0 near its share %d, none past it", next, rho)
			}
		})
	}
}

// liar is a peer's site whose counts are what lie makes of them: a
// peer's Redis that holds counts no honest region could reach.
type liar struct {
	Site
	lie func(int64) int64
}

func (l liar) Read(ctx context.Context, reqs []sluice.Request, carried []bool) (Reading, error) {
	r, err := l.Site.Read(ctx, reqs, carried)
	for i := range r.Counts {
		r.Counts[i] = l.lie(r.Counts[i])
	}
	return r, err
}

// TestHostileCounts: region 1's Redis, as region 0 reads it, holds a
// negative sliding_window count (−5,000: before, region 0 admitted 3,000 of 1,000) or one
// past the limit. Counts read are clamped to [0, L]: a negative one
// costs region 0 nothing beyond the limit, one past it only fills the
// view (the peer claims the limit, as it could honestly).
func TestHostileCounts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lie      func(int64) int64
		min, max int64 // what region 0 admits alone
	}{
		{"negative", func(int64) int64 { return -5000 }, 900, perMinute.Rate},
		{"past the limit", func(int64) int64 { return 1 << 40 }, 0, perMinute.Rate / (2 * defaultShare)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, 2, 1, nil)
			w.nodes[0][0].Close()
			w.nodes[0] = nil
			s, err := New(w.sites[0], Config{Region: regionName(0), Node: "r0-0", Home: w.links[0][0], SyncInterval: -1,
				Now: w.clock.Now, Peers: []Peer{{Name: regionName(1), Site: liar{w.links[0][1], tc.lie}}}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			w.nodes[0] = []*Store{s}
			l := perMinute
			l.Algorithm = sluice.SlidingWindow
			w.clock.Advance(time.Second)
			var got int64
			for range 500 { // 50 s of rounds, 50 requests a round
				w.clock.Advance(100 * time.Millisecond)
				w.sync()
				for range 50 {
					if w.take(0, 0, "k", l, 1).Allowed {
						got++
					}
				}
			}
			if got < tc.min || got > tc.max {
				t.Errorf("region 0 admitted %d alone: want %d to %d", got, tc.min, tc.max)
			}
			if u, _ := s.Usage("k"); u.Regions[1].Count < 0 || u.Regions[1].Count > perMinute.Rate {
				t.Errorf("region 1's count is seen as %d", u.Regions[1].Count)
			}
		})
	}
}

// TestEmptyRestart: region 0's Redis restarts empty (a new incarnation)
// after its key idled for 5 s, longer than a key unasked stays in the
// table (2.4 s). What region 0's node and region 1's knew of region 0's
// count in the window is kept until the window ends, and added to what
// the new incarnation counts, so the bound holds: before, the node had
// forgotten the key and admitted its limit again (1,758 of 1,000 measured
// on Redis).
func TestEmptyRestart(t *testing.T) {
	for _, spread := range []bool{false, true} {
		t.Run(map[bool]string{false: "one region busy", true: "spread"}[spread], func(t *testing.T) {
			w := newWorld(t, 2, 1, nil)
			warm(w)
			got := make([]int64, 2)
			hot := []int{0}
			if spread {
				hot = []int{0, 1}
			}
			run(w, got, 20*time.Second, hot, nil, 20)
			for range 50 { // 5 s: rounds, nobody asks for the key
				w.clock.Advance(100 * time.Millisecond)
				w.sync()
			}
			w.sites[0].restart()
			run(w, got, 30*time.Second, hot, nil, 20)
			checkBound(t, got, perMinute, defaultShare)
		})
	}
}

// TestEmptyRestartUnread: region 0 alone uses a key for 20 s (with two
// nodes a region, its first node alone), the key idles 5 s, region 0's
// Redis restarts empty, then every node of both regions sends for 30 s.
// Region 1, and region 0's second node, never read the key before the
// restart, so only region 0's first node knew what region 0 had
// admitted: it carries that into the new incarnation, where every node
// reads it beside the counts. Before, they saw region 0's count start
// from nothing and admitted the limit again (2,000 of 1,000).
func TestEmptyRestartUnread(t *testing.T) {
	for _, nodes := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d nodes a region", nodes), func(t *testing.T) {
			w := newWorld(t, 2, nodes, nil)
			w.clock.Advance(time.Second)
			w.sync()
			got := make([]int64, 2)
			runOnly(w, got, 20*time.Second, []int{0}, nil, 1)
			runOnly(w, got, 5*time.Second, nil, nil, 0) // rounds, nobody asks for the key
			w.sites[0].restart()
			runOnly(w, got, 30*time.Second, []int{0, 1}, nil, nodes)
			checkBound(t, got, perMinute, defaultShare)
		})
	}
}

// TestEmptyRestartBeforeCarry: as TestEmptyRestartUnread, but region 0's
// node runs no round for 1 s after its Redis restarted empty, while
// region 1 sends: region 1 finds region 0's board gone, then a record
// that has not carried yet, and charges region 0 the whole limit until
// it has. Without that, it took the emptied count for region 0's and
// admitted its room every round until region 0's node carried.
func TestEmptyRestartBeforeCarry(t *testing.T) {
	w := newWorld(t, 2, 1, nil)
	w.clock.Advance(time.Second)
	w.sync()
	got := make([]int64, 2)
	runOnly(w, got, 20*time.Second, []int{0}, nil, 1)
	runOnly(w, got, 5*time.Second, nil, nil, 0)
	w.sites[0].restart()
	runOnly(w, got, time.Second, []int{1}, []int{0}, 1)
	if st := w.nodes[1][0].Status(); !st.Peers[0].Unsettled {
		t.Errorf("region 1's status: region 0 not unsettled while its Redis came back empty and nothing was carried: %+v", st.Peers[0])
	}
	runOnly(w, got, 30*time.Second, []int{0, 1}, nil, 1)
	checkBound(t, got, perMinute, defaultShare)
	if st := w.nodes[1][0].Status(); st.Peers[0].Unsettled {
		t.Errorf("region 1's status: region 0 still unsettled after its node carried: %+v", st.Peers[0])
	}
	if st := w.nodes[0][0].Status(); st.Unsettled {
		t.Errorf("region 0's status: its own Redis still unsettled after it carried")
	}
}

// TestEmptyRestartHomeUnsettled: region 0 has two servers; its Redis
// restarts empty, then server 1 runs a round (its beat still names the
// incarnation it carried into before, and it carries into the new one),
// then server 0 does: its reading of its own Redis finds server 1 not
// carried yet, and its status says so until server 1's record says it
// has.
func TestEmptyRestartHomeUnsettled(t *testing.T) {
	w := newWorld(t, 2, 2, nil)
	warm(w)
	got := make([]int64, 2)
	runOnly(w, got, 5*time.Second, []int{0}, nil, 2)
	w.sites[0].restart()
	sync := func(n int) {
		t.Helper()
		w.clock.Advance(100 * time.Millisecond)
		if err := w.nodes[0][n].Sync(ctxBG); err != nil {
			t.Fatal(err)
		}
	}
	sync(1)
	sync(0)
	if st := w.nodes[0][0].Status(); !st.Unsettled {
		t.Errorf("server 0's status: its own Redis not unsettled while server 1 had not carried into it")
	}
	for i := 0; w.nodes[0][0].Status().Unsettled; i++ {
		if i == 10 {
			t.Fatalf("server 0's status: its own Redis still unsettled 10 rounds of each server after the restart")
		}
		sync(1)
		sync(0)
	}
}

// TestCarriedAskedBeforeBirthOnly: a read asks what was carried of a key
// only while the key's window may have begun before the site's
// incarnation was born (no bytes for it otherwise). Three regions; in a
// window that began after their boards were born, region 0 alone uses a
// key, it idles, regions 1 and 2 stop their rounds, region 0's Redis
// restarts empty and its node runs two rounds (it carries, and its record
// says so), then regions 1 and 2, which never read the key, ask for it:
// their first reading of region 0 did not ask what was carried (they last
// read the incarnation before), and is of a newer one, so they charge
// region 0 the whole limit for the key, and ask the next round. Without
// that charge, each took the emptied count for region 0's for a round:
// 1,143 of 1,000 (bound 1,098).
func TestCarriedAskedBeforeBirthOnly(t *testing.T) {
	w := newWorld(t, 3, 1, nil)
	w.clock.Advance(time.Second)
	w.sync()                          // the boards are born
	w.clock.Advance(60 * time.Second) // the next minute, which began after
	got := make([]int64, 3)
	runOnly(w, got, 20*time.Second, []int{0}, nil, 1)
	for _, site := range w.sites {
		if n := site.asked.Load(); n != 0 {
			t.Errorf("%d carried counts asked for in a window that began after the boards were born", n)
		}
	}
	runOnly(w, got, 5*time.Second, nil, []int{1, 2}, 0)
	w.sites[0].restart()
	runOnly(w, got, 200*time.Millisecond, nil, []int{1, 2}, 0)
	for end := w.clock.Now().Add(30 * time.Second); w.clock.Now().Before(end); {
		for a := range 3 {
			for range 100 {
				if w.take(a, 0, "k", perMinute, 1).Allowed {
					got[a]++
				}
			}
		}
		w.clock.Advance(100 * time.Millisecond)
		w.sync()
	}
	if w.sites[0].asked.Load() == 0 {
		t.Error("no carried count asked for after region 0's Redis restarted")
	}
	checkBound(t, got, perMinute, defaultShare)
}

// runOnly advances the clock by 100ms steps for d; at each, every node of
// a region not in paused runs a round, and the first senders nodes of
// each region in hot send 20 requests for key "k" (the others never ask
// for it); it adds what each region admitted to got.
func runOnly(w *world, got []int64, d time.Duration, hot, paused []int, senders int) {
	for end := w.clock.Now().Add(d); w.clock.Now().Before(end); {
		w.clock.Advance(100 * time.Millisecond)
		for a, ns := range w.nodes {
			if !slices.Contains(paused, a) {
				for _, n := range ns {
					n.Sync(ctxBG)
				}
			}
		}
		for _, a := range hot {
			for n := range senders {
				for range 20 {
					if w.take(a, n, "k", perMinute, 1).Allowed {
						got[a]++
					}
				}
			}
		}
	}
}
