package decide_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// TestMain checks that no goroutine outlives the tests. Two of rueidis's
// own (TestElastic's Redis Cluster client) end by themselves after the
// client is closed, as store/redis's TestMain says.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}

// t0 is the fixed start of every test's clock: the start of a day, so
// that minute and second windows begin at t0.
var t0 = time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)

// clock is the tests' fake clock, which they move by hand.
type clock = clocktest.Clock

func newClock() *clock { return clocktest.New(t0) }

// loadRules writes yaml to a rules file in a fresh temporary directory and
// loads the directory, as the server does.
func loadRules(t testing.TB, yaml string) *rules.Set {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := rules.Load(dir)
	if err != nil {
		t.Fatalf("load rules: %v", err)
	}
	return set
}

// newMemory returns a memory store on clk.
func newMemory(t testing.TB, clk *clock) *memory.Store {
	t.Helper()
	cfg := memory.DefaultConfig()
	cfg.Now = clk.Now
	s, err := memory.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// stores are the stores a test of the store's part runs on, each opened
// on the test's clock: memory, one Redis and a Redis Cluster.
var stores = []struct {
	name string
	open func(t *testing.T, clk *clock) sluice.Store
}{
	{"memory", func(t *testing.T, clk *clock) sluice.Store { return newMemory(t, clk) }},
	{"redis", func(t *testing.T, clk *clock) sluice.Store {
		return openRedis(t, "redis://"+testenv.RedisAddr(t), clk)
	}},
	{"cluster", func(t *testing.T, clk *clock) sluice.Store {
		return openRedis(t, "redis+cluster://"+strings.Join(testenv.RedisClusterAddrs(t), ","), clk)
	}},
}

// openRedis opens a Redis store on clk whose keys are the test's own.
func openRedis(t *testing.T, url string, clk *clock) sluice.Store {
	t.Helper()
	cfg := redis.DefaultConfig()
	cfg.KeyPrefix = fmt.Sprintf("sluicetest:%x:", rand.Uint64())
	cfg.Now = clk.Now
	cfg.ExpiryMargin = 10 * time.Minute
	// Bounds on a hang only: the defaults (1s) failed handshakes and calls
	// on a loaded machine.
	cfg.DialTimeout, cfg.Timeout = 10*time.Second, 10*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := redis.Open(ctx, url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// newService returns a Service over set with cfg's other fields, the
// clock clk, a logger that discards and, when cfg has none, a memory store
// on clk.
func newService(t testing.TB, set *rules.Set, clk *clock, cfg decide.Config) *decide.Service {
	t.Helper()
	cfg.Rules = func() *rules.Set { return set }
	if cfg.Store == nil {
		cfg.Store = newMemory(t, clk)
	}
	cfg.Now = clk.Now
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := decide.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeNow(s) })
	return s
}

// closeNow closes s, cutting short at once the store calls of the fail
// mode local still in flight.
func closeNow(s *decide.Service) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.Close(ctx)
}

// syncBuilder is a strings.Builder safe for concurrent use: a log that
// goroutines of the fail mode local write to.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuilder) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuilder) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// req builds a request in domain with one descriptor per list of
// alternating keys and values, each of cost 1.
func req(domain string, descriptors ...[]string) *decide.Request {
	r := &decide.Request{Domain: domain}
	for _, kv := range descriptors {
		var d decide.Descriptor
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, decide.Entry{Key: kv[i], Value: kv[i+1]})
		}
		d.Cost = 1
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// withCost sets the cost of every descriptor of r.
func withCost(r *decide.Request, cost int64) *decide.Request {
	for i := range r.Descriptors {
		r.Descriptors[i].Cost = cost
	}
	return r
}

// fakeStore is a sluice.Store whose TakeAll calls a function, for faults
// a real store cannot be made to show on demand. It counts the calls.
type fakeStore struct {
	takeAll func(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error
	calls   atomic.Int64
}

func (f *fakeStore) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	f.calls.Add(1)
	return f.takeAll(ctx, reqs, ds)
}

// recorder is a sluice.Store that records the requests it passes on to a
// real store.
type recorder struct {
	sluice.Store
	mu    sync.Mutex
	calls [][]sluice.Request
}

func (r *recorder) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	r.mu.Lock()
	r.calls = append(r.calls, append([]sluice.Request(nil), reqs...))
	r.mu.Unlock()
	return r.Store.TakeAll(ctx, reqs, ds)
}

func (r *recorder) requests() []sluice.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rs []sluice.Request
	for _, c := range r.calls {
		rs = append(rs, c...)
	}
	return rs
}

// decide calls s.Decide and fails the test on an error.
func decideOK(t testing.TB, s *decide.Service, r *decide.Request) *decide.Response {
	t.Helper()
	resp, err := s.Decide(context.Background(), r)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if len(resp.Statuses) != len(r.Descriptors) {
		t.Fatalf("got %d statuses for %d descriptors", len(resp.Statuses), len(r.Descriptors))
	}
	return resp
}
