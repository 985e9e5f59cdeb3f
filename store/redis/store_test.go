package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		url     string
		addrs   []string
		user    string
		pass    string
		db      int
		master  string
		cluster bool
		tls     bool
		err     string
		// sentinelPass is Config.SentinelPassword, and the sentinel
		// connections' password wanted.
		sentinelPass string
	}{
		{name: "plain", url: "redis://localhost:6380", addrs: []string{"localhost:6380"}},
		{name: "default port", url: "redis://cache", addrs: []string{"cache:6379"}},
		{name: "user, password and db", url: "redis://u:p%40ss@h:1/3", addrs: []string{"h:1"}, user: "u", pass: "p@ss", db: 3},
		{name: "password only", url: "redis://:secret@h:1", addrs: []string{"h:1"}, pass: "secret"},
		{name: "ipv6", url: "redis://[::1]:7000", addrs: []string{"[::1]:7000"}},
		{name: "tls", url: "rediss://h:6390/1", addrs: []string{"h:6390"}, db: 1, tls: true},
		{name: "cluster", url: "redis+cluster://a:1,b:2,c:3", addrs: []string{"a:1", "b:2", "c:3"}, cluster: true},
		{name: "cluster over tls", url: "rediss+cluster://u:p@a:1", addrs: []string{"a:1"}, user: "u", pass: "p", cluster: true, tls: true},
		{name: "sentinel", url: "redis+sentinel://s1:26379,s2:26379/mymaster", addrs: []string{"s1:26379", "s2:26379"}, master: "mymaster"},
		{name: "sentinel with db", url: "redis+sentinel://s1:26379/mymaster/2", addrs: []string{"s1:26379"}, master: "mymaster", db: 2},
		{name: "sentinel with passwords", url: "redis+sentinel://:m@s1:26379/mymaster", addrs: []string{"s1:26379"}, master: "mymaster", pass: "m", sentinelPass: "s"},
		{name: "unix socket", url: "unix:///var/run/redis/redis.sock", addrs: []string{"/var/run/redis/redis.sock"}},
		{name: "unix socket with a password", url: "unix://u:p%2Fw@/run/r.sock", addrs: []string{"/run/r.sock"}, user: "u", pass: "p/w"},
		{name: "unix socket with @ in its path", url: "unix://:pw@/run/a@b.sock", addrs: []string{"/run/a@b.sock"}, pass: "pw"},
		{name: "unix socket without a path", url: "unix://", err: "want unix:///path"},
		{name: "unix socket, a directory", url: "unix:///run/", err: "no socket path"},
		{name: "unix socket with a host", url: "unix://localhost/run/r.sock", err: "want unix:///path"},
		{name: "unix socket with a query", url: "unix:///run/r.sock?db=1", err: "query"},
		{name: "unix socket password redacted", url: "unix://u:hunter2@run/r.sock", err: "u:xxxxx@"},
		{name: "no scheme", url: "localhost:6379", err: "want redis://"},
		{name: "a sentinel's password without a sentinel", url: "redis://h:1", sentinelPass: "x", err: "names no sentinel"},
		{name: "unknown scheme", url: "memcache://h:1", err: `unknown scheme "memcache"`},
		{name: "no host", url: "redis:///0", err: "no host"},
		{name: "bad db", url: "redis://h:1/x", err: `database "x"`},
		{name: "db on a cluster", url: "redis+cluster://h:1/0", err: "no database"},
		{name: "several hosts without cluster", url: "redis://a:1,b:2", err: "several hosts"},
		{name: "sentinel without master", url: "redis+sentinel://s:1", err: "mastername"},
		{name: "query", url: "redis://h:1?x=1", err: "query"},
		{name: "password redacted", url: "redis://u:hunter2@h:1/x", err: "u:xxxxx@h"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.SentinelPassword = tt.sentinelPass
			opt, cluster, err := parseURL(tt.url, cfg)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || strings.Contains(err.Error(), "hunter2") {
					t.Fatalf("parseURL(%q) error = %v, want one containing %q (and no password)", tt.url, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseURL(%q): %v", tt.url, err)
			}
			if fmt.Sprint(opt.InitAddress) != fmt.Sprint(tt.addrs) || opt.Username != tt.user || opt.Password != tt.pass ||
				opt.SelectDB != tt.db || opt.Sentinel.MasterSet != tt.master || cluster != tt.cluster || (opt.TLSConfig != nil) != tt.tls {
				t.Fatalf("parseURL(%q) = addrs %v user %q pass %q db %d master %q cluster %v tls %v", tt.url,
					opt.InitAddress, opt.Username, opt.Password, opt.SelectDB, opt.Sentinel.MasterSet, cluster, opt.TLSConfig != nil)
			}
			if !tt.cluster && tt.master == "" && !opt.ForceSingleClient {
				t.Fatal("a single Redis should force the single client")
			}
			if opt.Sentinel.Password != tt.sentinelPass {
				t.Fatalf("parseURL(%q): the sentinels' password %q, want %q", tt.url, opt.Sentinel.Password, tt.sentinelPass)
			}
			if unix := strings.HasPrefix(tt.url, "unix:"); unix != (opt.DialCtxFn != nil) {
				t.Fatalf("parseURL(%q): a dialer of unix sockets %v, want %v", tt.url, opt.DialCtxFn != nil, unix)
			}
		})
	}
}

func TestOpenRejectsBadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"brace in prefix", func(c *Config) { c.KeyPrefix = "a{b}" }},
		{"negative batch", func(c *Config) { c.MaxBatch = -1 }},
		{"negative in flight", func(c *Config) { c.MaxInFlight = -1 }},
		{"negative timeout", func(c *Config) { c.Timeout = -1 }},
		{"negative dial timeout", func(c *Config) { c.DialTimeout = -1 }},
		{"negative margin", func(c *Config) { c.ExpiryMargin = -1 }},
		{"negative jitter", func(c *Config) { c.ExpiryJitter = -1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.edit(&cfg)
			if s, err := Open(context.Background(), "redis://127.0.0.1:1", cfg); err == nil {
				s.Close()
				t.Fatal("Open accepted the config")
			}
		})
	}
}

// TestZeroConfig checks that a zero Config is the default one, field by
// field, that a negative BatchWindow (never wait) is kept, and that a
// store opened with a zero Config decides.
func TestZeroConfig(t *testing.T) {
	t.Parallel()
	def := DefaultConfig()
	zero, _, _, err := check("redis://127.0.0.1:1", Config{})
	if err != nil {
		t.Fatal(err)
	}
	if zero.KeyPrefix != def.KeyPrefix || zero.MaxBatch != def.MaxBatch || zero.BatchWindow != def.BatchWindow ||
		zero.MaxInFlight != def.MaxInFlight || zero.Timeout != def.Timeout || zero.DialTimeout != def.DialTimeout ||
		zero.ExpiryMargin != def.ExpiryMargin || zero.Now != nil || zero.TLS != nil {
		t.Errorf("the zero Config means %+v, want the defaults %+v", zero, def)
	}
	if got, _, _, _ := check("redis://127.0.0.1:1", Config{BatchWindow: -1}); got.BatchWindow != -1 {
		t.Errorf("BatchWindow -1 became %v, want it kept (never wait)", got.BatchWindow)
	}
	s := open(t, "redis://"+testenv.RedisAddr(t), Config{KeyPrefix: fmt.Sprintf("zero%x:", rand.Uint64())})
	if s.cfg.MaxInFlight != def.MaxInFlight || s.cfg.Timeout != def.Timeout {
		t.Errorf("opened with %+v, want the defaults", s.cfg)
	}
	if d, err := sluice.Take(context.Background(), s, "k", sluice.Limit{Rate: 1, Period: time.Minute}, 1); err != nil || !d.Allowed {
		t.Fatalf("Take with a zero Config = %+v, %v", d, err)
	}
}

func TestOpenUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	s, err := Open(ctx, "redis://127.0.0.1:1", DefaultConfig())
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded on a closed port")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Open took %v", d)
	}
}

