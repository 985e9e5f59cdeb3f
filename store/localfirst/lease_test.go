package localfirst

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/storetest"
)

// leaseBound is lease mode's stated bound for nodes nodes of cfg: never
// more than the limit; fewer by at most every node's largest lease.
func leaseBound(cfg Config) storetest.Bound {
	ls := newLeases(1, cmp.Or(cfg.LeaseLifetime, defaultLeaseLifetime), cmp.Or(cfg.MaxLease, defaultMaxLease))
	return storetest.Bound{
		Under: func(l sluice.Limit, nodes int) int64 {
			if !redis.CanLease(l) {
				return 0
			}
			return int64(nodes) * ls.most(l)
		},
	}
}

// openLeaseNodes returns n lease-mode Stores, each over a Redis store of
// its own on url sharing prefix, deciding by now; closed (leases
// returned) when the test ends.
func openLeaseNodes(t *testing.T, url, prefix string, now func() time.Time, n int, cfg Config) []*Store {
	t.Helper()
	cfg.Sync = Lease
	return openNodes(t, url, prefix, now, n, cfg)
}

// TestLeaseContract runs the store suite's contract tier on lease mode
// over Redis and Redis Cluster, 1 and 3 nodes, with the bound lease mode
// states: at most the limit, at least the limit minus the nodes' leases.
func TestLeaseContract(t *testing.T) {
	for name, url := range contractURLs() {
		t.Run(name, func(t *testing.T) {
			u := url(t)
			storetest.RunContract(t, func(t *testing.T, now func() time.Time, n int) []sluice.Store {
				prefix := fmt.Sprintf("localfirsttest:%x:", rand.Uint64())
				var out []sluice.Store
				for _, s := range openLeaseNodes(t, u, prefix, now, n, Config{}) {
					out = append(out, s)
				}
				return out
			}, leaseBound(Config{}))
		})
	}
}

// abandon stops s as a node that dies does: its leases are not returned.
func abandon(s *Store) {
	s.once.Do(func() {
		close(s.stop)
		<-s.done
	})
}

// TestLeaseOverhead checks that what a lease entry is counted as costing
// covers the entry, its pointer and a map slot (it was counted as 256
// bytes while the entry alone took 288, then 360).
func TestLeaseOverhead(t *testing.T) {
	slot := unsafe.Sizeof("") + unsafe.Sizeof(&leaseEntry{}) + 8 // the key's header, the pointer, hash and padding
	if need := unsafe.Sizeof(leaseEntry{}) + unsafe.Sizeof(&leaseEntry{}) + slot; leaseOverhead < need {
		t.Fatalf("leaseOverhead %d, but an entry takes %d with its pointer and map slot", leaseOverhead, need)
	}
}

// windowOf returns the start of the window of l that holds now, µs, or 0
// for a bucket limit: what outstanding takes.
func windowOf(l sluice.Limit, now time.Time) int64 {
	if l.Algorithm.HasBurst() {
		return 0
	}
	return now.UnixMicro() - now.UnixMicro()%l.Period.Microseconds()
}

// outstanding returns the unused hits of s's leases of key taken in the
// window that starts at window (0 for a bucket's).
func outstanding(s *Store, key string, window int64) int64 {
	var n int64
	for i := range s.leases.shards {
		sh := &s.leases.shards[i]
		sh.mu.Lock()
		if e := sh.m[key]; e != nil && e.granted > 0 && e.window == window {
			n += e.left
		}
		sh.mu.Unlock()
	}
	return n
}

