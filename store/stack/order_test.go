package stack

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/envoykeys"
	"github.com/sluicehq/sluice/store/floodguard"
	"github.com/sluicehq/sluice/store/localfirst"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/persecond"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/regions"
)

// journal is what the recording fakes of a test did, in order.
type journal struct{ opened, calls, closed []string }

// rec is a recording fake of a store or a layer: TakeAll notes its name
// and passes the requests on to next, if any.
type rec struct {
	name string
	next sluice.Store
	j    *journal
}

func (r *rec) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	r.j.calls = append(r.j.calls, r.name)
	if r.next != nil {
		return r.next.TakeAll(ctx, reqs, ds)
	}
	for i := range reqs {
		ds[i] = sluice.Decision{Allowed: true, Limit: reqs[i].Limit.Capacity()}
	}
	return nil
}

func (r *rec) Close() error {
	r.j.closed = append(r.j.closed, r.name)
	return nil
}

// fakeMemory is the memory store's fake: it never blocks.
type fakeMemory struct{ rec }

func (*fakeMemory) NonBlocking() bool { return true }

// fakeRedis is a Redis store's fake, ready or not, with a veto that
// names it.
type fakeRedis struct {
	rec
	ready bool
}

func (f *fakeRedis) Ready() bool                   { return f.ready }
func (*fakeRedis) Ping(context.Context) error      { return nil }
func (*fakeRedis) Client() rueidis.Client          { return nil }
func (*fakeRedis) Conn() (rueidis.Client, error)   { return nil, errors.New("fake") }
func (*fakeRedis) SlotCounter() *redis.SlotCounter { return nil }
func (f *fakeRedis) CheckLimit(sluice.Limit) error { return errors.New(f.name) }

// fakeLayer is the local-first layers' fake, whose counters say one store
// call.
type fakeLayer struct{ rec }

func (*fakeLayer) Stats() Stats                  { return Stats{StoreCalls: 1} }
func (f *fakeLayer) Close(context.Context) error { return f.rec.Close() }

// fakeRegions is the regions layer's fake.
type fakeRegions struct{ rec }

func (*fakeRegions) Status() regions.Status           { return regions.Status{} }
func (*fakeRegions) Usage(string) (regions.Use, bool) { return regions.Use{}, false }

// nameOf returns the name of a fake store or layer.
func nameOf(s sluice.Store) string {
	switch v := s.(type) {
	case *fakeRedis:
		return v.name
	case *fakeRegions:
		return v.name
	}
	return "?"
}

// recPerSecond is store/persecond noting its name.
type recPerSecond struct {
	*persecond.Store
	j *journal
}

func (r recPerSecond) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	r.j.calls = append(r.j.calls, "persecond")
	return r.Store.TakeAll(ctx, reqs, ds)
}

// recWatcher is a Watcher that notes its calls.
type recWatcher struct{ j *journal }

func (w recWatcher) StartCall(ctx context.Context, _ []sluice.Request) context.Context {
	w.j.calls = append(w.j.calls, "watch")
	return ctx
}

func (w recWatcher) EndCall(context.Context, []sluice.Request, time.Duration, error) {
	w.j.calls = append(w.j.calls, "watched")
}

// fakeParts returns parts that record into j; the Redis stores are named
// by their URLs' hosts and are ready unless named in notReady.
func fakeParts(j *journal, notReady ...string) parts {
	open := func(name string, next sluice.Store) rec {
		j.opened = append(j.opened, name)
		return rec{name: name, next: next, j: j}
	}
	return parts{
		memory: func(memory.Config) (closer, error) { return &fakeMemory{open("memory", nil)}, nil },
		redis: func(rawURL string, _ redis.Config) (backend, error) {
			name := "redis " + rawURL[strings.Index(rawURL, "://")+3:]
			return &fakeRedis{rec: open(name, nil), ready: !slices.Contains(notReady, name)}, nil
		},
		floodguard: func(next sluice.Store, _ floodguard.Config) (sluice.Store, error) {
			return &rec{name: "floodguard", next: next, j: j}, nil
		},
		regions: func(home backend, _ []peerBackend, _ regions.Config, _ string) (regionLayer, error) {
			return &fakeRegions{open("regions over "+home.(*fakeRedis).name, home)}, nil
		},
		localFirst: func(next sluice.Store, _ localfirst.Config) (layer, error) {
			return &fakeLayer{open("localfirst over "+nameOf(next), next)}, nil
		},
		envoyKeys: func(next sluice.Store, _ backend, _ envoykeys.Config) sluice.Store {
			return &rec{name: "envoykeys", next: next, j: j}
		},
		perSecond: func(short, long sluice.Store) (router, error) {
			rt, err := persecond.New(short, long, persecond.Config{})
			return recPerSecond{rt, j}, err
		},
	}
}