// TestSlot compares Slot with the Cluster's own CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	addr := testenv.RedisClusterAddrs(t)[0]
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := []string{"", "foo", "{user1000}.following", "{user1000}.followers", "a{}b", "{}{x}", "x{y", "{a}{b}", "sluice:{api|user=42}|0"}
	for range 200 {
		b := make([]byte, rand.IntN(20))
		for i := range b {
			b[i] = "ab{}|:xyz"[rand.IntN(9)]
		}
		keys = append(keys, string(b))
	}
	for _, k := range keys {
		want, err := c.Do(context.Background(), c.B().ClusterKeyslot().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); int64(got) != want {
			t.Fatalf("Slot(%q) = %d, CLUSTER KEYSLOT = %d", k, got, want)
		}
	}
}

// TestKeysExpire checks that keys get a TTL of at least their reset time
// plus the margin, and at most one margin more, so Redis forgets idle keys.
func TestKeysExpire(t *testing.T) {
	addr := testenv.RedisAddr(t)
	cfg := testConfig(nil)
	cfg.ExpiryMargin = time.Second
	s := open(t, "redis://"+addr, cfg)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	tests := []struct {
		name  string
		limit sluice.Limit
		cost  int64
		reset time.Duration // ResetAfter of the decision, at most
	}{
		{"fixed window", sluice.Limit{Rate: 10, Period: time.Hour}, 1, time.Hour},
		{"sliding window", sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 10, Period: time.Minute}, 1, 2 * time.Minute},
		{"sliding log", sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 10, Period: time.Minute}, 3, time.Minute},
		{"token bucket", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Period: time.Minute}, 1, time.Minute},
		{"gcra", sluice.Limit{Algorithm: sluice.GCRA, Rate: 10, Period: time.Second}, 5, time.Second / 2},
		{"report only", sluice.Limit{Rate: 10, Period: time.Hour}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := strings.ReplaceAll(tt.name, " ", "-")
			start := time.Now()
			d, err := sluice.Take(ctx, s, key, tt.limit, tt.cost)
			if err != nil {
				t.Fatal(err)
			}
			if d.ResetAfter > tt.reset {
				t.Fatalf("ResetAfter %v, want at most %v", d.ResetAfter, tt.reset)
			}
			pttl, err := c.Do(ctx, c.B().Pttl().Key(cfg.KeyPrefix+key).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			// String states get reset + 2 × margin (see take.lua),
			// sliding logs reset + margin, less the time that passed
			// between the script and PTTL.
			least := ttlLeast(d.ResetAfter+cfg.ExpiryMargin, time.Since(start))
			most := (d.ResetAfter + 2*cfg.ExpiryMargin).Milliseconds() + 2 // ms roundings
			if tt.limit.Algorithm == sluice.SlidingLog {
				most = (d.ResetAfter + cfg.ExpiryMargin).Milliseconds() + 2
			}
			if pttl < least || pttl > most {
				t.Fatalf("PTTL %dms, want %d to %dms (reset %v, margin %v)", pttl, least, most, d.ResetAfter, cfg.ExpiryMargin)
			}
		})
	}
	// A key written again and again keeps its TTL while that covers the
	// new reset time plus the margin (the fixed window's reset stays put),
	// and gets a longer one when not (a token bucket of 10 a minute moves
	// its reset 6s further per hit).
	for _, l := range []sluice.Limit{
		{Rate: 1000, Period: time.Hour},
		{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Minute},
		{Algorithm: sluice.GCRA, Rate: 100, Period: time.Second},
	} {
		t.Run("rewritten "+l.String(), func(t *testing.T) {
			key := "rewritten-" + l.Algorithm.String()
			for i := range 10 {
				start := time.Now()
				d, err := sluice.Take(ctx, s, key, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				pttl, err := c.Do(ctx, c.B().Pttl().Key(cfg.KeyPrefix+key).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				least := ttlLeast(d.ResetAfter+cfg.ExpiryMargin, time.Since(start))
				most := (d.ResetAfter + 2*cfg.ExpiryMargin).Milliseconds() + 2 // ms roundings at two writes
				if pttl < least || pttl > most {
					t.Fatalf("hit %d: PTTL %dms, want %d to %dms (reset %v)", i+1, pttl, least, most, d.ResetAfter)
				}
			}
		})
	}
}

// ttlLeast is the least PTTL, in ms, of a key a script gave a TTL of ttl
// within the elapsed time that ended when PTTL answered: Redis counts the
// TTL down in real time, elapsed at most, and rounds to the millisecond.
// A fixed allowance (it was 100ms) fails whenever a loaded machine takes
// longer than that between the script and PTTL.
func ttlLeast(ttl, elapsed time.Duration) int64 {
	return (ttl - elapsed).Milliseconds() - 1
}

// TestAlgorithmChangeKeyTypes switches one key between algorithms whose
// states are strings and lists in Redis, and checks each starts afresh.
func TestAlgorithmChangeKeyTypes(t *testing.T) {
	clock := clocktest.New(t0)
	s := open(t, "redis://"+testenv.RedisAddr(t), testConfig(clock.Now))
	ctx := context.Background()
	algs := []sluice.Algorithm{sluice.SlidingLog, sluice.TokenBucket, sluice.SlidingLog, sluice.GCRA, sluice.FixedWindow, sluice.SlidingLog, sluice.LeakyBucket}
	for i, alg := range algs {
		l := sluice.Limit{Algorithm: alg, Rate: 3, Period: time.Minute}
		for j := range 4 {
			var fresh sluice.State
			want := l.Take(&fresh, clock.Now(), 3)
			got, err := sluice.Take(ctx, s, "switch", l, 3)
			if err != nil {
				t.Fatal(err)
			}
			if j == 0 && got != want {
				t.Fatalf("switch %d to %v: got %+v, want a fresh key's %+v", i, alg, got, want)
			}
			if j > 0 && got.Allowed {
				t.Fatalf("switch %d to %v: request %d allowed past the limit", i, alg, j)
			}
		}
	}
}

// TestBucketLimitChanges moves bucket keys between limits of different
// gcd(rate, period), which the script keeps levels over: a level written
// under another limit is rescaled, rounding up, and Go's replay must
// rescale it the same way, or its decisions disagree with the script's
// (an error). Where the rescale is exact (into a g that divides the old
// one) the decisions are those of the Go transition on one state.
func TestBucketLimitChanges(t *testing.T) {
	clock := clocktest.New(t0)
	s := open(t, "redis://"+testenv.RedisAddr(t), testConfig(clock.Now))
	ctx := context.Background()
	for _, alg := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			limits := []sluice.Limit{ // g: 6, 1, 4
				{Algorithm: alg, Rate: 6, Period: time.Minute, Burst: 6},
				{Algorithm: alg, Rate: 7, Period: time.Minute, Burst: 10},
				{Algorithm: alg, Rate: 8, Period: 36 * time.Second, Burst: 5},
			}
			r := rand.New(rand.NewPCG(uint64(alg), 3))
			for step := range 300 {
				clock.Set(clock.Now().Add(time.Duration(r.IntN(4000)) * time.Millisecond))
				if _, err := sluice.Take(ctx, s, "rescaled", limits[r.IntN(len(limits))], r.Int64N(4)); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
			}
			// g 6, then 1 for good: exact, so the Go state agrees.
			var st sluice.State
			for step := range 100 {
				l := limits[min(step/10, 1)]
				clock.Set(clock.Now().Add(time.Duration(r.IntN(4000)) * time.Millisecond))
				cost := r.Int64N(4)
				want := l.Take(&st, clock.Now(), cost)
				got, err := sluice.Take(ctx, s, "exact", l, cost)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if got != want {
					t.Fatalf("step %d %v cost %d:\n got %+v\nwant %+v", step, l, cost, got, want)
				}
			}
		})
	}
}

