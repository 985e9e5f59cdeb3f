package regions

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// The WAN between the regions of wanWorld: every connection from one
// region to another's Redis goes through a toxiproxy proxy of its own
// that delays each way by wanDelay ± wanJitter, so that a round trip
// takes 160ms ± 40ms.
const (
	wanDelay  = 80 // ms
	wanJitter = 20 // ms
)

// wanWorld is regions on this machine: a redis-server each, and nodes,
// each a regions.Store over a store/redis Store of its region's Redis,
// reading the other regions' through proxies. Its clock runs at the real
// rate from 200ms into a minute, the window of the tests' limit, which
// every Redis decides by (store/redis's Config.Now).
type wanWorld struct {
	t       testing.TB
	prefix  string
	now     func() time.Time
	redis   []*testenv.RedisServer
	tp      *toxiproxy.ApiServer
	proxies [][]*toxiproxy.Proxy // proxies[a][b]: region a's way to region b's Redis
	nodes   [][]*Store
	shift   atomic.Int64 // the clock's lead on the real one, ns

	// counted, when set before the proxies start (newCountedWANWorld),
	// puts a counting relay between each proxy and its Redis: wanBytes is
	// every byte that crossed between regions, both ways.
	counted  bool
	wanBytes atomic.Int64
}

// begin moves the clock forward to 200ms into the next minute, the window
// the tests run in: before any request, so that nothing is counted at the
// old time.
func (w *wanWorld) begin() {
	real := time.Now()
	next := time.UnixMicro(windowStart(w.now().Add(time.Minute).UnixMicro(), time.Minute.Microseconds()))
	w.shift.Store(int64(next.Add(200 * time.Millisecond).Sub(real)))
}

func newWANWorld(t testing.TB, regions, nodes int, wan bool, tune func(*Config)) *wanWorld {
	return buildWANWorld(t, regions, nodes, wan, false, tune)
}

// newCountedWANWorld is newWANWorld whose bytes between regions are
// counted (wanBytes).
func newCountedWANWorld(t testing.TB, regions, nodes int, wan bool, tune func(*Config)) *wanWorld {
	return buildWANWorld(t, regions, nodes, wan, true, tune)
}

