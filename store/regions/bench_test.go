package regions

// The figures of docs/regions.md: three regions of two nodes on this
// machine, every connection between regions through toxiproxy at
// 80ms ± 20ms each way (wan_test.go's world), in real time. Each
// benchmark runs its scenario once per iteration; run them once:
//
//	go test -run '^$' -bench WAN -benchtime 1x ./store/regions/

import (
	"context"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
)

// BenchmarkWANOvershoot: every node of three regions sends a request on
// one global key of 1,000 a minute every 20ms (300 a second in all) for
// one whole window (59.6s of it, on the Redis clocks), as TestWANHammer
// does for half of one. It reports, each against the limit (1,000 in the
// window; for the buckets, the capacity in the window of the regions'
// count, a minute), what the regions admitted together: overshoot_%; the
// bound of docs/regions.md for the run: bound_%; and what three regions
// each enforcing alone would admit (for the buckets, each a full bucket
// and what it refills over the run): alone_%.
func BenchmarkWANOvershoot(b *testing.B) {
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.TokenBucket, sluice.GCRA} {
		b.Run(alg.String(), func(b *testing.B) {
			l := perMinute
			l.Algorithm = alg
			const regions = 3
			run := time.Minute - 400*time.Millisecond
			var total int64
			var one, bnd, alone float64
			for range b.N {
				w := newWANWorld(b, regions, 2, true, nil)
				cfg := w.nodes[0][0].cfg
				switch alg {
				case sluice.FixedWindow:
					one, bnd = float64(l.Rate), float64(bound(l, regions, cfg.Share))
					alone = regions * one
				case sluice.SlidingWindow:
					// The bound of the sliding window (docs/regions.md),
					// with the nodes' MaxPeerTimeout (the longest a round
					// waits for a peer) and CapLife.
					a := share(l.Rate, regions, cfg.Share)
					extra := float64(l.Rate+regions*a) * (cfg.MaxPeerTimeout + cfg.CapLife).Seconds() / l.Period.Seconds()
					one, bnd = float64(l.Rate), float64(l.Rate-1+regions*(a+1))+extra
					alone = regions * one
				default:
					// The run lies in one window of the regions' count (of
					// W = capacity × period / rate, a minute), which admits
					// the capacity, within the windows' bound; a region
					// alone admits its full bucket and what it refills over
					// the run.
					c := sluice.Limit{Rate: l.Capacity(), Period: time.Minute}
					one, bnd = float64(c.Rate), float64(bound(c, regions, cfg.Share))
					alone = regions * (float64(l.Capacity()) + float64(l.Rate)*run.Seconds()/l.Period.Seconds())
				}
				b.ResetTimer()
				ld := w.hammer(l, "global")
				w.sleepUntil(run + 200*time.Millisecond)
				ld.end()
				b.StopTimer()
				got := ld.counts("global")
				total = sum(got)
				b.Logf("%v: admitted %v = %d; the limit %.0f, the bound %.0f, each region alone %.0f; %d errors",
					alg, got, total, one, bnd, alone, ld.errors.Load())
				if float64(total) > bnd {
					b.Errorf("admitted %d, more than the bound %.0f", total, bnd)
				}
				w.logRounds()
			}
			b.ReportMetric(float64(total), "admitted")
			b.ReportMetric(100*(float64(total)-one)/one, "overshoot_%")
			b.ReportMetric(100*(bnd-one)/one, "bound_%")
			b.ReportMetric(100*(alone-one)/one, "alone_%")
		})
	}
}