// TestBucketRescaleRoundsUp checks the one rounding of a limit change:
// a level of 119,999,994 hit·µs written under g = 6 is 119,999,996 under
// g = 4, which makes ResetAfter at 8/36s 15,000,000 µs rather than the
// 14,999,999 of rounding down.
func TestBucketRescaleRoundsUp(t *testing.T) {
	clock := clocktest.New(t0)
	s := open(t, "redis://"+testenv.RedisAddr(t), testConfig(clock.Now))
	ctx := context.Background()
	a := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 6, Period: time.Minute, Burst: 6}      // g = 6
	b := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 8, Period: 36 * time.Second, Burst: 5} // g = 4
	for _, at := range []time.Duration{0, time.Microsecond} {                                     // level 60e6, then 2 × 60e6 − 6
		clock.Set(t0.Add(at))
		if d, err := sluice.Take(ctx, s, "k", a, 1); err != nil || !d.Allowed {
			t.Fatalf("take at %v: %+v, %v", at, d, err)
		}
	}
	st := sluice.StateOf(t0.Add(time.Microsecond).UnixMicro(), 119_999_996, 0)
	want := b.Take(&st, clock.Now(), 0)
	got, err := sluice.Take(ctx, s, "k", b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || want.ResetAfter != 15*time.Second {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestCheckLimitAcceptsReferenceLimits(t *testing.T) {
	t.Parallel()
	for _, l := range referenceLimits() {
		if err := CheckLimit(l); err != nil {
			t.Errorf("CheckLimit(%v) = %v", l, err)
		}
	}
}

func TestInexactLimits(t *testing.T) {
	s := open(t, "redis://"+testenv.RedisAddr(t), testConfig(nil))
	tests := []struct {
		name  string
		limit sluice.Limit
	}{
		{"period over 2^51 µs", sluice.Limit{Rate: 1, Period: (1<<51 + 1) * time.Microsecond}},
		{"bucket level over 2^52", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1_000_003, Period: 24 * time.Hour}},
		{"gcra tolerance over 2^51", sluice.Limit{Algorithm: sluice.GCRA, Rate: 1, Period: 1 << 40 * time.Microsecond, Burst: 1 << 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.limit.Validate(); err != nil {
				t.Skipf("Validate rejects it already: %v", err)
			}
			_, err := sluice.Take(context.Background(), s, "inexact", tt.limit, 1)
			if !errors.Is(err, ErrInexact) || !errors.Is(err, sluice.ErrLimit) {
				t.Fatalf("Take = %v, want ErrInexact, a sluice.ErrLimit", err)
			}
			ds := make([]sluice.Decision, 2)
			err = s.TakeAll(context.Background(), []sluice.Request{
				{Key: "exact", Limit: sluice.Limit{Rate: 1, Period: time.Second}, Cost: 1},
				{Key: "inexact", Limit: tt.limit, Cost: 1},
			}, ds)
			if !errors.Is(err, sluice.ErrLimit) {
				t.Fatalf("TakeAll = %v, want a sluice.ErrLimit", err)
			}
			var lc sluice.LimitChecker = s
			if err := lc.CheckLimit(tt.limit); !errors.Is(err, ErrInexact) || !errors.Is(err, sluice.ErrLimit) {
				t.Fatalf("CheckLimit = %v, want ErrInexact, a sluice.ErrLimit", err)
			}
		})
	}
}

// TestDeadlineWithoutContextDeadline checks that a context without a
// deadline still returns at Config.Timeout when Redis hangs. The timeout,
// 2s, lies between the default Timeout (1s) and rueidis's own dial
// timeout (5s): a Take that returned sooner was not bounded by it (a timer
// never fires early), and one that returned after twice that by something
// else. A scheduling delay only makes a Take later, and would need to be
// seconds long; the bound was 100ms over a timeout of 200ms, which a
// loaded machine overran ('returned after 328ms').
func TestDeadlineWithoutContextDeadline(t *testing.T) {
	srv := testenv.StartRedis(t)
	cfg := DefaultConfig()
	cfg.Timeout = 2 * time.Second
	s := open(t, "redis://"+srv.Addr, cfg)
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := sluice.Take(context.Background(), s, "k", sluice.Limit{Rate: 1, Period: time.Second}, 1)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Take on a hung Redis still waiting after 10s")
	}
	if err == nil {
		t.Fatal("a hung Redis decided")
	}
	if d := time.Since(start); d < cfg.Timeout || d > 2*cfg.Timeout {
		t.Fatalf("returned after %v, want at %v", d, cfg.Timeout)
	}
}