// FuzzLeases drives three lease-mode nodes on one Redis, one key, with
// interleavings of requests, clock steps past and within lease lifetimes,
// sweeps that return ended leases, and nodes that die holding leases, and
// checks them against the quota: a fixed window of 160 hits admits at
// most 160 in any window, and once the live nodes have returned their
// leases, what was admitted in the window, what the dead nodes still hold
// and what the store has left add up to exactly 160.
func FuzzLeases(f *testing.F) {
	f.Add([]byte{0, 8, 16, 0, 8, 16, 0, 0, 0, 4, 0, 5, 7, 0, 8, 6, 0, 16})
	f.Add([]byte{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6, 1, 1})
	f.Add([]byte{0, 9, 18, 27, 36, 45, 54, 63, 4, 12, 20, 28, 5, 13, 21, 15, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 252, 2, 2, 2, 2, 2, 2, 2, 7, 2, 2})
	url := "redis://" + testenv.RedisAddr(f) + "/0"
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC))
	rc := redis.DefaultConfig()
	rc.KeyPrefix, rc.Now, rc.ExpiryMargin = fmt.Sprintf("localfirstfuzz:%x:", rand.Uint64()), clk.Now, 10*time.Minute
	// Bounds on a hang only: the defaults (1s) failed handshakes and calls
	// on a loaded machine.
	rc.DialTimeout, rc.Timeout = 10*time.Second, 10*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var backs [4]*redis.Store // three nodes' and the referee's
	for i := range backs {
		r, err := redis.Open(ctx, url, rc)
		if err != nil {
			f.Fatal(err)
		}
		defer r.Close()
		backs[i] = r
	}
	l := sluice.Limit{Rate: 160, Period: 2 * time.Second}
	p := l.Period.Microseconds()
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 400 {
			ops = ops[:400]
		}
		key := fmt.Sprintf("k%x", rand.Uint64())
		clk.Advance(time.Hour) // a fresh key at a fresh time
		cfg := Config{Sync: Lease, Now: clk.Now}
		var nodes [3]*Store
		for i := range nodes {
			nodes[i] = newStore(t, backs[i], cfg)
		}
		defer func() {
			for _, s := range nodes {
				s.Close(context.Background())
			}
		}()
		admitted := map[int64]int64{} // by window start
		lost := map[int64]int64{}     // what dead nodes held, by window start
		for _, b := range ops {
			node := int(b/8) % 3
			now := clk.Now().UnixMicro()
			w := now - now%p
			switch b % 8 {
			case 0, 1, 2, 3:
				cost := 1 + int64(b%2)*int64(b/24%3)
				d, err := sluice.Take(context.Background(), nodes[node], key, l, cost)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted[w] += cost
					if admitted[w] > l.Rate {
						t.Fatalf("window %d admitted %d, more than %d", w, admitted[w], l.Rate)
					}
				}
			case 4:
				clk.Advance(time.Duration(b/8) * 10 * time.Millisecond)
			case 5:
				if err := nodes[node].ReturnExpired(context.Background()); err != nil {
					t.Fatal(err)
				}
			case 6:
				clk.Advance(defaultLeaseLifetime + time.Millisecond)
			case 7: // the node dies with its leases; a new one takes its place
				abandon(nodes[node])
				lost[w] += outstanding(nodes[node], key, w)
				nodes[node] = newStore(t, backs[node], cfg)
			}
		}
		for _, s := range nodes {
			if err := s.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		now := clk.Now().UnixMicro()
		w := now - now%p
		d, err := sluice.Take(context.Background(), backs[3], key, l, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := admitted[w] + lost[w] + d.Remaining; got != l.Rate {
			t.Fatalf("window %d: admitted %d + held by dead nodes %d + left in the store %d = %d, want %d",
				w, admitted[w], lost[w], d.Remaining, got, l.Rate)
		}
	})
}

// TestLeaseHotKey runs 3 nodes, 16 goroutines each, on one hot key at one
// instant, of a sliding window and of each bucket limit: at most the
// limit, at least the limit minus the stated bound, and few store calls
// per decision.
func TestLeaseHotKey(t *testing.T) {
	for name, url := range contractURLs() {
		for _, a := range []sluice.Algorithm{sluice.SlidingWindow, sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
			t.Run(name+"/"+a.String(), func(t *testing.T) {
				testLeaseHotKey(t, url(t), sluice.Limit{Algorithm: a, Rate: 10000, Period: time.Hour})
			})
		}
	}
}