// BenchmarkWANLatency: every node of three regions decides on 100 global
// keys of 1,000 a minute in turn, a request every 5ms (1,200 a second in
// all, none denied), for 10s after 2s to warm up, in three set-ups:
// peers_80ms, each node with the two other regions as peers through the
// WAN; no_peers, the same regions layer with no peer regions; no_layer,
// each node deciding on its region's Redis without the regions layer. It
// reports the decisions' latency (p50_ms, p99_ms), the decisions made
// (decisions/s), every Redis's CPU (INFO cpu, user + sys, of the three)
// and commands (INFO commandstats) per decision, and, with peers, the
// bytes between regions: wan_idle_bytes/s before any request (the
// nodes' beats and board reads), wan_bytes/s/key what the load adds, by
// active key.
func BenchmarkWANLatency(b *testing.B) {
	const keys, every, warm, measure = 100, 5 * time.Millisecond, 2 * time.Second, 10 * time.Second
	alone := func(c *Config) { c.Peers = nil }
	for _, set := range []struct {
		name  string
		tune  func(*Config)
		layer bool
	}{
		{"peers_80ms", nil, true},
		{"no_peers", alone, true},
		{"no_layer", func(c *Config) { alone(c); c.SyncInterval = -1 }, false},
	} {
		b.Run(set.name, func(b *testing.B) {
			var r paced
			for range b.N {
				w := newCountedWANWorld(b, 3, 2, true, set.tune)
				w.begin()
				var idle float64
				if set.tune == nil {
					time.Sleep(time.Second) // the first rounds, then the nodes' idle traffic
					before, at := w.wanBytes.Load(), time.Now()
					time.Sleep(3 * time.Second)
					idle = float64(w.wanBytes.Load()-before) / time.Since(at).Seconds()
				}
				deciders := make([][]sluice.Store, len(w.nodes))
				for a, ns := range w.nodes {
					for _, n := range ns {
						if set.layer {
							deciders[a] = append(deciders[a], n)
						} else {
							deciders[a] = append(deciders[a], n.inner)
						}
					}
				}
				names := make([]string, keys)
				for i := range names {
					names[i] = "g" + strconv.Itoa(i)
				}
				b.ResetTimer()
				r = w.pace(deciders, perMinute, names, every, warm, measure)
				b.StopTimer()
				b.Logf("%s: %d decisions in %v, %d denied, %d failed; Redis commands %v", set.name, r.n, r.d, r.denied, r.failed, r.calls)
				if r.failed > 0 {
					b.Errorf("%d decisions failed", r.failed)
				}
				if set.tune == nil {
					b.ReportMetric(idle, "wan_idle_bytes/s")
					b.ReportMetric((float64(r.wan)/r.d.Seconds()-idle)/keys, "wan_bytes/s/key")
					w.logRounds()
				}
			}
			b.ReportMetric(r.percentile(50), "p50_ms")
			b.ReportMetric(r.percentile(99), "p99_ms")
			b.ReportMetric(float64(r.n)/r.d.Seconds(), "decisions/s")
			b.ReportMetric(r.cpu.Seconds()*1e6/float64(r.n), "redis_cpu_us/decision")
			var calls int64
			for _, c := range r.calls {
				calls += c
			}
			b.ReportMetric(float64(calls)/float64(r.n), "redis_calls/decision")
		})
	}
}

// paced is what pace measured.
type paced struct {
	lat            []time.Duration
	n              int64 // decisions made in the measure
	denied, failed int64
	d              time.Duration
	cpu            time.Duration    // every Redis's CPU in the measure
	calls          map[string]int64 // every Redis's calls in the measure, by command
	wan            int64            // bytes between regions in the measure
}

// percentile returns the p-th percentile of the latencies, in ms.
func (r *paced) percentile(p int) float64 {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	i := min(len(r.lat)*p/100, len(r.lat)-1)
	return float64(r.lat[i]) / float64(time.Millisecond)
}

// pace has every decider send a request on the next of keys (global,
// of l) every `every`, for warm and then measure, and returns what it
// measured in the latter.
func (w *wanWorld) pace(deciders [][]sluice.Store, l sluice.Limit, keys []string, every, warm, measure time.Duration) paced {
	var (
		on             atomic.Bool
		stop           = make(chan struct{})
		wg             sync.WaitGroup
		mu             sync.Mutex
		r              paced
		denied, failed atomic.Int64
	)
	for _, ds := range deciders {
		for i, s := range ds {
			wg.Go(func() {
				tick := time.NewTicker(every)
				defer tick.Stop()
				var lat []time.Duration
				var d [1]sluice.Decision
				for k := i; ; k++ {
					select {
					case <-stop:
						mu.Lock()
						r.lat = append(r.lat, lat...)
						mu.Unlock()
						return
					case <-tick.C:
					}
					req := sluice.Request{Key: keys[k%len(keys)], Limit: l, Cost: 1, Scope: sluice.GlobalScope}
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					start := time.Now()
					err := s.TakeAll(ctx, []sluice.Request{req}, d[:])
					took := time.Since(start)
					cancel()
					if !on.Load() {
						continue
					}
					switch {
					case err != nil:
						failed.Add(1)
					case !d[0].Allowed:
						denied.Add(1)
					}
					lat = append(lat, took)
				}
			})
		}
	}
	time.Sleep(warm)
	clients := w.redisClients()
	for _, c := range clients {
		if err := c.Do(context.Background(), c.B().ConfigResetstat().Build()).Error(); err != nil {
			w.t.Fatal(err)
		}
	}
	cpu0, wan0, start := redisCPU(w.t, clients), w.wanBytes.Load(), time.Now()
	on.Store(true)
	time.Sleep(measure)
	on.Store(false)
	r.d, r.wan, r.cpu = time.Since(start), w.wanBytes.Load()-wan0, redisCPU(w.t, clients)-cpu0
	r.calls = redisCalls(w.t, clients)
	close(stop)
	wg.Wait()
	r.n, r.denied, r.failed = int64(len(r.lat)), denied.Load(), failed.Load()
	return r
}