func TestBatchSizes(t *testing.T) {
	// MaxBatch 1 and a batching window both decide exactly too.
	for _, tt := range []struct {
		name   string
		batch  int
		window time.Duration
	}{{"one per call", 1, -1}, {"window", 128, 200 * time.Microsecond}} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(clocktest.New(t0).Now)
			cfg.MaxBatch, cfg.BatchWindow = tt.batch, tt.window
			s := open(t, "redis://"+testenv.RedisAddr(t), cfg)
			l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 100, Period: time.Minute}
			errs := make(chan error, 16)
			allowed := make(chan int, 16)
			for range 16 {
				go func() {
					n := 0
					for range 20 {
						d, err := sluice.Take(context.Background(), s, "b", l, 1)
						if err != nil {
							errs <- err
							return
						}
						if d.Allowed {
							n++
						}
					}
					errs <- nil
					allowed <- n
				}()
			}
			total := 0
			for range 16 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
				total += <-allowed
			}
			if total != 100 {
				t.Fatalf("%d allowed of 320, want 100", total)
			}
		})
	}
}

// TestMixedBatches has 32 goroutines take from 12 keys at once, at one
// instant, so that batches mix limits, costs and repeated keys: Takes of
// one limit and cost share a request record in the script call, and a key
// given twice must see the first request's hits. At a fixed time each key
// admits exactly ⌊capacity/cost⌋ requests, whatever the order.
func TestMixedBatches(t *testing.T) {
	cfg := testConfig(clocktest.New(t0).Now)
	cfg.MaxInFlight, cfg.BatchWindow = 1, 200*time.Microsecond // large batches
	s := open(t, "redis://"+testenv.RedisAddr(t), cfg)
	type key struct {
		l    sluice.Limit
		cost int64
	}
	var keys []key
	for i, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow, sluice.SlidingWindow, sluice.LeakyBucket, sluice.SlidingLog} {
		for j, cost := range []int64{1, 3} {
			keys = append(keys, key{sluice.Limit{Algorithm: alg, Rate: int64(40 + 10*i + j), Period: time.Minute}, cost})
		}
	}
	var admitted [12]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 60 {
				k := r.IntN(len(keys))
				d, err := sluice.Take(context.Background(), s, fmt.Sprintf("mixed%d", k), keys[k].l, keys[k].cost)
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					admitted[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k, key := range keys {
		// 32 × 60 takes over 12 keys: each key is asked far more often
		// than it admits.
		if got, want := admitted[k].Load(), key.l.Capacity()/key.cost; got != want {
			t.Errorf("%v cost %d: %d admitted, want %d", key.l, key.cost, got, want)
		}
	}
}

// TestManyTakesInOneCall runs 120 Takes as one script call, each key
// three times with room for two: the allowed bits span three words, and a
// repeated key sees the hits of its earlier requests.
func TestManyTakesInOneCall(t *testing.T) {
	cfg := testConfig(clocktest.New(t0).Now)
	s := open(t, "redis://"+testenv.RedisAddr(t), cfg)
	l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 2, Period: time.Minute}
	var b batch
	for i := range 120 {
		c := &call{ctx: context.Background(), n: 1, done: make(chan struct{}, 1)}
		c.keys = []string{cfg.KeyPrefix + "many" + strconv.Itoa(i%40)}
		var err error
		if c.blob, err = s.limits.appendRequest(appendGroup(nil, modeWrite, 1), l, 1); err != nil {
			t.Fatal(err)
		}
		b.calls = append(b.calls, c)
	}
	calls := slices.Clone(b.calls)
	s.exec(&b)
	for i, c := range calls {
		<-c.done
		if c.err != nil {
			t.Fatalf("take %d: %v", i, c.err)
		}
		d, err := c.decision(l, 1)
		if err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
		if want := i < 80; d.Allowed != want || d.Remaining != max(1-int64(i/40), 0) {
			t.Fatalf("take %d (key many%d, request %d): %+v, want allowed %v", i, i%40, i/40+1, d, want)
		}
	}
}