func testLeaseHotKey(t *testing.T, url string, l sluice.Limit) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	nodes := openLeaseNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{})
	const goroutines, each = 48, 300
	var admitted atomic.Int64
	errs := make(chan error, goroutines)
	for g := range goroutines {
		go func() {
			for range each {
				d, err := sluice.Take(context.Background(), nodes[g%3], "{hot}", l, 1)
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
			errs <- nil
		}()
	}
	for range goroutines {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var calls uint64
	for _, s := range nodes {
		calls += s.Stats().StoreCalls
	}
	under := leaseBound(Config{}).Under(l, 3)
	n := admitted.Load()
	t.Logf("admitted %d of %d (bound %d), %d store calls: %.4f per decision", n, goroutines*each, under, calls, float64(calls)/(goroutines*each))
	if n > l.Rate || n < l.Rate-under {
		t.Fatalf("admitted %d, want %d at most and %d at least", n, l.Rate, l.Rate-under)
	}
	if calls > goroutines*each/20 {
		t.Fatalf("%d store calls for %d decisions: more than 0.05 per decision", calls, goroutines*each)
	}
}

// TestLeaseRedisDies kills Redis while a node holds a lease: the node
// admits what its lease has left, without Redis, then fails every request
// (for decide's --fail to answer) until Redis is back; after a restart,
// which forgot every count, it decides from Redis again, and its old
// lease's return does no harm; for a fixed window and for gcra (whose
// leased hits are all due later than the instant the test stays at).
func TestLeaseRedisDies(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			testLeaseRedisDies(t, sluice.Limit{Algorithm: a, Rate: 1600, Period: time.Hour}) // leases up to 50 hits
		})
	}
}

func testLeaseRedisDies(t *testing.T, l sluice.Limit) {
	srv := testenv.StartRedis(t)
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	node := openLeaseNodes(t, "redis://"+srv.Addr+"/0", "dies:", clk.Now, 1, Config{MaxLease: 50})[0]
	ctx := context.Background()
	take := func() (sluice.Decision, error) {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return sluice.Take(c, node, "{k}", l, 1)
	}
	for range 20 { // a hot key: leases grow
		if d, err := take(); err != nil || !d.Allowed {
			t.Fatalf("before Redis dies: %+v, %v", d, err)
		}
	}
	left := outstanding(node, "{k}", windowOf(l, clk.Now()))
	if left == 0 {
		t.Fatal("no lease outstanding")
	}
	srv.Kill()
	for i := range left {
		if d, err := take(); err != nil || !d.Allowed {
			t.Fatalf("Redis dead, lease hit %d of %d: %+v, %v", i+1, left, d, err)
		}
	}
	if _, err := take(); err == nil {
		t.Fatal("Redis dead and the lease used up: no error")
	}
	if st := node.Stats(); st.LeaseHits < uint64(left) {
		t.Fatalf("stats %+v: want at least %d lease hits", st, left)
	}
	srv.Restart()
	var d sluice.Decision
	var err error
	for range 100 { // the client reconnects on its own
		if d, err = take(); err == nil {
			break
		}
	}
	if err != nil || !d.Allowed {
		t.Fatalf("after Redis restarted: %+v, %v", d, err)
	}
	clk.Advance(time.Second) // the leases end; their return finds a fresh count
	if err := node.ReturnExpired(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseZipf sends 100,000 requests of 10,000 users drawn from a Zipf
// distribution (s = 1.1) to 3 lease-mode nodes at one instant, with a
// limit of 100 a window, so that about 1% of the users exceed it: no user
// is admitted more than 100, and none fewer than its requests (at most
// 100) less the stated bound; for a fixed window, and for a token bucket
// and gcra of 100 an hour, burst 100.
func TestLeaseZipf(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.TokenBucket, sluice.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			testLeaseZipf(t, sluice.Limit{Algorithm: a, Rate: 100, Period: time.Hour})
		})
	}
}