// redisClients returns a client of every region's Redis, reached
// directly.
func (w *wanWorld) redisClients() []rueidis.Client {
	var out []rueidis.Client
	for _, rs := range w.redis {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{rs.Addr}, DisableCache: true})
		if err != nil {
			w.t.Fatal(err)
		}
		w.t.Cleanup(c.Close)
		out = append(out, c)
	}
	return out
}

// info returns the fields of a section of c's INFO.
func info(t testing.TB, c rueidis.Client, section string) map[string]string {
	s, err := c.Do(context.Background(), c.B().Info().Section(section).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string)
	for line := range strings.Lines(s) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
}

// redisCPU returns the CPU the servers have used, user and system.
func redisCPU(t testing.TB, cs []rueidis.Client) time.Duration {
	var sec float64
	for _, c := range cs {
		f := info(t, c, "cpu")
		for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
			x, err := strconv.ParseFloat(f[k], 64)
			if err != nil {
				t.Fatalf("INFO cpu %s: %v", k, err)
			}
			sec += x
		}
	}
	return time.Duration(sec * float64(time.Second))
}

// redisCalls returns the calls the servers have counted since CONFIG
// RESETSTAT, by command, but for the INFO and CONFIG of the measure.
func redisCalls(t testing.TB, cs []rueidis.Client) map[string]int64 {
	out := make(map[string]int64)
	for _, c := range cs {
		for k, v := range info(t, c, "commandstats") {
			cmd, ok := strings.CutPrefix(k, "cmdstat_")
			if !ok || cmd == "info" || strings.HasPrefix(cmd, "config") {
				continue
			}
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatalf("INFO commandstats %s: %q", k, v)
			}
			out[cmd] += n
		}
	}
	return out
}

// relay forwards each connection to its listener to upstream, adding the
// bytes it carries, both ways, to n, and returns its address.
func relay(t testing.TB, upstream string, n *atomic.Int64) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", upstream)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					_, _ = io.Copy(countingWriter{dst, n}, src)
					done <- struct{}{}
				}
				go pipe(u, c)
				go pipe(c, u)
				<-done // either way closed: close both
			}()
		}
	}()
	return ln.Addr().String()
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (cw countingWriter) Write(p []byte) (int, error) {
	k, err := cw.w.Write(p)
	cw.n.Add(int64(k))
	return k, err
}