// TestOrder pins the order of the layers: the layers a request of a
// second's limit and one of an hour's pass, outermost first, and those of
// the fail-local store. envoykeys is outside the near cache and leases
// (local-first), persecond outside both, floodguard only over memory, the
// observe hook (Config.Watchers) around all of them, and the fail-local
// store never guarded nor watched.
func TestOrder(t *testing.T) {
	t.Parallel()
	lf := func(host string) []string { return []string{"localfirst over redis " + host, "redis " + host} }
	cat := func(parts ...[]string) []string { return slices.Concat(parts...) }
	for _, tc := range []struct {
		name         string
		cfg          Config
		second, hour []string // the layers each request passes
		local        []string
	}{
		{"memory", Config{URL: "memory"}, []string{"memory"}, []string{"memory"}, []string{"memory"}},
		{"memory, flood guard", Config{URL: "memory", FloodGuard: true},
			[]string{"floodguard", "memory"}, []string{"floodguard", "memory"}, []string{"memory"}},
		{"redis", Config{URL: "redis://main"}, lf("main"), lf("main"), []string{"memory"}},
		{"redis, flood guard only over memory", Config{URL: "redis://main", FloodGuard: true},
			lf("main"), lf("main"), []string{"memory"}},
		{"redis, Envoy's keys", Config{URL: "redis://main", EnvoyKeys: true},
			cat([]string{"envoykeys"}, lf("main")), cat([]string{"envoykeys"}, lf("main")), []string{"memory"}},
		{"redis, per second", Config{URL: "redis://main", PerSecond: "redis://ps"},
			cat([]string{"persecond"}, lf("ps")), cat([]string{"persecond"}, lf("main")), []string{"memory"}},
		{"redis, per second, Envoy's keys", Config{URL: "redis://main", PerSecond: "redis://ps", EnvoyKeys: true},
			cat([]string{"persecond", "envoykeys"}, lf("ps")), cat([]string{"persecond", "envoykeys"}, lf("main")), []string{"memory"}},
		{"redis, regions between local-first and redis", regionsConfig, inRegions, inRegions, []string{"memory"}},
		{"redis, regions, Envoy's keys", withEnvoyKeys(regionsConfig),
			cat([]string{"envoykeys"}, inRegions), cat([]string{"envoykeys"}, inRegions), []string{"memory"}},
		{"redis, per second, Envoy's keys, watched", Config{URL: "redis://main", PerSecond: "redis://ps", EnvoyKeys: true, Watchers: []Watcher{recWatcher{}}},
			cat([]string{"watch", "persecond", "envoykeys"}, lf("ps"), []string{"watched"}),
			cat([]string{"watch", "persecond", "envoykeys"}, lf("main"), []string{"watched"}), []string{"memory"}},
		{"memory, flood guard, watched", Config{URL: "memory", FloodGuard: true, Watchers: []Watcher{recWatcher{}}},
			[]string{"watch", "floodguard", "memory", "watched"}, []string{"watch", "floodguard", "memory", "watched"}, []string{"memory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := &journal{}
			if len(tc.cfg.Watchers) > 0 { // the row's watcher, noting into j
				tc.cfg.Watchers = []Watcher{recWatcher{j}}
			}
			s, err := build(tc.cfg, fakeParts(j))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				period time.Duration
				store  sluice.Store
				want   []string
			}{{time.Second, s, tc.second}, {time.Hour, s, tc.hour}, {time.Second, s.Local(), tc.local}} {
				j.calls = nil
				if _, err := sluice.Take(context.Background(), c.store, "k", sluice.Limit{Rate: 1, Period: c.period}, 1); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(j.calls, c.want) {
					t.Errorf("a limit of %v passes %q, want %q", c.period, j.calls, c.want)
				}
			}
		})
	}
}