func testLeaseZipf(t *testing.T, l sluice.Limit) {
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	url := "redis://" + testenv.RedisAddr(t) + "/0"
	nodes := openLeaseNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{})
	rng := rand.New(rand.NewPCG(rand.Uint64(), 11))
	z := rand.NewZipf(rng, 1.1, 1, 9999)
	const n = 100_000
	users := make([]uint64, n)
	for i := range users {
		users[i] = z.Uint64()
	}
	asked, admitted := make([]int64, 10000), make([]atomic.Int64, 10000)
	for _, u := range users {
		asked[u]++
	}
	errs := make(chan error, 12)
	for g := range 12 {
		go func() {
			for i := g; i < n; i += 12 {
				d, err := sluice.Take(context.Background(), nodes[g%3], fmt.Sprintf("{u%d}", users[i]), l, 1)
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					admitted[users[i]].Add(1)
				}
			}
			errs <- nil
		}()
	}
	for range 12 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	under := leaseBound(Config{}).Under(l, 3)
	over, calls := 0, uint64(0)
	for u := range asked {
		a := admitted[u].Load()
		if asked[u] > l.Rate {
			over++
		}
		if a > l.Rate || a < min(asked[u], l.Rate)-under {
			t.Fatalf("user %d asked %d, admitted %d: want at most %d and at least %d", u, asked[u], a, l.Rate, min(asked[u], l.Rate)-under)
		}
	}
	for _, s := range nodes {
		calls += s.Stats().StoreCalls
	}
	t.Logf("%d of 10000 users over the limit; %d store calls for %d decisions (%.3f each)", over, calls, n, float64(calls)/n)
	if over < 50 || over > 200 {
		t.Fatalf("%d users over the limit: the workload is not the one meant (about 1%%)", over)
	}
}

// drain asks s for a hit of l on key {k} twice l's rate times, and
// returns how many it admitted.
func drain(t *testing.T, s *Store, l sluice.Limit) (n int64) {
	t.Helper()
	for range 2 * l.Rate {
		d, err := sluice.Take(context.Background(), s, "{k}", l, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			n++
		}
	}
	return n
}

// TestLeasePaused holds a lease on a node that then stops asking (a paused
// node) while another node spends the rest of the limit: when the lease's
// lifetime has passed, the paused node's sweep gives its unused hits back
// and a third node admits exactly those, so the three admit the limit in
// all.
func TestLeasePaused(t *testing.T) {
	for name, url := range backendURLs() {
		t.Run(name, func(t *testing.T) {
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
			nodes := openLeaseNodes(t, url(t), fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{})
			a, b, c := nodes[0], nodes[1], nodes[2]
			l := sluice.Limit{Rate: 320, Period: time.Hour} // leases of up to 20
			w := clk.Now().UnixMicro() - clk.Now().UnixMicro()%l.Period.Microseconds()
			var byA int64
			for range 30 {
				if d, err := sluice.Take(context.Background(), a, "{k}", l, 1); err != nil || !d.Allowed {
					t.Fatalf("%+v, %v", d, err)
				}
				byA++
			}
			held := outstanding(a, "{k}", w)
			if held == 0 {
				t.Fatal("a holds no lease")
			}
			byB := drain(t, b, l)
			if byA+byB+held != l.Rate {
				t.Fatalf("a admitted %d and holds %d, b admitted %d: %d, want %d", byA, held, byB, byA+byB+held, l.Rate)
			}
			clk.Advance(defaultLeaseLifetime) // a is paused past its lease
			if err := a.ReturnExpired(context.Background()); err != nil {
				t.Fatal(err)
			}
			if st := a.Stats(); st.Returned != uint64(held) {
				t.Fatalf("a gave back %d of the %d it held", st.Returned, held)
			}
			if byC := drain(t, c, l); byC != held {
				t.Fatalf("after a's lease ended, c admitted %d, want the %d it gave back", byC, held)
			}
		})
	}
}

// FuzzBucketLeases drives three lease-mode nodes on one Redis, one key of
// a bucket limit (token_bucket, leaky_bucket or gcra, by the first byte),
// with interleavings of requests, clock steps shorter and longer than the
// limit's emission interval, sweeps that return ended leases (late
// returns), nodes that end every lease at once (early returns), and nodes
// that die holding leases, and collects every admission across the nodes
// at the instant it was made. The guarantee of lease mode is that the
// exact algorithm, on one key, admits every one of those hits, in that
// order, at those instants: the check replays them on sluice's own
// transition.
func FuzzBucketLeases(f *testing.F) {
	for _, ops := range bucketLeaseSeeds() {
		f.Add(ops)
	}
	url := "redis://" + testenv.RedisAddr(f) + "/0"
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC))
	backs := openBucketBacks(f, url, clk)
	f.Fuzz(func(t *testing.T, ops []byte) {
		runBucketLeases(t, backs, clk, ops)
	})
}

