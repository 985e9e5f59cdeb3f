package metrics_test

import (
	"context"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/decide"
)

// envoyValue returns the counter ratelimit_service_rate_limit_<name> of
// domain api and key1, or -1 when there is none.
func envoyValue(mfs []*dto.MetricFamily, name, key1 string) float64 {
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_service_rate_limit_"+name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["domain"] == "api" && labels["key1"] == key1 && labels["key2"] == "" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// TestEnvoyStats decides, observed by Metrics, with Envoy's counters on and
// checks them by the names Envoy's Prometheus mapping gives them.
func TestEnvoyStats(t *testing.T) {
	t.Parallel()
	reg, m, d := setup(t, nil, decide.DefaultConfig())
	if err := m.EnvoyStats(reg, 0); err != nil {
		t.Fatal(err)
	}
	m.Reload(nil)
	ctx := context.Background()
	for _, r := range []*decide.Request{
		request("api", "user", "alice"), // 1 a minute: OK, the last hit (near)
		request("api", "user", "alice"), // over
		request("api", "user", "alice"), // over
		request("api", "export", "x"),   // shadow, 1 a minute: OK
		request("api", "export", "x"),   // shadow: allowed, counted over and shadow
		request("api", "tenant", "t1"),  // detailed_metric: its own series
		request("api", "nobody", "x"),   // no rule: no Envoy counters
	} {
		if _, err := d.Decide(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	big := request("api", "user", "bob")
	big.Descriptors[0].Cost = 5 // over a limit of 1 at once: 5 hits over
	if _, err := d.Decide(ctx, big); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, key1 string
		want       float64
	}{
		{"total_hits", "user", 8},
		{"within_limit", "user", 1},
		{"near_limit", "user", 2}, // alice's first, and bob's 1 of 5 below the limit
		{"over_limit", "user", 6}, // alice's two, bob's 4 past the limit
		{"shadow_mode", "user", 0},
		{"total_hits", "export", 2},
		{"within_limit", "export", 1},
		{"over_limit", "export", 1},
		{"shadow_mode", "export", 1},
		{"total_hits", "tenant_t1", 1},
		{"total_hits", "nobody", -1},
	} {
		if got := envoyValue(mfs, tt.name, tt.key1); got != tt.want {
			t.Errorf("%s{key1=%q} = %v, want %v", tt.name, tt.key1, got, tt.want)
		}
	}
	if got := value(mfs, "ratelimit_service_config_load_success", "", ""); got != 1 {
		t.Errorf("ratelimit_service_config_load_success = %v, want 1", got)
	}
}

// TestEnvoyStatsRatio checks that a ratio outside [0, 1] is refused.
func TestEnvoyStatsRatio(t *testing.T) {
	t.Parallel()
	reg, m, _ := setup(t, nil, decide.DefaultConfig())
	if err := m.EnvoyStats(reg, 1.5); err == nil {
		t.Error("EnvoyStats(1.5) succeeded")
	}
}

// TestFlushEnvoy checks what FlushEnvoy hands statsd: each of Envoy's
// counters by its statsd name, with what it counted since the last
// flush, and nothing for what did not count.
func TestFlushEnvoy(t *testing.T) {
	t.Parallel()
	reg, m, d := setup(t, nil, decide.DefaultConfig())
	flush := func() map[string]uint64 {
		got := map[string]uint64{}
		m.FlushEnvoy(func(name string, delta uint64) {
			if _, dup := got[name]; dup {
				t.Errorf("%s sent twice in one flush", name)
			}
			got[name] = delta
		})
		return got
	}
	if got := flush(); len(got) != 0 {
		t.Errorf("FlushEnvoy without EnvoyStats sent %v", got)
	}
	if err := m.EnvoyStats(reg, 0); err != nil {
		t.Fatal(err)
	}
	m.Reload(nil)
	ctx := context.Background()
	for _, r := range []*decide.Request{
		request("api", "user", "alice"), // 1 a minute: OK, near (past 0.8 of 1)
		request("api", "user", "alice"), // over
		request("api", "export", "x"),   // shadow, 1 a minute: OK
		request("api", "export", "x"),   // shadow: over and shadow
		request("api", "nobody", "x"),   // no rule: nothing
	} {
		if _, err := d.Decide(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]uint64{
		"ratelimit.service.rate_limit.api.user.total_hits":     2,
		"ratelimit.service.rate_limit.api.user.within_limit":   1,
		"ratelimit.service.rate_limit.api.user.near_limit":     1,
		"ratelimit.service.rate_limit.api.user.over_limit":     1,
		"ratelimit.service.rate_limit.api.export.total_hits":   2,
		"ratelimit.service.rate_limit.api.export.within_limit": 1,
		"ratelimit.service.rate_limit.api.export.near_limit":   1,
		"ratelimit.service.rate_limit.api.export.over_limit":   1,
		"ratelimit.service.rate_limit.api.export.shadow_mode":  1,
		"ratelimit.service.config_load_success":                1,
	}
	got := flush()
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s = %d, want %d", name, got[name], n)
		}
	}
	for name, n := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s = %d sent, want nothing", name, n)
		}
	}
	if got := flush(); len(got) != 0 {
		t.Errorf("a flush after nothing counted sent %v", got)
	}
	if _, err := d.Decide(ctx, request("api", "user", "alice")); err != nil {
		t.Fatal(err)
	}
	got = flush()
	if got["ratelimit.service.rate_limit.api.user.total_hits"] != 1 || got["ratelimit.service.rate_limit.api.user.over_limit"] != 1 || len(got) != 2 {
		t.Errorf("a flush after one more over-limit hit sent %v, want total_hits and over_limit 1", got)
	}
}