// regionsConfig is a Redis store in region eu, whose peer is us.
var regionsConfig = Config{URL: "redis://main", Region: "eu", Peers: []Peer{{"us", "redis://us"}}}

// inRegions are the layers a request passes in regionsConfig's stack.
var inRegions = []string{"localfirst over regions over redis main", "regions over redis main", "redis main"}

func withEnvoyKeys(c Config) Config {
	c.EnvoyKeys = true
	return c
}

// TestRegionsOpenClose: with regions, the peers' Redis are opened beside
// the home's, no request reaches them, and Close stops the regions layer
// before closing them.
func TestRegionsOpenClose(t *testing.T) {
	t.Parallel()
	j := &journal{}
	s, err := build(regionsConfig, fakeParts(j))
	if err != nil {
		t.Fatal(err)
	}
	if s.Regions() == nil {
		t.Error("no regions layer to ask for its status")
	}
	if want := []string{"memory", "redis main", "redis us", "regions over redis main", "localfirst over regions over redis main"}; !slices.Equal(j.opened, want) {
		t.Errorf("opened %q, want %q", j.opened, want)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"localfirst over regions over redis main", "regions over redis main", "redis us", "redis main", "memory"}; !slices.Equal(j.closed, want) {
		t.Errorf("closed %q, want %q", j.closed, want)
	}
	if m, _ := build(Config{URL: "redis://main"}, fakeParts(&journal{})); m.Regions() != nil {
		t.Error("a regions layer without a Region")
	}
}

// TestCapabilities checks what a Stack says its store can do, found when
// it was composed: never blocking on memory only, ready when every Redis
// is, the veto of the store a limit goes to, the layers' counters summed,
// and Close's order, layers before their stores.
func TestCapabilities(t *testing.T) {
	t.Parallel()
	j := &journal{}
	mem, err := build(Config{URL: "memory", FloodGuard: true}, fakeParts(j))
	if err != nil {
		t.Fatal(err)
	}
	if !mem.NonBlocking() || !mem.Ready() || mem.CheckLimit(sluice.Limit{}) != nil || mem.HasLocalFirst() {
		t.Errorf("memory: non-blocking %v, ready %v, veto %v, local-first %v; want true, true, nil, false",
			mem.NonBlocking(), mem.Ready(), mem.CheckLimit(sluice.Limit{}), mem.HasLocalFirst())
	}

	s, err := build(Config{URL: "redis://main", PerSecond: "redis://ps"}, fakeParts(j, "redis ps"))
	if err != nil {
		t.Fatal(err)
	}
	if s.NonBlocking() || s.Ready() {
		t.Errorf("redis with the per-second store down: non-blocking %v, ready %v; want false, false", s.NonBlocking(), s.Ready())
	}
	for _, c := range []struct {
		period time.Duration
		veto   string
	}{{time.Second, "redis ps"}, {time.Minute, "redis main"}} {
		if err := s.CheckLimit(sluice.Limit{Rate: 1, Period: c.period}); err == nil || err.Error() != c.veto {
			t.Errorf("veto on a limit of %v: %v, want %s's", c.period, err, c.veto)
		}
	}
	if st := s.Stats(); st.StoreCalls != 2 || !s.HasLocalFirst() {
		t.Errorf("Stats %+v: want the two layers' store calls summed", st)
	}
	j.closed = nil
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{"localfirst over redis ps", "redis ps", "localfirst over redis main", "redis main", "memory"}
	if !slices.Equal(j.closed, want) {
		t.Errorf("Close closed %q, want %q", j.closed, want)
	}
}