// TestBucketLeasesSound runs FuzzBucketLeases's seeds, and 40 random
// sequences of 300 operations, on Redis, Redis Cluster and a memStore.
func TestBucketLeasesSound(t *testing.T) {
	for name, url := range contractURLs() {
		t.Run(name, func(t *testing.T) {
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC))
			backs := openBucketBacks(t, url(t), clk)
			rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
			all := bucketLeaseSeeds()
			for range 40 {
				ops := make([]byte, 300)
				for i := range ops {
					ops[i] = byte(rng.IntN(256))
				}
				all = append(all, ops)
			}
			for _, ops := range all {
				runBucketLeases(t, backs, clk, ops)
			}
		})
	}
}

// bucketLeaseSeeds returns FuzzBucketLeases's seeds: the first byte picks
// the algorithm, then each byte an operation (see runBucketLeases).
func bucketLeaseSeeds() (seeds [][]byte) {
	seeds = append(seeds, []byte{0, 0, 8, 16, 0, 8, 16, 0, 0, 0, 4, 0, 5, 7, 0, 8, 6, 0, 16})
	seeds = append(seeds, []byte{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6, 1, 1})
	seeds = append(seeds, []byte{2, 0, 9, 18, 27, 36, 45, 54, 63, 4, 12, 20, 28, 5, 13, 21, 15, 0, 0, 0, 0, 0, 0, 3, 11, 19})
	seeds = append(seeds, []byte{0, 2, 10, 18, 2, 10, 18, 2, 10, 18, 2, 10, 18, 2, 10, 18, 12, 2, 10, 18, 44, 2, 10, 18, 60, 2, 10, 18, 13, 5, 2, 10, 18})
	seeds = append(seeds, []byte{2, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 3, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 36, 8, 8, 8, 8, 8, 8, 7, 16, 16, 16, 16, 16})
	for alg := range byte(3) { // the bucket drained by three nodes, then steps, sweeps and early returns
		// a lease (node 0) and one after it (node 1); the first goes back
		// at once; the second's hits come in their slots, as the bucket
		// has refilled; then a third node drains it
		back := []byte{alg, 8, 8, 8, 0, 0, 0, 0, 8, 6, 252, 252, 252, 28, 8, 252, 252, 228, 8, 8}
		for range 85 {
			back = append(back, 16)
		}
		seeds = append(seeds, back)
		for _, steps := range []int{7, 10} {
			slow := []byte{alg, 0, 0, 0, 0, 0} // one node hot, then slower than the limit's rate, then two drain
			for range steps {
				slow = append(slow, 252, 0)
			}
			for range 60 {
				slow = append(slow, 8, 16)
			}
			seeds = append(seeds, slow)
		}
		drain := []byte{alg}
		for i := range 120 {
			drain = append(drain, byte(8*(i%3)))
		}
		for i := range 60 {
			drain = append(drain, byte(8*(i%3)), byte(8*(i%3)+1), []byte{4, 12, 20, 5, 6, 28}[i%6])
		}
		seeds = append(seeds, drain)
	}
	return seeds
}

// openBucketBacks opens three Redis stores on url, sharing a key prefix
// of their own, deciding by clk, closed when tb ends; on memURL, one
// memStore thrice.
func openBucketBacks(tb testing.TB, url string, clk *clocktest.Clock) [3]sluice.Store {
	tb.Helper()
	if url == memURL {
		m := newMemStore(clk.Now)
		return [3]sluice.Store{m, m, m}
	}
	rc := redis.DefaultConfig()
	rc.KeyPrefix, rc.Now, rc.ExpiryMargin = fmt.Sprintf("localfirstbucketfuzz:%x:", rand.Uint64()), clk.Now, 10*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var backs [3]sluice.Store
	for i := range backs {
		r, err := redis.Open(ctx, url, rc)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { r.Close() })
		backs[i] = r
	}
	return backs
}