func buildWANWorld(t testing.TB, regions, nodes int, wan, counted bool, tune func(*Config)) *wanWorld {
	w := &wanWorld{t: t, prefix: fmt.Sprintf("sluicetest:%x:", rand.Uint64()), counted: counted}
	w.now = func() time.Time { return time.Now().Add(time.Duration(w.shift.Load())) }
	for range regions {
		w.redis = append(w.redis, testenv.StartRedis(t))
	}
	w.tp = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	w.proxies = make([][]*toxiproxy.Proxy, regions)
	for a := range regions {
		w.proxies[a] = make([]*toxiproxy.Proxy, regions)
		for b := range regions {
			if a != b {
				w.proxies[a][b] = w.proxy(fmt.Sprintf("%d-%d", a, b), w.redis[b].Addr, wan)
			}
		}
	}
	// The nodes start at once: each opens its peers' Redis through the
	// WAN (a handshake and a script load, round trips of 160ms each).
	w.nodes = make([][]*Store, regions)
	errs := make([]error, regions*nodes)
	var wg sync.WaitGroup
	for a := range regions {
		w.nodes[a] = make([]*Store, nodes)
		for i := range nodes {
			wg.Go(func() { w.nodes[a][i], errs[a*nodes+i] = w.node(a, i, tune) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return w
}

// proxy starts a proxy to upstream, delaying both ways when wan is set.
func (w *wanWorld) proxy(name, upstream string, wan bool) *toxiproxy.Proxy {
	if w.counted {
		upstream = relay(w.t, upstream, &w.wanBytes)
	}
	p := toxiproxy.NewProxy(w.tp, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(p.Stop)
	if wan {
		for _, stream := range []string{"upstream", "downstream"} {
			w.toxic(p, "wan_"+stream, "latency", stream, fmt.Sprintf(`{"latency": %d, "jitter": %d}`, wanDelay, wanJitter))
		}
	}
	return p
}

func (w *wanWorld) toxic(p *toxiproxy.Proxy, name, kind, stream, attrs string) {
	js := fmt.Sprintf(`{"name": %q, "type": %q, "stream": %q, "attributes": %s}`, name, kind, stream, attrs)
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		w.t.Fatalf("toxic %s on %s: %v", name, p.Name, err)
	}
}

// cutOff holds every byte between region a and the others, both ways,
// as a partition does (TCP delivers them late, once healed), or, with cut
// false, heals it.
func (w *wanWorld) cutOff(a int, cut bool) {
	for b := range w.proxies {
		if b == a {
			continue
		}
		for _, p := range []*toxiproxy.Proxy{w.proxies[a][b], w.proxies[b][a]} {
			for _, stream := range []string{"upstream", "downstream"} {
				if cut {
					w.toxic(p, "cut_"+stream, "latency", stream, `{"latency": 3600000}`)
				} else if err := p.Toxics.RemoveToxic(context.Background(), "cut_"+stream); err != nil {
					w.t.Fatal(err)
				}
			}
		}
	}
}

// open opens a store of the Redis at addr, closed when the test ends.
// Safe to call from any goroutine.
func (w *wanWorld) open(addr string) (*redisstore.Store, error) { return w.openWith(addr, nil) }

// openWith is open with tune applied to the store's Config.
func (w *wanWorld) openWith(addr string, tune func(*redisstore.Config)) (*redisstore.Store, error) {
	cfg := redisstore.DefaultConfig()
	cfg.KeyPrefix, cfg.Now, cfg.ExpiryMargin = w.prefix, w.now, 10*time.Minute
	cfg.DialTimeout, cfg.Timeout = 10*time.Second, 10*time.Second
	if tune != nil {
		tune(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := redisstore.Open(ctx, "redis://"+addr+"/0", cfg)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", addr, err)
	}
	w.t.Cleanup(func() { s.Close() })
	return s, nil
}

// openPeer opens a store of a peer's Redis at addr, its replies bounded
// as store/stack bounds them.
func (w *wanWorld) openPeer(addr string) (*redisstore.Store, error) {
	return w.openWith(addr, func(c *redisstore.Config) { c.MaxReply = MaxPeerReply })
}

// node starts node i of region a: decisions on its region's Redis, rounds
// every 100ms. A peer's read may take 2s, not 500ms, so that a loaded
// machine running the race detector (every read past 500ms there) does not
// cut every region off. Safe to call from any goroutine.
func (w *wanWorld) node(a, i int, tune func(*Config)) (*Store, error) {
	home, err := w.open(w.redis[a].Addr)
	if err != nil {
		return nil, err
	}
	cfg := Config{Region: regionName(a), Node: fmt.Sprintf("%s-%d", regionName(a), i), Now: w.now, PeerTimeout: 2 * time.Second,
		Home: NewRedisSite(home, home.Conn, nil, regionName(a), w.prefix, 0)}
	for b := range w.proxies {
		if b != a {
			peer, err := w.openPeer(w.proxies[a][b].Listen)
			if err != nil {
				return nil, err
			}
			cfg.Peers = append(cfg.Peers, Peer{Name: regionName(b), Site: NewRedisSite(peer, peer.Conn, refusedReply, regionName(b), w.prefix, 0)})
		}
	}
	if tune != nil {
		tune(&cfg)
	}
	s, err := New(home, cfg)
	if err != nil {
		return nil, err
	}
	w.t.Cleanup(func() { s.Close() })
	return s, nil
}

// load sends every node one request of cost (1, or 0 to keep the keys in
// use) on each key every 20ms until stop is closed, and counts what each
// region admits per key. A key whose name starts with "g" is of scope
// global, the others of scope region.
type load struct {
	cost     int64
	stop     chan struct{}
	wg       sync.WaitGroup
	admitted map[string][]atomic.Int64
	errors   atomic.Int64
}

func (w *wanWorld) hammer(l sluice.Limit, keys ...string) *load {
	w.begin()
	return w.send(1, l, keys...)
}

func (w *wanWorld) send(cost int64, l sluice.Limit, keys ...string) *load {
	ld := &load{cost: cost, stop: make(chan struct{}), admitted: make(map[string][]atomic.Int64)}
	for _, k := range keys {
		ld.admitted[k] = make([]atomic.Int64, len(w.nodes))
	}
	for a, ns := range w.nodes {
		for _, n := range ns {
			ld.wg.Go(func() { ld.run(n, a, l, keys) })
		}
	}
	return ld
}

func (ld *load) run(n *Store, a int, l sluice.Limit, keys []string) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var d [1]sluice.Decision
	for {
		select {
		case <-ld.stop:
			return
		case <-tick.C:
		}
		for _, k := range keys {
			r := sluice.Request{Key: k, Limit: l, Cost: ld.cost}
			if strings.HasPrefix(k, "g") {
				r.Scope = sluice.GlobalScope
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := n.TakeAll(ctx, []sluice.Request{r}, d[:])
			cancel()
			switch {
			case err != nil:
				ld.errors.Add(1)
			case d[0].Allowed:
				ld.admitted[k][a].Add(1)
			}
		}
	}
}

func (ld *load) end() {
	close(ld.stop)
	ld.wg.Wait()
}

func (ld *load) counts(key string) []int64 {
	out := make([]int64, len(ld.admitted[key]))
	for a := range out {
		out[a] = ld.admitted[key][a].Load()
	}
	return out
}

// sleepUntil waits until the world's clock reads at (these tests run in
// real time).
func (w *wanWorld) sleepUntil(at time.Duration) {
	start := time.UnixMicro(windowStart(w.now().UnixMicro(), time.Minute.Microseconds()))
	time.Sleep(time.Until(time.Now().Add(start.Add(at).Sub(w.now()))))
}

// realTime skips a test that runs in real time under -short. These tests
// do not run in parallel with each other: on a loaded machine, three
// worlds at once made every read slow.
func realTime(t *testing.T) {
	if testing.Short() {
		t.Skip("runs in real time, for half a minute")
	}
}

// TestWANHammer: three regions of two nodes, 80ms ± 20ms apart each way,
// hammer a global key of 1,000 a minute for 30s of one window, and a key
// of scope region beside it: together they admit the global key within
// the bound, and the region key's limit in each region. Real time: 30s.
func TestWANHammer(t *testing.T) {
	realTime(t)
	w := newWANWorld(t, 3, 2, true, nil)
	ld := w.hammer(perMinute, "global", "region")
	w.sleepUntil(30*time.Second + 200*time.Millisecond)
	ld.end()
	got, b := ld.counts("global"), bound(perMinute, 3, defaultShare)
	t.Logf("global: admitted %v = %d against the bound %d (overshoot %+d); each region alone would admit %d",
		got, sum(got), b, sum(got)-perMinute.Rate, 3*perMinute.Rate)
	if sum(got) > b {
		t.Errorf("admitted %d, more than the bound %d", sum(got), b)
	}
	// How full the window gets depends on how many rounds run: on a loaded
	// machine (load 28 on 2 cores) 81% in 30s, unloaded 97%.
	if sum(got) < perMinute.Rate*2/3 {
		t.Errorf("admitted %d, less than 2/3 of the limit", sum(got))
	}
	for a, n := range ld.counts("region") {
		if n != perMinute.Rate {
			t.Errorf("scope region: region %d admitted %d, want %d", a, n, perMinute.Rate)
		}
	}
	if e := ld.errors.Load(); e > 0 {
		t.Errorf("%d decisions failed", e)
	}
	w.logRounds()
}

// logRounds logs how many rounds each node ran, and how many found it cut
// off.
func (w *wanWorld) logRounds() {
	for _, ns := range w.nodes {
		for _, n := range ns {
			st := n.Status()
			w.t.Logf("%s: %d rounds, %d cut off, %d failed; %d decisions without a cap; peers %+v", n.cfg.Node, st.Rounds, st.CutRounds, st.Failed, st.Unseen, st.Peers)
		}
	}
}

// TestWANPartition: three regions hammer a global key; 3s into the window
// region 0 is cut off from the others (every byte held, both ways) for
// 20s, then healed. Every second of the cut, the total stays within the
// bound and region 0 within its share (or what it had when cut off, and
// the grants of a round in flight). The load stops, the cut heals, and
// every node's view of every region's count comes to the count. Real
// time: 23s.
func TestWANPartition(t *testing.T) {
	realTime(t)
	w := newWANWorld(t, 3, 2, true, nil)
	ld := w.hammer(perMinute, "global")
	const cutAt, cutFor = 3 * time.Second, 20 * time.Second
	w.sleepUntil(cutAt)
	atCut := ld.counts("global")
	w.cutOff(0, true)
	b, rho, alpha := bound(perMinute, 3, defaultShare), ceilDiv(perMinute.Rate, 3), share(perMinute.Rate, 3, defaultShare)
	for at := cutAt + time.Second; at <= cutAt+cutFor; at += time.Second {
		w.sleepUntil(at)
		c := ld.counts("global")
		if sum(c) > b {
			t.Errorf("%v: admitted %v, more than the bound %d", at, c, b)
		}
		if c[0] > max(atCut[0]+2*alpha, rho) {
			t.Errorf("%v: region 0, cut off at %d, admitted %d, more than its share %d", at, atCut[0], c[0], rho)
		}
	}
	ld.end()
	want := ld.counts("global")
	t.Logf("at the cut %v; at the heal %v", atCut, want)
	touch := w.send(0, perMinute, "global") // the key stays in use, read every round
	defer touch.end()
	w.cutOff(0, false)
	healed := time.Now()
	for deadline := time.Now().Add(10 * time.Second); !w.converged("global", want); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			for _, ns := range w.nodes {
				for _, n := range ns {
					u, _ := n.Usage("global")
					t.Logf("%s: %+v\n%+v", n.cfg.Node, u, n.Status())
				}
			}
			t.Fatalf("views did not come to the counts %v within 10s", want)
		}
	}
	t.Logf("admitted %v = %d (bound %d); every node's view came to every region's count %v after the heal",
		want, sum(want), b, time.Since(healed).Round(time.Millisecond))
	if sum(want) > b {
		t.Errorf("admitted %d, more than the bound %d", sum(want), b)
	}
	w.logRounds()
}

// converged reports whether every node's view of key holds want, each
// region's count.
func (w *wanWorld) converged(key string, want []int64) bool {
	for _, ns := range w.nodes {
		for _, n := range ns {
			u, ok := n.Usage(key)
			if !ok {
				return false
			}
			for _, ru := range u.Regions {
				var a int
				fmt.Sscanf(ru.Region, "r%d", &a)
				if ru.Count != want[a] {
					return false
				}
			}
		}
	}
	return true
}

// TestWANRedisKilled: three regions hammer a global key; 3s into the
// window region 2's Redis is killed, and restarted, empty, 5s later.
// Regions 0 and 1 go on (each to its share while region 2 is cut off);
// region 2 decides nothing while its Redis is down. What region 2 counted
// before the crash stays counted, by every region, its own included,
// though its Redis forgot it (a new incarnation of its board); what it
// admitted after a node's last read and before the crash is lost to that
// node's view, as a Redis that loses writes loses them. No read is counted
// twice: no view ever holds more for a region than it admitted. Real
// time: 12s.
func TestWANRedisKilled(t *testing.T) {
	realTime(t)
	w := newWANWorld(t, 3, 2, true, nil)
	ld := w.hammer(perMinute, "global")
	w.sleepUntil(3 * time.Second)
	w.redis[2].Kill()
	atKill := ld.counts("global")
	w.sleepUntil(8 * time.Second)
	atRestart := ld.counts("global")
	if atRestart[2] != atKill[2] {
		t.Errorf("region 2 admitted %d with its Redis down", atRestart[2]-atKill[2])
	}
	for a := range 2 {
		if atRestart[a] <= atKill[a] && atKill[a] < ceilDiv(perMinute.Rate, 3) {
			t.Errorf("region %d did not go on: %d at the kill, %d 5s later", a, atKill[a], atRestart[a])
		}
	}
	w.redis[2].Restart()
	w.sleepUntil(12 * time.Second)
	ld.end()
	got, b := ld.counts("global"), bound(perMinute, 3, defaultShare)
	t.Logf("at the kill %v, at the restart %v, at the end %v = %d (bound %d)", atKill, atRestart, got, sum(got), b)
	if sum(got) > b {
		t.Errorf("admitted %d, more than the bound %d", sum(got), b)
	}
	touch := w.send(0, perMinute, "global")
	defer touch.end()
	lost := 2 * share(perMinute.Rate, 3, defaultShare)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		views := w.views("global")
		settled := true
		for _, v := range views {
			settled = settled && v[0] == got[0] && v[1] == got[1] && v[2] <= got[2] && v[2] >= got[2]-lost
		}
		if settled {
			t.Logf("views %v", views)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("views %v did not settle on the counts %v (region 2 up to %d less) within 10s", views, got, lost)
		}
	}
	w.logRounds()
}

// views returns every node's view of key's counts, by region.
func (w *wanWorld) views(key string) [][]int64 {
	var out [][]int64
	for _, ns := range w.nodes {
		for _, n := range ns {
			v := make([]int64, len(w.nodes))
			if u, ok := n.Usage(key); ok {
				for _, ru := range u.Regions {
					var a int
					fmt.Sscanf(ru.Region, "r%d", &a)
					v[a] = ru.Count
				}
			}
			out = append(out, v)
		}
	}
	return out
}

// refusedReply tells the replies store/redis refused (Config.MaxReply).
func refusedReply(err error) bool { return errors.Is(err, redisstore.ErrReplyTooLarge) }

// BenchmarkWANEmptyRestartIdle: region 2 alone sends (its two nodes, 50 a
// second each) on a global key of 1,000 a minute for 10s, then nobody
// asks for the key for 5s (longer than a key unasked stays read), then
// region 2's Redis restarts empty and region 2 sends again until 30s into
// the window: the regions admit within the bound. The issue measured
// 1,758 of 1,000 (its own set-up); this one admits 917 with the fix and
// 919 without it (TestEmptyRestart shows the defect on the test's memory
// sites), so it is a benchmark, a check on real Redis, not a test. Real
// time: about 32s.
func BenchmarkWANEmptyRestartIdle(b *testing.B) {
	for range b.N {
		benchEmptyRestartIdle(b, []int{2})
	}
}

// BenchmarkWANEmptyRestartUnread: as BenchmarkWANEmptyRestartIdle, but
// after the restart every region sends: regions 0 and 1 never read the
// key before it, and learn what region 2 had admitted from what its
// nodes carried into the new incarnation (TestEmptyRestartUnread on
// memory sites). Real time: about 32s.
func BenchmarkWANEmptyRestartUnread(b *testing.B) {
	for range b.N {
		benchEmptyRestartIdle(b, []int{0, 1, 2})
	}
}

// benchEmptyRestartIdle runs BenchmarkWANEmptyRestartIdle with the
// regions after that send after the restart.
func benchEmptyRestartIdle(t *testing.B, after []int) {
	w := newWANWorld(t, 3, 2, true, nil)
	w.begin()
	busy := func(regions ...int) *load {
		ld := &load{cost: 1, stop: make(chan struct{}), admitted: map[string][]atomic.Int64{"global": make([]atomic.Int64, 3)}}
		for _, a := range regions {
			for _, n := range w.nodes[a] {
				ld.wg.Go(func() { ld.run(n, a, perMinute, []string{"global"}) })
			}
		}
		return ld
	}
	ld := busy(2)
	w.sleepUntil(10 * time.Second)
	ld.end()
	first := ld.counts("global")[2]
	w.sleepUntil(15 * time.Second)
	w.redis[2].Kill()
	w.redis[2].Restart()
	ld = busy(after...)
	w.sleepUntil(30 * time.Second)
	ld.end()
	second := ld.counts("global")
	b := bound(perMinute, 3, defaultShare)
	t.Logf("region 2 admitted %d, then %v after the restart: %d (bound %d)", first, second, first+sum(second), b)
	t.ReportMetric(float64(first+sum(second)), "admitted")
	if first+sum(second) > b {
		t.Errorf("admitted %d, more than the bound %d", first+sum(second), b)
	}
	w.logRounds()
}