// BenchmarkWANSlowPeer: three regions of two nodes hammer a global key of
// 1,000 a minute for a minute's window; region 2 is 300ms ± 20ms each way
// from the others (80ms ± 20ms between regions 0 and 1), the nodes at the
// default PeerTimeout (500ms) and MaxPeerTimeout (2s). The rounds wait
// for region 2 as long as 3 times its reads (lagging, not cut off):
// before, its reads timed out at 500ms every round, every region was cut
// off from it, and 535-794 of 1,000 were admitted. It reports the
// admitted count, the rounds that found a node cut off, and how long a
// round of the fast regions (0 and 1) and of the slow one (2) took on
// average while the load ran (fast_round_ms, slow_round_ms).
func BenchmarkWANSlowPeer(b *testing.B) {
	var total, cut, rounds int64
	var fastMs, slowMs float64
	for range b.N {
		w := newWANWorld(b, 3, 2, true, func(c *Config) { c.PeerTimeout = 0 })
		for a := range w.proxies {
			for c, p := range w.proxies[a] {
				if p != nil && (a == 2 || c == 2) {
					for _, stream := range []string{"upstream", "downstream"} {
						w.toxic(p, "slow_"+stream, "latency", stream, `{"latency": 220}`)
					}
				}
			}
		}
		ld := w.hammer(perMinute, "global")
		began, before := time.Now(), w.rounds()
		w.sleepUntil(time.Minute - 400*time.Millisecond)
		ld.end()
		took, after := time.Since(began), w.rounds()
		fastMs = roundMs(took, 2, before[:2], after[:2])
		slowMs = roundMs(took, 2, before[2:], after[2:])
		got := ld.counts("global")
		total = sum(got)
		cut, rounds = 0, 0
		for _, ns := range w.nodes {
			for _, n := range ns {
				st := n.Status()
				cut, rounds = cut+int64(st.CutRounds), rounds+int64(st.Rounds)
			}
		}
		b.Logf("admitted %v = %d of %d (bound %d); %d of %d rounds cut off; a round of regions 0 and 1 %.0fms, of region 2 %.0fms",
			got, total, perMinute.Rate, bound(perMinute, 3, defaultShare), cut, rounds, fastMs, slowMs)
		if total > bound(perMinute, 3, defaultShare) {
			b.Errorf("admitted %d, more than the bound", total)
		}
		w.logRounds()
	}
	b.ReportMetric(float64(total), "admitted")
	b.ReportMetric(float64(cut)/float64(max(rounds, 1)), "cut/round")
	b.ReportMetric(fastMs, "fast_round_ms")
	b.ReportMetric(slowMs, "slow_round_ms")
}

// rounds returns, per region, the rounds its nodes have run.
func (w *wanWorld) rounds() []uint64 {
	out := make([]uint64, len(w.nodes))
	for a, ns := range w.nodes {
		for _, n := range ns {
			out[a] += n.Status().Rounds
		}
	}
	return out
}

// roundMs returns how long, in ms, a node's round took on average over
// d, from the rounds its region's nodes (nodes a region) had run before
// and after, for the regions counted.
func roundMs(d time.Duration, nodes int, before, after []uint64) float64 {
	var n uint64
	for a := range before {
		n += after[a] - before[a]
	}
	if n == 0 {
		return 0
	}
	return float64(d.Milliseconds()) * float64(nodes*len(before)) / float64(n)
}

// BenchmarkWANQuietKey: three regions of two nodes 80ms ± 20ms apart each
// way; every node asks for one global key of 360,000 a minute once a
// second (0.1% of its limit in all) for SLUICE_QUIET_FOR (default a
// minute; the figure asks for 10). It reports the requests
// denied, which should be none: before TestQuietKeyNotDenied's fix, a
// round that missed a peer charged the key the whole limit for it.
func BenchmarkWANQuietKey(b *testing.B) {
	d := time.Minute
	if s := os.Getenv("SLUICE_QUIET_FOR"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			b.Fatal(err)
		}
	}
	l := sluice.Limit{Rate: 360_000, Period: time.Minute}
	var asked, denied, failed atomic.Int64
	for range b.N {
		w := newWANWorld(b, 3, 2, true, func(c *Config) { c.PeerTimeout = 0 })
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for _, ns := range w.nodes {
			for _, n := range ns {
				wg.Go(func() {
					tick := time.NewTicker(time.Second)
					defer tick.Stop()
					var ds [1]sluice.Decision
					for {
						select {
						case <-stop:
							return
						case <-tick.C:
						}
						asked.Add(1)
						ctx, cancel := context.WithTimeout(context.Background(), time.Second)
						err := n.TakeAll(ctx, []sluice.Request{{Key: "gquiet", Limit: l, Cost: 1, Scope: sluice.GlobalScope}}, ds[:])
						cancel()
						switch {
						case err != nil:
							failed.Add(1)
						case !ds[0].Allowed:
							denied.Add(1)
						}
					}
				})
			}
		}
		time.Sleep(d)
		close(stop)
		wg.Wait()
		b.Logf("%v: %d asked, %d denied, %d failed", d, asked.Load(), denied.Load(), failed.Load())
		w.logRounds()
	}
	b.ReportMetric(float64(denied.Load()), "denied")
	b.ReportMetric(float64(asked.Load()), "asked")
}
