package metrics

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// floodRules counts each address and each user under detailed_metric.
const floodRules = `
domain: api
descriptors:
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
`

// observer observes decisions of one descriptor, as the decision service
// hands them to Metrics.
type observer struct {
	t   testing.TB
	m   *Metrics
	set *rules.Set
}

func (o observer) decide(key, value string) {
	e := []rules.Entry{{Key: key, Value: value}}
	rule, err := o.set.Match("api", e)
	if err != nil || rule == nil {
		o.t.Fatalf("match %s=%s: %v", key, value, err)
	}
	r := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: e, Cost: 1}}}
	resp := &decide.Response{Statuses: []decide.Status{{Rule: rule, Limit: rule.Limits[0], Decision: sluice.Decision{Allowed: true, Limit: 100, Remaining: 50}}}}
	o.m.observe(r, resp)
}

// scrape returns /metrics as text.
func scrape(t testing.TB, reg *prometheus.Registry) string {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

func heapNow() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestDetailedBound: a flood of 100,000 distinct user ids on a
// detailed_metric rule, Envoy's counters on (each id their own labels),
// leaves the heap within the budget of the series named by values (a
// 256 KiB budget here) and a scrape small; the ids seen most have their
// series, the flood is counted under the rule's name. Before, each id kept
// 3 + 5 series forever: 300,000 addresses took the heap from 24 MB to
// 798 MB and a scrape to 104 MB.
func TestDetailedBound(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnvoyStats(reg, 0); err != nil {
		t.Fatal(err)
	}
	const budget = 256 << 10
	m.SetDetailedBytes(budget)
	set, err := rules.Parse("r.yaml", []byte(strings.ReplaceAll(floodRules, "key: user\n", "key: user\n    detailed_metric: true\n")))
	if err != nil {
		t.Fatal(err)
	}
	o := observer{t, m, set}
	o.decide("remote_address", "10.0.0.1") // the first series of each kind
	before := heapNow()
	for i := range 100_000 {
		o.decide("user", fmt.Sprintf("flood-%d", i))
		if i%10 == 0 {
			o.decide("user", "alice") // 10,000 of them, among the flood
		}
		if i%50 == 0 {
			o.decide("user", "bob")
		}
	}
	grew := int64(heapNow()) - int64(before)
	text := scrape(t, reg)
	t.Logf("the heap grew by %d bytes; a scrape is %d bytes; %d names kept", grew, len(text), len(m.detailed.kept))
	if grew > budget+256<<10 { // the budget, the sketch's 32 KiB, and room for the GC's accounting
		t.Errorf("the heap grew by %d bytes, above the budget of %d", grew, budget)
	}
	if len(text) > 256<<10 {
		t.Errorf("a scrape of %d bytes", len(text))
	}
	for _, want := range []string{
		`sluice_decisions_total{descriptor="api.user_alice",domain="api",result="ok"}`,
		`sluice_decisions_total{descriptor="api.user_bob",domain="api",result="ok"}`,
		`sluice_decisions_total{descriptor="api.user",domain="api",result="ok"}`,
		`ratelimit_service_rate_limit_total_hits{domain="api",key1="user_alice"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %s", want)
		}
	}
}

// TestDetailedNames: a value's name that a rule without values also
// gives (user=bob's key_value rule and a detailed_metric rule on user,
// both api.user_bob) keeps its series when the value is let go; Envoy's
// labels shared by two kept names stay until both are let go.
func TestDetailedNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnvoyStats(reg, 0); err != nil {
		t.Fatal(err)
	}
	set, err := rules.Parse("r.yaml", []byte(`
domain: api
descriptors:
  - key: user
    value: bob
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: team
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 100}
`))
	if err != nil {
		t.Fatal(err)
	}
	o := observer{t, m, set}
	o.decide("user", "bob")
	o.decide("remote_address", "10.0.0.1")
	o.decide("remote_address", "10.0.0.2") // Envoy labels api, remote_address_10, 0: shared
	m.detailed.pin("api.team_x")           // as if a rule without values named it
	o.decide("team", "x")
	m.SetDetailedBytes(1) // lets every value go
	text := scrape(t, reg)
	for _, c := range []struct {
		series string
		want   bool
	}{
		{`descriptor="api.user_bob"`, true},
		{`descriptor="api.team_x"`, true}, // pinned
		{`descriptor="api.remote_address_10.0.0.1"`, false},
		{`key1="remote_address_10"`, false},
	} {
		if strings.Contains(text, c.series) != c.want {
			t.Errorf("%s in a scrape: %v, want %v", c.series, !c.want, c.want)
		}
	}
}