// TestConfigErrors checks that a Config that can never work is a
// *ConfigError naming its field, and that nothing is left open.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	flag := func(field string) string { return "--" + strings.ToLower(field) }
	for _, tc := range []struct {
		name  string
		cfg   Config
		field string
		text  string // with flag's names
	}{
		{"unknown store", Config{URL: "etcd://x"}, "URL", `--url "etcd://x": unknown store (want memory or a redis:// URL)`},
		{"Envoy's keys in memory", Config{EnvoyKeys: true}, "EnvoyKeys", "--envoykeys: Envoy's counters are in Redis; --url is memory"},
		{"sentinel auth in memory", Config{SentinelAuth: "x"}, "SentinelAuth", "--sentinelauth: --url is memory, not a redis+sentinel:// URL"},
		{"per second in memory", Config{PerSecond: "redis://ps"}, "PerSecond", "--persecond: --url is memory, which keeps every limit"},
		{"per second sentinel auth in memory", Config{PerSecondSentinelAuth: "x"}, "PerSecondSentinelAuth",
			"--persecondsentinelauth: --url is memory, with no --persecond"},
		{"sentinel auth without a sentinel", Config{URL: "redis://:pw@main", SentinelAuth: "x"}, "SentinelAuth",
			"--sentinelauth: --url redis://:xxxxx@main names no sentinel (want redis+sentinel://)"},
		{"per second sentinel auth without per second", Config{URL: "redis://main", PerSecondSentinelAuth: "x"}, "PerSecondSentinelAuth",
			"--persecondsentinelauth: there is no --persecond"},
		{"per second sentinel auth without a sentinel", Config{URL: "redis://main", PerSecond: "redis://ps", PerSecondSentinelAuth: "x"}, "PerSecondSentinelAuth",
			"--persecondsentinelauth: --persecond redis://ps names no sentinel (want redis+sentinel://)"},
		{"per second not a Redis", Config{URL: "redis://main", PerSecond: "memory"}, "PerSecond", `--persecond "memory": want a Redis URL`},
		{"negative jitter", Config{URL: "redis://main", ExpiryJitter: -time.Second}, "ExpiryJitter", "--expiryjitter -1s: want 0 or more"},
		{"negative lease", Config{URL: "redis://main", LeaseLifetime: -1}, "LeaseLifetime",
			"--leaselifetime, --maxlease, --syncinterval and --asyncnodes must be positive"},
		{"peers without a region", Config{URL: "redis://main", Peers: []Peer{{"us", "redis://us"}}}, "Peers", "--peers: peer regions without a --region"},
		{"regions in memory", Config{Region: "eu"}, "Region", "--region: regions meet in Redis; --url is memory"},
		{"regions with per second", Config{URL: "redis://main", PerSecond: "redis://ps", Region: "eu"}, "Region",
			"--region: not with --persecond, whose Redis has no peers"},
		{"a peer twice", Config{URL: "redis://main", Region: "eu", Peers: []Peer{{"us", "redis://a"}, {"us", "redis://b"}}}, "Peers",
			`--peers: region "us": each region once, with a name, this one (eu) not among them`},
		{"this region a peer", Config{URL: "redis://main", Region: "eu", Peers: []Peer{{"eu", "redis://a"}}}, "Peers",
			`--peers: region "eu": each region once, with a name, this one (eu) not among them`},
		{"a peer without a name", Config{URL: "redis://main", Region: "eu", Peers: []Peer{{"", "redis://a"}}}, "Peers",
			`--peers: region "": each region once, with a name, this one (eu) not among them`},
		{"a peer not a Redis", Config{URL: "redis://main", Region: "eu", Peers: []Peer{{"us", "memory"}}}, "Peers", `--peers: region us: "memory": want a Redis URL`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := &journal{}
			_, err := build(tc.cfg, fakeParts(j))
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("error %v, want a ConfigError of %s", err, tc.field)
			}
			if got := ce.Text(flag); got != tc.text {
				t.Errorf("Text: %q, want %q", got, tc.text)
			}
			if strings.Contains(err.Error(), ":pw@") {
				t.Errorf("error %q shows a password", err)
			}
			if len(j.closed) != len(j.opened) {
				t.Errorf("opened %q, closed %q", j.opened, j.closed)
			}
		})
	}
}
