package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/stack"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)

const rulesYAML = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: export
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func loadRules(t *testing.T) *rules.Set {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rulesYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := rules.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// setup returns a registry, its Metrics and a Service that the Metrics
// observe, whose store is store, or a memory store when nil, watched by
// the Metrics as store/stack watches its outermost call.
func setup(t *testing.T, store sluice.Store, cfg decide.Config) (*prometheus.Registry, *metrics.Metrics, *decide.Service) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if store == nil {
		mc := memory.DefaultConfig()
		mc.Now = func() time.Time { return t0 }
		mem, err := memory.New(mc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mem.Close() })
		store = mem
	}
	set := loadRules(t)
	cfg.Rules = func() *rules.Set { return set }
	cfg.Store = watched{store, m}
	cfg.Now = func() time.Time { return t0 }
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Observers = append(cfg.Observers, m)
	s, err := decide.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.WatchMode(s.Mode)
	return reg, m, s
}

// watched calls m's store hooks around each call of next, as store/stack
// calls its Watchers.
type watched struct {
	next sluice.Store
	m    *metrics.Metrics
}

// NonBlocking says what next says, as store/stack does (decide.NonBlocking):
// hiding it would make the memory store a blocking one, whose every call
// goes to a goroutine given the 50ms store timeout, and a loaded machine
// that did not run it in time turned decisions local.
func (w watched) NonBlocking() bool {
	nb, ok := w.next.(decide.NonBlocking)
	return ok && nb.NonBlocking()
}

func (w watched) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	ctx = w.m.StartCall(ctx, reqs)
	t := time.Now()
	err := w.next.TakeAll(ctx, reqs, ds)
	w.m.EndCall(ctx, reqs, time.Since(t), err)
	return err
}