// runBucketLeases is FuzzBucketLeases's run of ops on three lease-mode
// nodes over backs.
func runBucketLeases(t *testing.T, backs [3]sluice.Store, clk *clocktest.Clock, ops []byte) {
	algs := []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA}
	if len(ops) < 2 {
		return
	}
	if len(ops) > 400 {
		ops = ops[:400]
	}
	// 40 a 2 s, a hit every 50 ms, bursts of 80; leases up to 5
	l := sluice.Limit{Algorithm: algs[int(ops[0])%3], Rate: 40, Period: 2 * time.Second, Burst: 80}
	ops = ops[1:]
	key := fmt.Sprintf("k%x", rand.Uint64())
	clk.Advance(time.Hour) // a fresh key at a fresh time
	cfg := Config{Sync: Lease, Now: clk.Now}
	var nodes [3]*Store
	for i := range nodes {
		nodes[i] = newStore(t, backs[i], cfg)
	}
	defer func() {
		for _, s := range nodes {
			s.Close(context.Background())
		}
	}()
	type hit struct{ at, cost int64 }
	var hits []hit
	leased := uint64(0)
	for _, b := range ops {
		node := int(b/8) % 3
		switch b % 8 {
		case 0, 1, 2, 3:
			cost := 1 + int64(b%2)*int64(b/24%2)
			d, err := sluice.Take(context.Background(), nodes[node], key, l, cost)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				hits = append(hits, hit{clk.Now().UnixMicro(), cost})
			}
		case 4: // 3 to 96 ms: within and past the emission interval
			clk.Advance(time.Duration(3+3*int(b/8)) * time.Millisecond)
		case 5: // a sweep: ended leases go back, late
			if err := nodes[node].ReturnExpired(context.Background()); err != nil {
				t.Fatal(err)
			}
		case 6: // every lease of the node goes back now, early
			if err := nodes[node].returnLeases(context.Background(), true); err != nil {
				t.Fatal(err)
			}
		case 7: // the node dies with its leases; a new one takes its place
			leased += nodes[node].Stats().LeaseHits
			abandon(nodes[node])
			nodes[node] = newStore(t, backs[node], cfg)
		}
	}
	var st sluice.State
	for i, h := range hits {
		if d := l.TakeMicros(&st, h.at, h.cost); !d.Allowed {
			t.Fatalf("%v: hit %d of %d (%d at %d µs) admitted, which the exact algorithm denies after the ones before it: %+v (operations %v)", l, i, len(hits), h.cost, h.at-hits[0].at, d, ops)
		}
	}
	for _, s := range nodes {
		leased += s.Stats().LeaseHits
	}
	t.Logf("%v: %d admitted, %d from leases", l, len(hits), leased)
}

// TestLeasePausedBucket holds a lease of a bucket limit on a node that
// then stops asking (a paused node). When nothing else was admitted on the
// key since, the sweep that ends the lease gives its unused hits back and
// another node admits exactly those: the limit in all. When another node
// has admitted since, its slots lie after the lease's, and the sweep gives
// nothing back: the limit less what the paused node held, within the
// stated bound.
func TestLeasePausedBucket(t *testing.T) {
	for name, url := range backendURLs() {
		for _, a := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
			t.Run(name+"/"+a.String(), func(t *testing.T) {
				for _, others := range []bool{false, true} {
					clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
					nodes := openLeaseNodes(t, url(t), fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{})
					p, b, c := nodes[0], nodes[1], nodes[2]
					l := sluice.Limit{Algorithm: a, Rate: 320, Period: time.Hour} // a hit every 11.25 s; leases of up to 20
					var byP int64
					for range 30 {
						if d, err := sluice.Take(context.Background(), p, "{k}", l, 1); err != nil || !d.Allowed {
							t.Fatalf("%+v, %v", d, err)
						}
						byP++
					}
					held := outstanding(p, "{k}", 0)
					if held == 0 {
						t.Fatal("the paused node holds no lease")
					}
					var byB int64
					if others {
						byB = drain(t, b, l)
						if byP+byB+held != l.Rate {
							t.Fatalf("p admitted %d and holds %d, b admitted %d: %d, want %d", byP, held, byB, byP+byB+held, l.Rate)
						}
					}
					clk.Advance(defaultLeaseLifetime) // p is paused past its lease, well within one hit's refill
					if err := p.ReturnExpired(context.Background()); err != nil {
						t.Fatal(err)
					}
					want := held
					if others {
						want = 0
					}
					if st := p.Stats(); st.Returned != uint64(want) {
						t.Fatalf("others admitted %v: p gave back %d of the %d it held, want %d", others, st.Returned, held, want)
					}
					byC := drain(t, c, l)
					if total := byP + byB + byC; total != l.Rate-held+want {
						t.Fatalf("others admitted %v: p %d, b %d, c %d: %d in all, want %d", others, byP, byB, byC, total, l.Rate-held+want)
					}
					if bound := leaseBound(Config{}).Under(l, 3); held > bound {
						t.Fatalf("p held %d, more than the bound %d", held, bound)
					}
				}
			})
		}
	}
}