// TestScriptFlushed checks that the store sends the script again to a
// Redis that lost it (SCRIPT FLUSH, as after a restart).
func TestScriptFlushed(t *testing.T) {
	srv := testenv.StartRedis(t)
	s := open(t, "redis://"+srv.Addr, testConfig(nil))
	l := sluice.Limit{Rate: 5, Period: time.Hour}
	ctx := context.Background()
	if _, err := sluice.Take(ctx, s, "k", l, 1); err != nil {
		t.Fatal(err)
	}
	if got := srv.Do("SCRIPT", "FLUSH"); got != "+OK" {
		t.Fatalf("SCRIPT FLUSH = %q", got)
	}
	d, err := sluice.Take(ctx, s, "k", l, 1)
	if err != nil || d.Remaining != 3 {
		t.Fatalf("Take after SCRIPT FLUSH = %+v, %v; want 3 remaining", d, err)
	}
}

// TestCloseUnderLoad closes the store while 256 goroutines take with
// contexts that never end: every Take returns (decided, or ErrClosed, or
// the error of a script call cut short), none waits for ever.
func TestCloseUnderLoad(t *testing.T) {
	s, err := Open(context.Background(), "redis://"+testenv.RedisAddr(t), testConfig(nil))
	if err != nil {
		t.Fatal(err)
	}
	l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 1000, Period: time.Second}
	var wg sync.WaitGroup
	var closed atomic.Int64
	started := make(chan struct{}, 256)
	for i := range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				if j == 1 {
					started <- struct{}{}
				}
				// A call cut short by Close fails with its own error; the
				// next sees ErrClosed. (Returning at the first error, every
				// goroutine's call could be cut short, with none left to
				// see ErrClosed: it failed so under GOMAXPROCS=1.)
				if _, err := sluice.Take(context.Background(), s, fmt.Sprintf("close-%d", i), l, 1); errors.Is(err, ErrClosed) {
					closed.Add(1)
					return
				}
			}
		}()
	}
	for range 256 {
		<-started
	}
	s.Close()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Takes still waiting 10s after Close")
	}
	if n := closed.Load(); n != 256 {
		t.Fatalf("%d of 256 goroutines saw ErrClosed", n)
	}
}