func request(domain string, kv ...string) *decide.Request {
	r := &decide.Request{Domain: domain, Descriptors: []decide.Descriptor{{Cost: 1}}}
	for i := 0; i+1 < len(kv); i += 2 {
		r.Descriptors[0].Entries = append(r.Descriptors[0].Entries, decide.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return r
}

func TestObserve(t *testing.T) {
	t.Parallel()
	reg, _, d := setup(t, nil, decide.DefaultConfig())
	ctx := context.Background()
	for _, r := range []*decide.Request{
		request("api", "user", "alice"),
		request("api", "user", "alice"),
		request("api", "user", "bob"),
		request("api", "tenant", "acme"),
		request("api", "tenant", "acme"),
		request("api", "export", "x"),
		request("api", "export", "x"),
		request("api", "plan", "gold"),
		request("other", "user", "alice"),
	} {
		if _, err := d.Decide(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Decide(ctx, request("", "user", "x")); !errors.Is(err, decide.ErrInvalidRequest) {
		t.Fatalf("Decide(no domain) = %v, want ErrInvalidRequest", err)
	}
	// user counts per rule (no values: bounded), tenant per value
	// (detailed_metric), export's second decision is a shadow over limit,
	// plan matched no rule.
	want := `
# HELP sluice_decisions_total Descriptors decided, by domain, descriptor (Envoy's stat name of the matched rule, with the request's values only for detailed_metric and value_to_metric; empty when no rule matched) and result (ok, over_limit, shadow_over_limit).
# TYPE sluice_decisions_total counter
sluice_decisions_total{descriptor="",domain="api",result="ok"} 1
sluice_decisions_total{descriptor="",domain="api",result="over_limit"} 0
sluice_decisions_total{descriptor="",domain="api",result="shadow_over_limit"} 0
sluice_decisions_total{descriptor="api.export",domain="api",result="ok"} 1
sluice_decisions_total{descriptor="api.export",domain="api",result="over_limit"} 0
sluice_decisions_total{descriptor="api.export",domain="api",result="shadow_over_limit"} 1
sluice_decisions_total{descriptor="api.tenant_acme",domain="api",result="ok"} 1
sluice_decisions_total{descriptor="api.tenant_acme",domain="api",result="over_limit"} 1
sluice_decisions_total{descriptor="api.tenant_acme",domain="api",result="shadow_over_limit"} 0
sluice_decisions_total{descriptor="api.user",domain="api",result="ok"} 2
sluice_decisions_total{descriptor="api.user",domain="api",result="over_limit"} 1
sluice_decisions_total{descriptor="api.user",domain="api",result="shadow_over_limit"} 0
# HELP sluice_unknown_domain_requests_total Requests for a domain no rules define, answered OK with no limit.
# TYPE sluice_unknown_domain_requests_total counter
sluice_unknown_domain_requests_total 1
# HELP sluice_invalid_requests_total Requests rejected as invalid: no domain, no descriptors, an entry without a key.
# TYPE sluice_invalid_requests_total counter
sluice_invalid_requests_total 1
# HELP sluice_mode Where decisions come from: 1 for the mode in force (store, fail_open, fail_closed, local, slow), 0 for the others.
# TYPE sluice_mode gauge
sluice_mode{mode="fail_closed"} 0
sluice_mode{mode="fail_open"} 0
sluice_mode{mode="local"} 0
sluice_mode{mode="slow"} 0
sluice_mode{mode="store"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"sluice_decisions_total", "sluice_unknown_domain_requests_total", "sluice_invalid_requests_total", "sluice_mode"); err != nil {
		t.Error(err)
	}
	// 7 decisions with a limit went to the store.
	if n := histogramCount(t, reg, "sluice_store_duration_seconds", "take_all"); n != 7 {
		t.Errorf("store latency observed %d times, want 7", n)
	}
	if d.Mode() != decide.ModeStore {
		t.Errorf("Mode() = %v, want store", d.Mode())
	}
}

// histogramCount returns the sample count of the histogram name with op.
func histogramCount(t *testing.T, g prometheus.Gatherer, name, op string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// fakeStore is a store that fails every call with err.
type fakeStore struct{ err error }

func (f fakeStore) Take(context.Context, string, sluice.Limit, int64) (sluice.Decision, error) {
	return sluice.Decision{}, f.err
}

func (f fakeStore) TakeAll(context.Context, []sluice.Request, []sluice.Decision) error { return f.err }

func TestStoreFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		err    error
		fail   decide.Fail
		reason string
		mode   string
		calls  float64 // that reach the store
	}{
		// A timeout is a slow store, not a failing one: the breaker waits
		// for its window, and the limits hold.
		{name: "timeout, fail open", err: context.DeadlineExceeded, fail: decide.FailOpen, reason: "timeout", mode: "slow", calls: 3},
		{name: "refused, fail closed", err: errors.New("connection refused"), fail: decide.FailClosed, reason: "error", mode: "fail_closed", calls: 2},
		// Redis at its maxmemory under noeviction: counted apart, so that
		// an alert can tell a full store from a failing one.
		{name: "full, fail closed", err: fmt.Errorf("%w: OOM command not allowed", sluice.ErrStoreFull), fail: decide.FailClosed, reason: "oom", mode: "fail_closed", calls: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := decide.DefaultConfig()
			cfg.Fail, cfg.BreakerFailures = tt.fail, 2
			reg, _, d := setup(t, fakeStore{fmt.Errorf("redis take all: %w", tt.err)}, cfg)
			for range 3 {
				if _, err := d.Decide(context.Background(), request("api", "user", "alice")); err != nil {
					t.Fatal(err)
				}
			}
			// Refused: two calls failed, then the breaker kept the third from
			// the store.
			got, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, reason := range []string{"timeout", "oom", "error"} {
				want := 0.0
				if reason == tt.reason {
					want = tt.calls
				}
				if v := value(got, "sluice_store_errors_total", "reason", reason); v != want {
					t.Errorf("store errors{reason=%q} = %v, want %v", reason, v, want)
				}
			}
			if v := value(got, "sluice_fail_mode_decisions_total", "mode", tt.mode); v != 3 {
				t.Errorf("fail mode decisions %v, want 3", v)
			}
			if v := value(got, "sluice_mode", "mode", tt.mode); v != 1 {
				t.Errorf("sluice_mode{mode=%q} = %v, want 1", tt.mode, v)
			}
			if v := value(got, "sluice_mode", "mode", "store"); v != 0 {
				t.Errorf("sluice_mode{mode=store} = %v, want 0", v)
			}
		})
	}
}

// value returns the value of the counter or gauge name whose label is v,
// or of its only series when label is empty; -1 when there is none.
func value(mfs []*dto.MetricFamily, name, label, v string) float64 {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetName() == label && l.GetValue() == v
			}
			if !match {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func TestReload(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		err     error
		success float64
		failure float64
		last    float64
	}{
		{name: "first load", err: nil, success: 1, failure: 0, last: 1},
		{name: "broken edit", err: errors.New("rules.yaml:3: unknown key"), success: 1, failure: 1, last: 0},
		{name: "fixed", err: nil, success: 2, failure: 1, last: 1},
	}
	for _, st := range steps {
		m.Reload(st.err)
		got, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if s, f := value(got, "sluice_rules_reloads_total", "result", "success"), value(got, "sluice_rules_reloads_total", "result", "failure"); s != st.success || f != st.failure {
			t.Errorf("%s: reloads success %v failure %v, want %v %v", st.name, s, f, st.success, st.failure)
		}
		if v := value(got, "sluice_rules_last_reload_successful", "", ""); v != st.last {
			t.Errorf("%s: last reload successful %v, want %v", st.name, v, st.last)
		}
	}
}

func TestNewTwice(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg); err == nil {
		t.Error("a second New on one registry succeeded, want a duplicate registration error")
	}
}

// BenchmarkObserve measures what the Metrics add to a decision of one
// descriptor on the memory store as its observer: run it beside decide's
// BenchmarkDecide.
func BenchmarkObserve(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rulesYAML), 0o600); err != nil {
		b.Fatal(err)
	}
	set, err := rules.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	// The memory store as the server composes it: its calls watched by m.
	st, err := stack.New(stack.Config{URL: "memory", Watchers: []stack.Watcher{m}})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close(context.Background())
	service := func(o ...decide.Observer) *decide.Service {
		cfg := decide.DefaultConfig()
		cfg.Rules = func() *rules.Set { return set }
		cfg.Store = st
		cfg.Observers = o
		s, err := decide.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	reqs := make([]*decide.Request, 10000)
	for i := range reqs {
		reqs[i] = request("api", "user", fmt.Sprint("user-", i))
	}
	// Envoy's counters too (--envoy-metrics), on a registry of their own.
	reg := prometheus.NewRegistry()
	me, err := metrics.New(reg)
	if err != nil {
		b.Fatal(err)
	}
	if err := me.EnvoyStats(reg, 0); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		d    decide.Decider
	}{
		{name: "service", d: service()},
		{name: "observed", d: service(m)},
		{name: "envoy", d: service(me)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			i := 0
			for b.Loop() {
				if _, err := bc.d.Decide(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