// TestLeaseBucketRate checks when a bucket key is leased: a key that a
// node sees slower than the limit's rate, on a full bucket, is decided
// exactly (a lease's hits would be past due before they are asked for);
// one seen faster is leased; and a slow one is leased once the bucket is
// drained far ahead, which gives its hits time. Every hit is admitted.
func TestLeaseBucketRate(t *testing.T) {
	url := "redis://" + testenv.RedisAddr(t) + "/0"
	l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 100, Period: time.Second, Burst: 400} // a hit every 10 ms
	for _, tc := range []struct {
		name   string
		every  time.Duration
		drain  int64 // hits another node takes first, at one instant
		leased bool
	}{
		{"slow", 20 * time.Millisecond, 0, false},
		{"fast", 5 * time.Millisecond, 0, true},
		{"slow on a drained bucket", 20 * time.Millisecond, 300, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
			nodes := openLeaseNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 2, Config{})
			if tc.drain > 0 {
				if d, err := sluice.Take(context.Background(), nodes[1], "{k}", l, tc.drain); err != nil || !d.Allowed {
					t.Fatalf("%d at once: %+v, %v", tc.drain, d, err)
				}
			}
			for i := range 60 {
				if d, err := sluice.Take(context.Background(), nodes[0], "{k}", l, 1); err != nil || !d.Allowed {
					t.Fatalf("hit %d: %+v, %v", i, d, err)
				}
				clk.Advance(tc.every)
			}
			st := nodes[0].Stats()
			if tc.leased && st.LeaseHits == 0 || !tc.leased && st.Grants != 0 {
				t.Fatalf("stats %+v: want leases %v (a lease a slow key takes on a full bucket would go unused)", st, tc.leased)
			}
		})
	}
}

// TestLeasePerSecond is lease mode on the limit people write most, 100 a
// second on a fixed window, with three nodes each asking for it as fast
// as the others over ten windows on the test's clock: never over the limit
// in a window, under it by at most the bound, and the hot key decided
// mostly from leases (a lease of a short window is up to a quarter of its
// capacity: a sixteenth made 0.1 store calls a decision here).
func TestLeasePerSecond(t *testing.T) {
	for name, url := range contractURLs() {
		t.Run(name, func(t *testing.T) {
			l := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Second}
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
			nodes := openLeaseNodes(t, url(t), fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{})
			const windows, each = 10, 300
			under := leaseBound(Config{}).Under(l, 3)
			var calls0 uint64
			least := l.Rate
			for w := range windows {
				admitted := int64(0)
				for j := range each {
					d, err := sluice.Take(context.Background(), nodes[j%3], "{hot}", l, 1)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admitted++
					}
					clk.Advance(time.Second / each)
				}
				if admitted > l.Rate || (w > 0 && admitted < l.Rate-under) {
					t.Fatalf("window %d admitted %d: want at most %d and at least %d", w, admitted, l.Rate, l.Rate-under)
				}
				if w > 0 {
					least = min(least, admitted)
				}
				if w == 0 {
					for _, s := range nodes {
						calls0 += s.Stats().StoreCalls
					}
				}
			}
			var calls uint64
			for _, s := range nodes {
				calls += s.Stats().StoreCalls
			}
			calls -= calls0
			per := float64(calls) / ((windows - 1) * each)
			t.Logf("%d store calls for %d decisions after the first window: %.4f per decision; the fewest a window admitted %d (at least %d stated)", calls, (windows-1)*each, per, least, l.Rate-under)
			if per > 0.05 {
				t.Fatalf("%.4f store calls per decision on a hot key of 100 a second: leases do not pay", per)
			}
		})
	}
}

