package rules

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestConcurrencyPriority: concurrency and priority are read, bounded and
// refused at their lines; a descriptor with only a concurrency matches.
func TestConcurrencyPriority(t *testing.T) {
	t.Parallel()
	set, err := Parse("r.yaml", []byte(`
domain: api
descriptors:
  - key: user
    concurrency: 20
    priority: critical
  - key: path
    value: /batch
    priority: sheddable
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: plain
    descriptors:
      - key: x
        concurrency: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := set.Match("api", []Entry{{Key: "user", Value: "bob"}})
	if err != nil || r == nil || r.Concurrency != 20 || r.Priority != PriorityCritical || len(r.ConcurrencyID) != 16 {
		t.Fatalf("user: %+v %v", r, err)
	}
	r2, _ := set.Match("api", []Entry{{Key: "path", Value: "/batch"}})
	if r2 == nil || r2.Priority != PrioritySheddable || r2.Concurrency != 0 || r2.ConcurrencyID != "" {
		t.Fatalf("path: %+v", r2)
	}
	if r, _ := set.Match("api", []Entry{{Key: "plain", Value: "p"}}); r != nil {
		t.Fatalf("a descriptor with nothing to apply matched: %+v", r)
	}
	r3, _ := set.Match("api", []Entry{{Key: "plain", Value: "p"}, {Key: "x", Value: "1"}})
	if r3 == nil || r3.Priority != "" || r3.ConcurrencyID == r.ConcurrencyID {
		t.Fatalf("nested: %+v", r3)
	}

	for _, tc := range []struct{ name, yaml, want string }{
		{"zero", "concurrency: 0", "r.yaml:4: concurrency: must be at least 1, got 0"},
		{"negative", "concurrency: -3", "r.yaml:4: concurrency: must be between 1 and 100000, got -3"},
		{"huge", "concurrency: 100001", "r.yaml:4: concurrency: must be between 1 and 100000, got 100001"},
		{"word", "concurrency: many", "r.yaml:4: concurrency: want a whole number"},
		{"priority", "priority: urgent", `r.yaml:4: priority: want critical, default or sheddable, got "urgent"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("r.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    "+tc.yaml+"\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestElasticRules: throttling: elastic needs elastic_percent and the
// domain's capacity; the ceiling less the limit is the excess.
func TestElasticRules(t *testing.T) {
	t.Parallel()
	set, err := Parse("r.yaml", []byte(`
domain: api
capacity: {unit: second, requests_per_unit: 1000}
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 30, throttling: elastic, elastic_percent: 50}
`))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := set.Match("api", []Entry{{Key: "user", Value: "u"}})
	l := r.Limits[0]
	if l.Throttling != Elastic || l.Pool == nil || l.Pool.Limit.Rate != 1000 || l.Excess().Rate != 15 || l.Enforced() != l.Limit || l.Pool.ID == l.ID {
		t.Fatalf("elastic limit %+v, pool %+v, excess %v", l, l.Pool, l.Excess())
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"no capacity", "domain: api\ndescriptors:\n  - key: u\n    rate_limit: {unit: second, requests_per_unit: 5, throttling: elastic, elastic_percent: 100}\n",
			"r.yaml:4: throttling: elastic needs the domain's capacity"},
		{"no percent", "domain: api\ncapacity: {unit: second, requests_per_unit: 5}\ndescriptors:\n  - key: u\n    rate_limit: {unit: second, requests_per_unit: 5, throttling: elastic}\n",
			"r.yaml:5: throttling: elastic needs elastic_percent"},
		{"percent alone", "domain: api\ndescriptors:\n  - key: u\n    rate_limit: {unit: second, requests_per_unit: 5, elastic_percent: 10}\n",
			"elastic_percent: only with throttling: elastic"},
		{"nothing more", "domain: api\ncapacity: {unit: second, requests_per_unit: 5}\ndescriptors:\n  - key: u\n    rate_limit: {unit: second, requests_per_unit: 5, throttling: elastic, elastic_percent: 10}\n",
			"elastic_percent: 10% past"},
		{"named capacity", "domain: api\ncapacity: {name: x, unit: second, requests_per_unit: 5}\ndescriptors: []\n",
			"capacity: a plain limit"},
		{"bad capacity", "domain: api\ncapacity: {unit: fortnight, requests_per_unit: 5}\n",
			`r.yaml:2: unit: unknown unit "fortnight"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("r.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestProtectExample: examples/protect.yaml, docs/protecting.md's example of
// elastic throttling, concurrency limits and priorities, loads as it says.
func TestProtectExample(t *testing.T) {
	t.Parallel()
	set, err := Load("../examples/protect.yaml")
	if err != nil {
		t.Fatal(err)
	}
	user, _ := set.Match("api", []Entry{{Key: "user", Value: "u"}})
	checkout, _ := set.Match("api", []Entry{{Key: "route", Value: "/checkout"}})
	export, _ := set.Match("api", []Entry{{Key: "route", Value: "/export"}})
	if user == nil || user.Concurrency != 20 || user.Limits[0].Throttling != Elastic || user.Limits[0].Pool.Limit.Rate != 2000 ||
		checkout == nil || checkout.Priority != PriorityCritical || export == nil || export.Priority != PrioritySheddable || export.Concurrency != 4 {
		t.Fatalf("user %+v, checkout %+v, export %+v", user, checkout, export)
	}
}

// TestRulesJSONProtect: the rules in force (GET /v1/rules) show the
// domain's capacity and each rule's and limit's protection fields:
// concurrency, priority, elastic throttling with its percent and pool, and
// sync.
func TestRulesJSONProtect(t *testing.T) {
	t.Parallel()
	set, err := Parse("r.yaml", []byte(`
domain: api
capacity: {unit: second, requests_per_unit: 1000, algorithm: token_bucket, burst: 1500}
descriptors:
  - key: user
    concurrency: 20
    priority: critical
    rate_limit: {unit: second, requests_per_unit: 30, throttling: elastic, elastic_percent: 50, sync: lease}
---
domain: web
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	type limit struct {
		ID, Unit, Algorithm, Period, Throttling, Pool, Sync string
		RequestsPerUnit                                     int64 `json:"requests_per_unit"`
		Burst, Line                                         int64
		ElasticPercent                                      int64 `json:"elastic_percent"`
	}
	var v struct {
		Domains []struct {
			Domain      string
			Capacity    *limit
			Descriptors []struct {
				Concurrency int64
				Priority    string
				Limits      []limit
			}
		}
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Domains) != 2 || v.Domains[0].Domain != "api" || v.Domains[1].Capacity != nil {
		t.Fatalf("%s: want api with a capacity, web without", b)
	}
	api := v.Domains[0]
	c := api.Capacity
	if c == nil || c.RequestsPerUnit != 1000 || c.Unit != "second" || c.Algorithm != "token_bucket" || c.Burst != 1500 || c.Line != 3 || c.ID == "" {
		t.Fatalf("capacity %+v in %s", c, b)
	}
	d := api.Descriptors[0]
	l := d.Limits[0]
	if d.Concurrency != 20 || d.Priority != "critical" || l.Throttling != "elastic" || l.ElasticPercent != 50 || l.Pool != c.ID || l.Sync != "lease" {
		t.Errorf("rule %+v, limit %+v in %s", d, l, b)
	}
}

// TestMergedCapacity: merged parts of a domain state its capacity once;
// a second is refused, with the first's place.
func TestMergedCapacity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: api\ncapacity: {unit: second, requests_per_unit: 100}\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5, throttling: elastic, elastic_percent: 100}\n")
	write(t, filepath.Join(dir, "b.yaml"), "domain: api\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	if _, err := (Loader{MergeDomains: true}).Load(dir); err != nil {
		t.Fatalf("one capacity: %v", err)
	}
	write(t, filepath.Join(dir, "c.yaml"), "domain: api\ncapacity: {unit: second, requests_per_unit: 50}\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 5, throttling: elastic, elastic_percent: 100}\n")
	_, err := (Loader{MergeDomains: true}).Load(dir)
	if want := filepath.Join(dir, "c.yaml") + `:2: capacity: domain "api" has one already (at ` + filepath.Join(dir, "a.yaml") + ":2)"; err == nil || err.Error() != want {
		t.Errorf("two capacities: %v, want %s", err, want)
	}
}
