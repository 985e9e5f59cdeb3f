package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestRequestRule checks the counter a request's own limit counts in:
// the rules' own when it has their algorithm and period, its own
// otherwise, and one per value even where the rules share a threshold.
func TestRequestRule(t *testing.T) {
	t.Parallel()
	set, err := Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: user
    shadow_mode: true
    metadata: {team: a}
    rate_limits:
      - {unit: minute, requests_per_unit: 10, name: per-user, sync: lease}
      - {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: tenant
    value: "t*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	match := func(entries ...Entry) *Rule {
		r, err := set.Match("api", entries)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	alice := []Entry{{Key: "user", Value: "alice"}}
	user := match(alice...)

	r, err := RequestRule("api", user, alice, RequestLimit{RequestsPerUnit: 2, Unit: "MINUTE"})
	if err != nil {
		t.Fatal(err)
	}
	l := r.Limits[0]
	switch {
	case len(r.Limits) != 1 || l.Limit.Rate != 2 || l.Period() != time.Minute || l.Unit != "minute":
		t.Errorf("limits %+v, want one of 2 a minute", r.Limits)
	case r.ShadowMode || r.QuotaMode || r.Metadata != nil || l.Name != "":
		t.Errorf("rule keeps shadow %v, quota %v, metadata %v, name %q; want none", r.ShadowMode, r.QuotaMode, r.Metadata, l.Name)
	case l.ID != user.Limits[0].ID || l.Sync != sluice.Lease:
		t.Errorf("ID %s sync %q, want the rules' minute limit's %s, lease", l.ID, l.Sync, user.Limits[0].ID)
	case r.Path != user.Path:
		t.Errorf("path %q, want %q", r.Path, user.Path)
	}
	// The hour limit is a sliding window: a fixed hour counts apart.
	r, err = RequestRule("api", user, alice, RequestLimit{RequestsPerUnit: 2, Unit: "hour"})
	if err != nil {
		t.Fatal(err)
	}
	if id := r.Limits[0].ID; id == user.Limits[0].ID || id == user.Limits[1].ID {
		t.Errorf("hourly fixed window has ID %s, one of the rules' (%s, %s)", id, user.Limits[0].ID, user.Limits[1].ID)
	}

	// A shared threshold: the rules' key holds the pattern, the request
	// limit's the value.
	t1 := []Entry{{Key: "tenant", Value: "t1"}}
	tenant := match(t1...)
	r, err = RequestRule("api", tenant, t1, RequestLimit{RequestsPerUnit: 1, Unit: "minute"})
	if err != nil {
		t.Fatal(err)
	}
	if got, shared := string(r.AppendKey(nil, r.Limits[0], t1)), string(tenant.AppendKey(nil, tenant.Limits[0], t1)); !strings.HasSuffix(got, "|2:t1") || !strings.HasSuffix(shared, "|*") {
		t.Errorf("keys %q (request limit) and %q (rules), want the value in the first and the pattern in the second", got, shared)
	}
	if !tenant.ShareThreshold || !tenant.path[0].ShareThreshold {
		t.Error("RequestRule changed the matched rule")
	}

	// No rule: levels of the keys, an ID of their own, metrics by keys.
	eu := []Entry{{Key: "region", Value: "eu"}, {Key: "zone", Value: "a"}}
	r, err = RequestRule("api", nil, eu, RequestLimit{RequestsPerUnit: 1, Unit: "second"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(r.AppendMetricKey(nil, eu)); got != "api.region.zone" || r.Path != "api.region.zone" {
		t.Errorf("metric key %q, path %q; want api.region.zone", got, r.Path)
	}
	if got := string(r.AppendKey(nil, r.Limits[0], eu)); got != r.Limits[0].ID+"|2:eu|1:a" {
		t.Errorf("key %q, want the ID and the values", got)
	}
	r0, err := RequestRule("api", nil, nil, RequestLimit{RequestsPerUnit: 0, Unit: "day"})
	if err != nil || !r0.Limits[0].Block || r0.Path != "api" {
		t.Errorf("no entries, 0 a day: %+v, %v; want a blocking limit on api", r0, err)
	}

	for _, tc := range []struct {
		rl  RequestLimit
		msg string
	}{
		{RequestLimit{RequestsPerUnit: 1}, `unit: unknown unit ""`},
		{RequestLimit{RequestsPerUnit: 1, Unit: "fortnight"}, `unknown unit "fortnight"`},
		{RequestLimit{RequestsPerUnit: -1, Unit: "second"}, "requests_per_unit: must be at least 0"},
	} {
		if _, err := RequestRule("api", nil, eu, tc.rl); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("RequestRule(%+v) = %v, want an error containing %q", tc.rl, err, tc.msg)
		}
	}
}