// TestLeaseDemand runs three nodes sharing a store on a per-second
// limit (fixed_window, 100 a second) for five seconds of an injected
// clock, a millisecond a step: a hot key each node asks for every step
// (3,000 a second, 30 times the limit) and a warm one each node asks for
// every 40 ms (75 a second in all, under the limit). Every window admits
// at most the limit of each key; the hot key at least the limit less the
// nodes' leases; the warm key all it asked for; and the store calls per
// decision stay under 0.008. Measured: leases sized to the key's demand
// until its window ends, 83 calls (40 grants), 0.0054 a decision; sized
// to its hits in a lifetime up to a quarter of the limit, 197 (0.0128),
// and the warm key was denied 5 of its 75 in the first second (leases
// taken late in the window held the rest); up to a sixteenth, 240
// (0.0156).
func TestLeaseDemand(t *testing.T) {
	for name, url := range contractURLs() {
		t.Run(name, func(t *testing.T) {
			testLeaseDemand(t, url(t))
		})
	}
}

func testLeaseDemand(t *testing.T, url string) {
	l := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Second}
	clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
	nodes := openLeaseNodes(t, url, fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{})
	under := leaseBound(Config{}).Under(l, len(nodes))
	ctx := context.Background()
	type count struct{ asked, admitted int64 }
	const seconds = 5
	var decisions int64
	for w := range seconds {
		var hot, warm count
		for ms := range 1000 {
			for i, s := range nodes {
				keys := []string{"{hot}"}
				if (ms+13*i)%40 == 0 {
					keys = append(keys, "{warm}")
				}
				for _, k := range keys {
					d, err := sluice.Take(ctx, s, k, l, 1)
					if err != nil {
						t.Fatal(err)
					}
					decisions++
					c := &hot
					if k == "{warm}" {
						c = &warm
					}
					c.asked++
					if d.Allowed {
						c.admitted++
					}
				}
			}
			clk.Advance(time.Millisecond)
		}
		if hot.admitted > l.Rate || hot.admitted < l.Rate-under {
			t.Fatalf("second %d: the hot key admitted %d of %d, want at most %d and at least %d", w, hot.admitted, hot.asked, l.Rate, l.Rate-under)
		}
		if warm.admitted != warm.asked {
			t.Fatalf("second %d: the warm key admitted %d of %d, under its limit", w, warm.admitted, warm.asked)
		}
	}
	var calls, grants uint64
	for _, s := range nodes {
		calls += s.Stats().StoreCalls
		grants += s.Stats().Grants
	}
	per := float64(calls) / float64(decisions)
	t.Logf("%d store calls (%d grants) for %d decisions: %.4f a decision", calls, grants, decisions, per)
	if per >= 0.008 {
		t.Fatalf("%.4f store calls a decision, want under 0.008", per)
	}
}

// TestLeaseIdleShortWindow has one of 3 nodes take a lease of a 100 a
// second limit and stop asking: a quarter of the period later (not the
// lease lifetime, 500 ms, half the window) its unused hits go back, and
// the other nodes admit the window's 100 in all.
func TestLeaseIdleShortWindow(t *testing.T) {
	for name, url := range contractURLs() {
		t.Run(name, func(t *testing.T) {
			l := sluice.Limit{Rate: 100, Period: time.Second}
			clk := clocktest.New(time.Date(2026, 3, 14, 12, 0, 1, 0, time.UTC))
			nodes := openLeaseNodes(t, url(t), fmt.Sprintf("localfirsttest:%x:", rand.Uint64()), clk.Now, 3, Config{})
			var admitted int64
			take := func(i int) {
				t.Helper()
				d, err := sluice.Take(context.Background(), nodes[i], "{k}", l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
			}
			for range 10 {
				take(0)
			}
			held := outstanding(nodes[0], "{k}", windowOf(l, clk.Now()))
			if held == 0 {
				t.Fatal("node 0 holds no lease")
			}
			clk.Advance(l.Period/4 + time.Millisecond)
			if err := nodes[0].ReturnExpired(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range 100 {
				take(1)
				take(2)
			}
			if admitted != l.Rate {
				t.Fatalf("admitted %d in the window, want %d: node 0's %d unused hits did not go back", admitted, l.Rate, held)
			}
		})
	}
}
