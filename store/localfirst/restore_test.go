package localfirst

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
)

// onMemoryAndRedis runs test on the memory fake and on a real Redis, each
// with a restart that empties the store: for Redis a kill and a start
// without persistence; for the fake, the one memRestart makes (restart is
// nil there).
func onMemoryAndRedis(t *testing.T, test func(t *testing.T, url string, restart func())) {
	t.Run("memory", func(t *testing.T) { test(t, memURL, nil) })
	t.Run("redis", func(t *testing.T) {
		srv := testenv.StartRedis(t)
		test(t, "redis://"+srv.Addr+"/0", func() { srv.Kill(); srv.Restart() })
	})
}

// memRestart returns restart, or on the memory fake (url memURL) one that
// forgets what the fake of prefix holds, made now on the clock now.
func memRestart(url, prefix string, now func() time.Time, restart func()) func() {
	if url != memURL {
		return restart
	}
	m, _ := memStores.LoadOrStore(prefix, newMemStore(now))
	return func() { m.(*memStore).forget() }
}

// TestAsyncRestartEmpty fills a window limit of 1,000 an hour on 3 async
// nodes with a client at many times it, then has the store forget every
// key (a real Redis killed and started again without persistence; the
// fake's forget), and goes on: the nodes see a count below what they had
// read, decide from what they knew and put it back (RestoreCounts, merged
// by maximum), so the window admits no more than its bound across the
// restart, and the store counts the window full again. Before issue 31
// the nodes took the store's empty count at their next sync and admitted
// the limit a second time. A key no node held (one decided by the store
// alone) starts from nothing: that is the bound's other part.
func TestAsyncRestartEmpty(t *testing.T) { onMemoryAndRedis(t, testAsyncRestartEmpty) }