// TestAlgorithmNumbers checks that sluice.Algorithm numbers the algorithms
// as take.lua does (alg in ARGV[3]), since a request carries
// byte(l.Algorithm).
func TestAlgorithmNumbers(t *testing.T) {
	t.Parallel()
	for alg, want := range map[sluice.Algorithm]int{
		sluice.FixedWindow: 0, sluice.SlidingWindow: 1, sluice.SlidingLog: 2,
		sluice.TokenBucket: 3, sluice.LeakyBucket: 4, sluice.GCRA: 5,
	} {
		if int(alg) != want {
			t.Errorf("%v is %d, take.lua's number is %d", alg, alg, want)
		}
	}
}

// TestLargeTakeAll decides a TakeAll of 1,500 requests, more keys than the
// script reads with one MGET, twice: the second sees the first's hits.
func TestLargeTakeAll(t *testing.T) {
	t.Parallel()
	s := open(t, "redis://"+testenv.RedisAddr(t), testConfig(nil))
	l := sluice.Limit{Rate: 2, Period: time.Hour}
	reqs := make([]sluice.Request, 1500)
	for i := range reqs {
		reqs[i] = sluice.Request{Key: fmt.Sprintf("{large}%d", i), Limit: l, Cost: 1}
	}
	ds := make([]sluice.Decision, len(reqs))
	for round, want := range []int64{1, 0} {
		if err := s.TakeAll(context.Background(), reqs, ds); err != nil {
			t.Fatal(err)
		}
		for i, d := range ds {
			if !d.Allowed || d.Remaining != want {
				t.Fatalf("round %d, request %d: %+v, want allowed with %d left", round+1, i, d, want)
			}
		}
	}
}

func TestRepeats(t *testing.T) {
	t.Parallel()
	long := func(dup bool) []string {
		keys := make([]string, 20)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%d", i)
		}
		if dup {
			keys[19] = "k3"
		}
		return keys
	}
	seen := map[string]struct{}{"k0": {}} // left over from another batch
	for _, tc := range []struct {
		name string
		keys []string
		seen map[string]struct{}
		want bool
	}{
		{"none", nil, nil, false},
		{"one", []string{"a"}, nil, false},
		{"short", []string{"a", "b", "c"}, nil, false},
		{"short repeat", []string{"a", "b", "a"}, nil, true},
		{"long", long(false), seen, false},
		{"long repeat", long(true), seen, true},
		{"long, no map", long(false), nil, false},
		{"long repeat, no map", long(true), nil, true},
	} {
		if got := repeats(tc.keys, tc.seen); got != tc.want {
			t.Errorf("%s: repeats = %v, want %v", tc.name, got, tc.want)
		}
	}
}
