package envoykeys_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/envoykeys"
	"github.com/sluicehq/sluice/store/memory"
)

// t0 is the tests' clock: 30 s into a minute, so that minute windows
// start 30 s before it.
var t0 = time.Date(2026, 11, 23, 15, 0, 30, 0, time.UTC)

// rulesYAML are the rules of the tests: an Envoy-style limit, a shared
// threshold, two fixed windows on one descriptor (which keep sluice's
// keys) and a token bucket.
const rulesYAML = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    value: "t*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plan
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 2}
`

// fixture is a decision service whose Envoy keys go to a real Redis.
type fixture struct {
	svc    *decide.Service
	redis  rueidis.Client
	prefix string // Envoy's CACHE_KEY_PREFIX, unique to the test
	clk    *clocktest.Clock
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureOn(t, []string{testenv.RedisAddr(t)})
}

// newFixtureOn is newFixture on the Redis at addrs: a standalone server
// or the nodes of a cluster.
func newFixtureOn(t *testing.T, addrs []string, opts ...func(*envoykeys.Config)) *fixture {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktest.New(t0)
	mc := memory.DefaultConfig()
	mc.Now = clk.Now
	mem, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	f := &fixture{redis: c, clk: clk, prefix: fmt.Sprintf("test%d_", time.Now().UnixNano())}
	cfg := envoykeys.Config{Now: clk.Now, Prefix: f.prefix}
	for _, o := range opts {
		o(&cfg)
	}
	store := envoykeys.New(mem, func() rueidis.Client { return c }, cfg)
	f.svc, err = decide.New(decide.Config{
		Rules:  func() *rules.Set { return set },
		Store:  store,
		Now:    clk.Now,
		Logger: slog.New(slog.DiscardHandler),
		// The tests read Redis's answers: a decision must never come from
		// the fail mode because a loaded machine took longer than the
		// default 50ms for a round trip (it did: 'sluice's 4th hit: OK').
		// This is only a bound on a hang.
		StoreTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// envoyHit sends what Envoy's ratelimit sends to count hits on key in a
// window of period seconds (its fixed cache, without jitter): one pipeline
// of INCRBY and EXPIRE. It returns the count after.
func (f *fixture) envoyHit(t *testing.T, key string, hits, period int64) int64 {
	t.Helper()
	res := f.redis.DoMulti(context.Background(),
		f.redis.B().Incrby().Key(key).Increment(hits).Build(),
		f.redis.B().Expire().Key(key).Seconds(period).Build())
	n, err := res[0].AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if err := res[1].Error(); err != nil {
		t.Fatal(err)
	}
	return n
}

// get returns the count under key, 0 when there is none.
func (f *fixture) get(t *testing.T, key string) int64 {
	t.Helper()
	n, err := f.redis.Do(context.Background(), f.redis.B().Get().Key(key).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ttl returns the seconds key has to live.
func (f *fixture) ttl(t *testing.T, key string) int64 {
	t.Helper()
	n, err := f.redis.Do(context.Background(), f.redis.B().Ttl().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// decide decides one request of descriptors, each a list of key, value
// pairs, with cost 1.
func (f *fixture) decide(t *testing.T, descs ...[]string) *decide.Response {
	t.Helper()
	r := &decide.Request{Domain: "api"}
	for _, kv := range descs {
		d := decide.Descriptor{Cost: 1}
		for i := 0; i < len(kv); i += 2 {
			d.Entries = append(d.Entries, decide.Entry{Key: kv[i], Value: kv[i+1]})
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	resp, err := f.svc.Decide(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Mode != decide.ModeStore {
		t.Fatalf("decided in %v, not by the store", resp.Mode)
	}
	return resp
}

// window returns the start of t0's window of period seconds, as Envoy's
// key writes it.
func window(period int64) string { return strconv.FormatInt(t0.Unix()/period*period, 10) }

func TestEnvoyWritesSluiceReads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		addrs func(testing.TB) []string
	}{
		{"single", func(t testing.TB) []string { return []string{testenv.RedisAddr(t)} }},
		// Envoy's keys have no hash tags: each lands in its own slot.
		{"cluster", testenv.RedisClusterAddrs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			envoyWritesSluiceReads(t, newFixtureOn(t, tc.addrs(t)))
		})
	}
}

func envoyWritesSluiceReads(t *testing.T, f *fixture) {
	key := f.prefix + "api_user_alice_" + window(60)
	if n := f.envoyHit(t, key, 2, 60); n != 2 {
		t.Fatalf("Envoy's INCRBY: %d, want 2", n)
	}
	resp := f.decide(t, []string{"user", "alice"})
	if st := resp.Statuses[0]; resp.Overall != decide.OK || st.Decision.Remaining != 0 {
		t.Fatalf("sluice after Envoy's 2 of 3: %v, remaining %d; want OK, 0", resp.Overall, st.Decision.Remaining)
	}
	resp = f.decide(t, []string{"user", "alice"})
	if st := resp.Statuses[0]; resp.Overall != decide.OverLimit || st.Decision.RetryAfter != 30*time.Second {
		t.Fatalf("sluice's 4th hit: %v, retry after %v; want OVER_LIMIT, 30s (the window's end)", resp.Overall, st.Decision.RetryAfter)
	}
	// Envoy's counting: the denied hit is counted too.
	if n := f.get(t, key); n != 4 {
		t.Errorf("count %d after a denied hit, want 4 (Envoy counts denied hits)", n)
	}
	if ttl := f.ttl(t, key); ttl <= 0 || ttl > 60 {
		t.Errorf("TTL %d, want within (0, 60]: sluice's EXPIRE is Envoy's", ttl)
	}
	// The next window is another key.
	f.clk.Advance(30 * time.Second)
	if resp := f.decide(t, []string{"user", "alice"}); resp.Overall != decide.OK || resp.Statuses[0].Decision.Remaining != 2 {
		t.Errorf("next window: %v, remaining %d; want OK, 2", resp.Overall, resp.Statuses[0].Decision.Remaining)
	}
	next := f.prefix + "api_user_alice_" + strconv.FormatInt(t0.Unix()/60*60+60, 10)
	if n := f.get(t, next); n != 1 {
		t.Errorf("next window's key %s: %d, want 1", next, n)
	}
}

func TestSluiceWritesEnvoyReads(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for range 2 {
		if resp := f.decide(t, []string{"user", "bob"}); resp.Overall != decide.OK {
			t.Fatalf("sluice: %v, want OK", resp.Overall)
		}
	}
	key := f.prefix + "api_user_bob_" + window(60)
	if n := f.get(t, key); n != 2 {
		t.Fatalf("Envoy's key %s holds %d, want sluice's 2", key, n)
	}
	// Envoy's third hit is within 3, its fourth over.
	if n := f.envoyHit(t, key, 1, 60); n != 3 {
		t.Errorf("Envoy's third hit: count %d, want 3 (within the limit)", n)
	}
	if resp := f.decide(t, []string{"user", "bob"}); resp.Overall != decide.OverLimit {
		t.Errorf("sluice after Envoy's hit: %v, want OVER_LIMIT", resp.Overall)
	}

	// A shared threshold: Envoy's key holds the pattern.
	f.decide(t, []string{"tenant", "t1"})
	f.decide(t, []string{"tenant", "t2"})
	if n := f.get(t, f.prefix+"api_tenant_t*_"+window(3600)); n != 2 {
		t.Errorf("shared threshold key: %d, want 2", n)
	}
	// A request's own limit of the rules' unit counts in the same key.
	r := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Cost: 1,
		Entries: []decide.Entry{{Key: "user", Value: "carol"}}, Limit: &rules.RequestLimit{RequestsPerUnit: 10, Unit: "minute"}}}}
	if _, err := f.svc.Decide(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if n := f.get(t, f.prefix+"api_user_carol_"+window(60)); n != 1 {
		t.Errorf("request limit's key: %d, want 1", n)
	}
}

// TestOwnKeys checks what keeps sluice's keys and counting: two fixed
// windows of one descriptor (whose Envoy keys would collide), other
// algorithms, and a request's other limits when an Envoy key denies it.
func TestOwnKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.decide(t, []string{"plan", "gold"})
	for _, p := range []int64{60, 3600} {
		if k := f.prefix + "api_plan_gold_" + window(p); f.get(t, k) != 0 {
			t.Errorf("two fixed windows wrote Envoy's key %s", k)
		}
	}
	// ip's token bucket (burst 2) beside user dave over his limit: the
	// denied requests take none of the bucket.
	key := f.prefix + "api_user_dave_" + window(60)
	f.envoyHit(t, key, 3, 60)
	for i := range 3 {
		resp := f.decide(t, []string{"user", "dave"}, []string{"ip", "10.0.0.1"})
		ip := resp.Statuses[1]
		if resp.Overall != decide.OverLimit || ip.Code != decide.OK || ip.Decision.Remaining != 2 {
			t.Fatalf("call %d: %v, ip %v remaining %d; want OVER_LIMIT, ip OK with 2 (untouched)", i, resp.Overall, ip.Code, ip.Decision.Remaining)
		}
	}
	if resp := f.decide(t, []string{"ip", "10.0.0.1"}); resp.Overall != decide.OK || resp.Statuses[0].Decision.Remaining != 1 {
		t.Errorf("ip alone: %v, remaining %d; want OK, 1 (the bucket was full)", resp.Overall, resp.Statuses[0].Decision.Remaining)
	}
	if n := f.get(t, key); n != 6 {
		t.Errorf("dave's count %d, want 6: Envoy's counting counts the denied hits", n)
	}
}

// takeEnvoy decides a hit of l counted under Envoy's key of domain and
// entries (key, value pairs).
func takeEnvoy(s sluice.Store, l sluice.Limit, domain string, kv ...string) (sluice.Decision, error) {
	r := sluice.Request{Key: "own:" + domain, Limit: l, Cost: 1, Envoy: sluice.Descriptor{Domain: domain}}
	for i := 0; i < len(kv); i += 2 {
		r.Envoy.Entries = append(r.Envoy.Entries, sluice.Entry{Key: kv[i], Value: kv[i+1]})
	}
	var d [1]sluice.Decision
	err := s.TakeAll(context.Background(), []sluice.Request{r}, d[:])
	return d[0], err
}

func TestNotConnected(t *testing.T) {
	t.Parallel()
	mem, err := memory.New(memory.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	s := envoykeys.New(mem, func() rueidis.Client { return nil }, envoykeys.Config{})
	l := sluice.Limit{Rate: 1, Period: time.Minute}
	if _, err := takeEnvoy(s, l, "api", "user", "x"); !errors.Is(err, envoykeys.ErrNotConnected) {
		t.Errorf("Take: %v, want ErrNotConnected", err)
	}
	// Other keys go to the store it decorates.
	if d, err := sluice.Take(context.Background(), s, "own", l, 1); err != nil || !d.Allowed {
		t.Errorf("Take(own key) = %+v, %v; want allowed", d, err)
	}
}

// TestNotEnvoyLimit checks that an Envoy key with a limit Envoy's format
// cannot count is refused as a limit error, with nothing counted.
func TestNotEnvoyLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := envoykeys.New(nil, func() rueidis.Client { return f.redis }, envoykeys.Config{Now: f.clk.Now, Prefix: f.prefix})
	for _, l := range []sluice.Limit{
		{Rate: 1, Period: time.Minute, Algorithm: sluice.TokenBucket},
		{Rate: 1, Period: 1500 * time.Millisecond},
		{Rate: 1, Period: 500 * time.Millisecond},
	} {
		key := f.prefix + "x_"
		if _, err := takeEnvoy(s, l, "x"); !errors.Is(err, sluice.ErrLimit) {
			t.Errorf("Take(%s) = %v, want ErrLimit", l, err)
		}
		if n, err := f.redis.Do(context.Background(), f.redis.B().Keys().Pattern(key+"*").Build()).AsStrSlice(); err != nil || len(n) != 0 {
			t.Errorf("Take(%s) wrote %v (%v)", l, n, err)
		}
	}
}

// TestStopIncrementWhenOverLimit: with Envoy's
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, a request one of whose keys
// would go over its limit counts its hits on that key alone, as Envoy's
// ratelimit does; without it, on every key (alice's count went to 1).
func TestStopIncrementWhenOverLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		stop  bool
		alice int64 // alice's count after the denied request
	}{
		{"Envoy's default", false, 1},
		{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixtureOn(t, []string{testenv.RedisAddr(t)}, func(c *envoykeys.Config) { c.StopIncrementWhenOverLimit = tc.stop })
			bob, alice := f.prefix+"api_user_bob_"+window(60), f.prefix+"api_user_alice_"+window(60)
			f.envoyHit(t, bob, 3, 60) // bob's limit, 3 a minute, used up
			resp := f.decide(t, []string{"user", "bob"}, []string{"user", "alice"})
			if resp.Overall != decide.OverLimit || resp.Statuses[1].Code != decide.OK {
				t.Fatalf("bob and alice: %v, alice %v; want OVER_LIMIT, alice OK", resp.Overall, resp.Statuses[1].Code)
			}
			if n := f.get(t, bob); n != 4 {
				t.Errorf("bob's count %d, want 4: the key over its limit counts the hit", n)
			}
			if n := f.get(t, alice); n != tc.alice {
				t.Errorf("alice's count %d, want %d", n, tc.alice)
			}
			// Within every limit, every key counts.
			f.decide(t, []string{"user", "carol"}, []string{"user", "alice"})
			if n := f.get(t, alice); n != tc.alice+1 {
				t.Errorf("alice's count %d after a request within the limits, want %d", n, tc.alice+1)
			}
		})
	}
}