func testAsyncRestartEmpty(t *testing.T, url string, restart func()) {
	const interval = 100 * time.Millisecond
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	prefix := fmt.Sprintf("restart:%x:", rand.Uint64())
	restart = memRestart(url, prefix, clk.Now, restart)
	nodes := openAsyncNodes(t, url, prefix, clk.Now, 3, Config{SyncInterval: interval})
	l := sluice.Limit{Rate: 1000, Period: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	round := func() (admitted int64) {
		for i := range 90 {
			d, err := sluice.Take(ctx, nodes[i%3], "{hot}", l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		clk.Advance(interval)
		for _, s := range nodes {
			if err := s.SyncAsync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return admitted
	}
	var before int64
	for range 30 { // 2,700 requests: the window fills
		before += round()
	}
	restart()
	for _, s := range nodes { // the clients reconnect
		waitFor(t, 10*time.Second, "a sync after the restart", func() bool { return s.SyncAsync(ctx) == nil })
	}
	var after int64
	for range 30 {
		after += round()
	}
	bound := l.Rate + asyncOver(l, 3, defaultAsyncShare, interval)
	var restored uint64
	for _, s := range nodes {
		restored += s.Stats().Restored
	}
	t.Logf("admitted %d before the restart, %d after (bound %d in all); %d counts put back", before, after, bound, restored)
	if before < l.Rate {
		t.Fatalf("admitted %d before the restart: the window did not fill", before)
	}
	if before+after > bound {
		t.Fatalf("admitted %d in the window across an empty restart, more than the bound %d", before+after, bound)
	}
	if restored == 0 {
		t.Fatal("no count put back")
	}
	r := nodes[0].next
	if d, err := sluice.Take(ctx, r, "{hot}", l, 1); err != nil || d.Allowed {
		t.Fatalf("the store after the restore: %+v, %v; want the window full", d, err)
	}
}

// TestAsyncWroteBeneath: 100 hits written to the store beneath an async
// node (decide's ledger writing back what its server admitted while the
// store did not answer, through store/stack's WriteBack, which tells the
// node: Wrote) count in the node's count at once, and when the store then
// restarts empty the node puts them back with its own 21. Before, the
// node knew only what its syncs had read, put back 21, and the 100 were
// forgotten: the weather suite's restart at once on three servers
// admitted 364 of a limit of 300 (bound 318) once decide's ledger no
// longer put back async keys' counts.
func TestAsyncWroteBeneath(t *testing.T) { onMemoryAndRedis(t, testAsyncWroteBeneath) }

func testAsyncWroteBeneath(t *testing.T, url string, restart func()) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	prefix := fmt.Sprintf("wrote:%x:", rand.Uint64())
	restart = memRestart(url, prefix, clk.Now, restart)
	node := openAsyncNodes(t, url, prefix, clk.Now, 1, Config{SyncInterval: 100 * time.Millisecond})[0]
	l := sluice.Limit{Rate: 300, Period: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	take := func(want int64) {
		t.Helper()
		d, err := sluice.Take(ctx, node, "{k}", l, 1)
		if err != nil || !d.Allowed || d.Remaining != want {
			t.Fatalf("%+v, %v; want admitted, %d remaining", d, err, want)
		}
	}
	for i := range int64(20) {
		take(299 - i)
	}
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	beneath := []sluice.Request{{Key: "{k}", Limit: l, Cost: 100}}
	windows := []int64{clk.Now().Truncate(time.Hour).UnixMicro()}
	if _, _, err := node.next.(Syncer).SyncCounts(ctx, beneath, windows); err != nil {
		t.Fatal(err)
	}
	node.Wrote(beneath, windows)
	take(300 - 20 - 100 - 1)
	restart()
	waitFor(t, 10*time.Second, "a sync after the restart", func() bool { return node.SyncAsync(ctx) == nil })
	if d, err := sluice.Take(ctx, node.next, "{k}", l, 0); err != nil || d.Remaining != 300-121 {
		t.Fatalf("the store after the restore: %+v, %v; want 121 counted, %d remaining", d, err, 300-121)
	}
}

// TestLeaseRestartEmpty: a lease node admits 200 of a limit of 300 an
// hour, then the store forgets every key (a real Redis killed and started
// again without persistence; the fake's forget), and the node goes on
// asking for 400 more. Its next grant shows a count below the hits the
// node's own grants added to the window (heldCount): the store lost the
// key, and the node puts back what it knew plus what the store counted
// since, so the window admits no more than its limit across the restart.
// Before, a lease node did not notice (decide's ledger, which no longer
// takes a fall in lease answers for a loss, did): 300 more were admitted
// on the empty count.
func TestLeaseRestartEmpty(t *testing.T) { onMemoryAndRedis(t, testLeaseRestartEmpty) }

func testLeaseRestartEmpty(t *testing.T, url string, restart func()) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	prefix := fmt.Sprintf("leaserestart:%x:", rand.Uint64())
	restart = memRestart(url, prefix, clk.Now, restart)
	logs := &testenv.Logs{}
	node := openLeaseNodes(t, url, prefix, clk.Now, 1, Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))})[0]
	l := sluice.Limit{Rate: 300, Period: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	take := func(n int) (admitted int64) {
		for range n {
			d, err := sluice.Take(ctx, node, "{k}", l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
			clk.Advance(time.Millisecond)
		}
		return admitted
	}
	before := take(200)
	restart()
	waitFor(t, 10*time.Second, "the store answers after the restart", func() bool {
		_, err := sluice.Take(ctx, node.next, "{other}", l, 0)
		return err == nil
	})
	after := take(400)
	t.Logf("admitted %d before the restart, %d after; %d counts put back", before, after, node.Stats().Restored)
	if before != 200 {
		t.Fatalf("admitted %d of the first 200, under a limit of 300", before)
	}
	if before+after > l.Rate {
		t.Fatalf("admitted %d in the window across an empty restart, more than the limit %d", before+after, l.Rate)
	}
	if d, err := sluice.Take(ctx, node.next, "{k}", l, 1); err != nil || d.Allowed {
		t.Fatalf("the store after the restore: %+v, %v; want the window full", d, err)
	}
	if logs.Find("put back counts the store lost, as this server's local-first layer held them") == nil {
		t.Errorf("the put back was not logged; the log:\n%s", logs)
	}
}

// TestLeaseGivenBackNoLoss: leases another node gives back lower the
// store's count below what a node's last grant showed, never below the
// hits the node's own grants added: no loss, nothing put back. (decide's
// ledger took such a fall in a lease node's answers for a loss, and its
// put back denied clients under their limit after a host stall.)
func TestLeaseGivenBackNoLoss(t *testing.T) {
	for name, url := range contractURLs() {
		t.Run(name, func(t *testing.T) {
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
			nodes := openLeaseNodes(t, url(t), fmt.Sprintf("leasegiven:%x:", rand.Uint64()), clk.Now, 2, Config{})
			l := sluice.Limit{Rate: 1000, Period: time.Hour}
			ctx := context.Background()
			take := func(s *Store, n int) {
				for range n {
					if d, err := sluice.Take(ctx, s, "{k}", l, 1); err != nil || !d.Allowed {
						t.Fatalf("%+v, %v; want admitted, far under the limit", d, err)
					}
				}
			}
			take(nodes[0], 20) // a's leases
			take(nodes[1], 20) // b's, on top
			take(nodes[0], 60) // a's next grant shows b's lease
			clk.Advance(time.Second)
			if err := nodes[1].ReturnExpired(ctx); err != nil { // b's lease, idle, goes back
				t.Fatal(err)
			}
			if nodes[1].Stats().Returned == 0 {
				t.Fatal("b gave nothing back")
			}
			take(nodes[0], 100) // a's next grants show the count b's return lowered
			for i, s := range nodes {
				if st := s.Stats(); st.Restored != 0 {
					t.Errorf("node %d put back %d counts: a lease given back taken for a loss", i, st.Restored)
				}
			}
		})
	}
}

// TestLeaseWroteBeneath: 100 hits written to the store beneath a lease
// node (decide's ledger writing back what its server admitted while the
// store did not answer, through store/stack's WriteBack, which tells the
// node: Wrote) count among the hits the node knows the store holds of its
// own: when the store then restarts empty, the node's next grant finds the
// loss and puts them back with the rest. Without Wrote, the node put back
// only the highest count it had seen (its own 20 and its lease), and the
// 100 were forgotten.
func TestLeaseWroteBeneath(t *testing.T) { onMemoryAndRedis(t, testLeaseWroteBeneath) }

func testLeaseWroteBeneath(t *testing.T, url string, restart func()) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	prefix := fmt.Sprintf("leasewrote:%x:", rand.Uint64())
	restart = memRestart(url, prefix, clk.Now, restart)
	node := openLeaseNodes(t, url, prefix, clk.Now, 1, Config{})[0]
	l := sluice.Limit{Rate: 300, Period: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	take := func(n int) (admitted int64) {
		for range n {
			d, err := sluice.Take(ctx, node, "{k}", l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		return admitted
	}
	take(20)
	beneath := []sluice.Request{{Key: "{k}", Limit: l, Cost: 100}}
	windows := []int64{clk.Now().Truncate(time.Hour).UnixMicro()}
	if _, _, err := node.next.(Syncer).SyncCounts(ctx, beneath, windows); err != nil {
		t.Fatal(err)
	}
	node.Wrote(beneath, windows)
	restart()
	waitFor(t, 10*time.Second, "the store answers after the restart", func() bool {
		_, err := sluice.Take(ctx, node.next, "{other}", l, 0)
		return err == nil
	})
	after := take(400)
	if after > l.Rate-120 {
		t.Errorf("admitted %d after the restart, want at most %d: the 20 and the 100 written beneath counted", after, l.Rate-120)
	}
	if d, err := sluice.Take(ctx, node.next, "{k}", l, 1); err != nil || d.Allowed {
		t.Fatalf("the store after the restore: %+v, %v; want the window full", d, err)
	}
}

// TestAsyncWroteDuringSync: hits written beneath an async node (Wrote)
// after a sync of their key read the store, and before that sync landed,
// are no sign of a loss: the sync's count predates them. Counted in what
// the sync's count was checked against, they made it look lost, and the
// node put back every count it held (43-45 keys after each host stall of
// the weather suite on one server, where decide's ledger writes back
// beneath the node while its syncs are in flight), counting them twice.
// The node's decisions count them once either way.
func TestAsyncWroteDuringSync(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	m := &duringSync{memStore: newMemStore(clk.Now)}
	node, err := New(m, Config{Sync: Async, Now: clk.Now, syncByHand: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(context.Background())
	ctx := context.Background()
	l := sluice.Limit{Rate: 300, Period: time.Hour}
	for range 20 {
		if d, err := sluice.Take(ctx, node, "{k}", l, 1); err != nil || !d.Allowed {
			t.Fatalf("%+v, %v; want admitted", d, err)
		}
	}
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := sluice.Take(ctx, node, "{k}", l, 1); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v; want admitted", d, err)
	}
	beneath := []sluice.Request{{Key: "{k}", Limit: l, Cost: 100}}
	windows := []int64{clk.Now().Truncate(time.Hour).UnixMicro()}
	m.during = func() { // the sync has read the store: 100 written beneath now
		if _, _, err := m.memStore.SyncCounts(ctx, beneath, windows); err != nil {
			t.Error(err)
		}
		node.Wrote(beneath, windows)
	}
	if err := node.SyncAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := node.Stats().Restored; n != 0 {
		t.Errorf("put back %d counts: hits written beneath during a sync taken for a loss", n)
	}
	if d, err := sluice.Take(ctx, m.memStore, "{k}", l, 0); err != nil || d.Remaining != 300-121 {
		t.Errorf("the store: %+v, %v; want 121 counted, %d remaining", d, err, 300-121)
	}
	if d, err := sluice.Take(ctx, node, "{k}", l, 1); err != nil || !d.Allowed || d.Remaining > 300-122 {
		t.Errorf("the node after: %+v, %v; want admitted, the 100 counted (at most %d remaining)", d, err, 300-122)
	}
}

// duringSync is a memStore whose next SyncCounts runs during once it has
// read its counts, before the node lands them.
type duringSync struct {
	*memStore
	during func()
}

func (d *duringSync) SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error) {
	counts, at, err := d.memStore.SyncCounts(ctx, reqs, windows)
	if f := d.during; f != nil {
		d.during = nil
		f()
	}
	return counts, at, err
}
