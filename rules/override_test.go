package rules

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const overrideRules = `
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: path
        value: /login
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: files
    value: "reports/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// TestOverrides sets limits for single descriptor values and checks that
// they are matched before the rule they override, with that rule's place
// and settings, its counter where the algorithm and period agree, and a
// fresh one where they do not.
func TestOverrides(t *testing.T) {
	t.Parallel()
	base, err := Parse("rules.yaml", []byte(overrideRules))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	s, err := base.WithOverrides(t0,
		Override{Domain: "api", Entries: []Entry{{Key: "tenant", Value: "acme"}}, Limits: []RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}}},
		Override{Domain: "api", Entries: []Entry{{Key: "user", Value: "bob"}}, Limits: []RateLimitSpec{{Unit: "hour", RequestsPerUnit: 0}}, Expires: t0.Add(time.Hour)},
		Override{Domain: "api", Entries: []Entry{{Key: "user", Value: "carol"}, {Key: "path", Value: "/login"}}, Limits: []RateLimitSpec{
			{Unit: "minute", RequestsPerUnit: 50}, {Unit: "day", RequestsPerUnit: 500, Algorithm: "gcra"}}},
		Override{Domain: "api", Entries: []Entry{{Key: "user", Value: "dave"}}, Limits: []RateLimitSpec{{Unit: "second", RequestsPerUnit: 1}}, Expires: t0}, // already over
	)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, s)
	match := func(set *Set, kv ...string) *Rule {
		t.Helper()
		r, err := set.Match("api", entries(kv...))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	tenant, acme := match(s, "tenant", "other"), match(s, "tenant", "acme")
	if acme == tenant || acme.Overrides != tenant || limits(acme) != "500/1s" || limits(tenant) != "100/1s" {
		t.Fatalf("tenant=acme: %s (overrides %p), tenant=other %s (%p)", limits(acme), acme.Overrides, limits(tenant), tenant)
	}
	if acme.Limits[0].ID != tenant.Limits[0].ID || acme.Path != tenant.Path {
		t.Errorf("acme's limit ID %s path %s, the rule's %s %s: want the rule's counter and name", acme.Limits[0].ID, acme.Path, tenant.Limits[0].ID, tenant.Path)
	}
	bob, user := match(s, "user", "bob"), match(s, "user", "x")
	if !bob.Limits[0].Block || bob.Limits[0].ID == user.Limits[0].ID {
		t.Errorf("user=bob: %+v; want a block with a counter of its own (another period)", bob.Limits[0])
	}
	carol, login := match(s, "user", "carol", "path", "/login"), match(s, "user", "x", "path", "/login")
	if !carol.ShadowMode || carol.Overrides != login || limits(carol) != "50/1m0s + 500/24h0m0s gcra" ||
		carol.Limits[0].ID != login.Limits[0].ID || carol.Limits[1].ID == login.Limits[0].ID {
		t.Errorf("user=carol path=/login: %s shadow %v", limits(carol), carol.ShadowMode)
	}
	if r := match(s, "user", "dave"); r != user {
		t.Errorf("user=dave, whose override expired: %s, want the rule", limits(r))
	}
	if r := match(s, "user", "bob", "path", "/login"); r != login {
		t.Errorf("user=bob path=/login: %s, want the rule (the override is for user=bob alone)", limits(r))
	}
	if got := len(s.Overrides()); got != 3 {
		t.Errorf("%d overrides in force, want 3", got)
	}
	if s.Version() == base.Version() {
		t.Error("the Set with overrides has the rules' version")
	}
	if r := match(base, "tenant", "acme"); r != tenant {
		t.Error("WithOverrides changed the Set it was called on")
	}

	// Expiry: bob's block is in force until t0+1h, then gone.
	if got := s.NextExpiry(); !got.Equal(t0.Add(time.Hour)) {
		t.Errorf("NextExpiry() = %v, want %v", got, t0.Add(time.Hour))
	}
	later, err := base.WithOverrides(t0.Add(time.Hour), Override{Domain: "api", Entries: []Entry{{Key: "user", Value: "bob"}},
		Limits: []RateLimitSpec{{Unit: "hour", RequestsPerUnit: 0}}, Expires: t0.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if r := match(later, "user", "bob"); r != user || !later.NextExpiry().IsZero() || later.Version() != base.Version() {
		t.Errorf("bob at his override's expiry: %s, next expiry %v", limits(r), later.NextExpiry())
	}
	// Overrides replaced on a Set that has some: versions follow the
	// overrides in force, and none at all is the rules' own version.
	again, err := s.WithOverrides(t0)
	if err != nil {
		t.Fatal(err)
	}
	if again.Version() != base.Version() || again.RulesVersion() != base.Version() || s.RulesVersion() != base.Version() {
		t.Errorf("version without overrides %s, the rules' %s", again.Version(), base.Version())
	}
	if r := match(again, "tenant", "acme"); r != tenant {
		t.Errorf("tenant=acme after the overrides were cleared: %s", limits(r))
	}
	acmeOverride := Override{Domain: "api", Entries: []Entry{{Key: "tenant", Value: "acme"}}, Limits: []RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}}}
	same, err := again.WithOverrides(t0, acmeOverride)
	if err != nil {
		t.Fatal(err)
	}
	one, err := base.WithOverrides(t0, acmeOverride)
	if err != nil {
		t.Fatal(err)
	}
	if same.Version() != one.Version() || same.Version() == base.Version() {
		t.Errorf("the same override from two Sets: versions %s and %s", same.Version(), one.Version())
	}
}

// TestOverrideMistakes checks that an override that cannot apply is
// refused with its index, all mistakes at once.
func TestOverrideMistakes(t *testing.T) {
	t.Parallel()
	base, err := Parse("rules.yaml", []byte(overrideRules))
	if err != nil {
		t.Fatal(err)
	}
	one := []RateLimitSpec{{Unit: "second", RequestsPerUnit: 5}}
	_, err = base.WithOverrides(time.Time{},
		Override{Domain: "api", Entries: []Entry{{Key: "tenant", Value: "acme"}}, Limits: one},
		Override{Domain: "api", Entries: []Entry{{Key: "tenant", Value: "acme"}}, Limits: one},
		Override{Domain: "web", Entries: []Entry{{Key: "tenant", Value: "acme"}}, Limits: one},
		Override{Domain: "api", Entries: []Entry{{Key: "ip", Value: "1.2.3.4"}}, Limits: one},
		Override{Domain: "api", Entries: []Entry{{Key: "files", Value: "reports/q3.pdf"}}, Limits: one},
		Override{Domain: "api", Entries: nil, Limits: one},
		Override{Domain: "api", Entries: []Entry{{Key: "user", Value: "eve"}}, Limits: []RateLimitSpec{{Unit: "second", RequestsPerUnit: 5, Burst: 10}}},
		Override{Domain: "api", Entries: []Entry{{Key: "user", Value: "eve"}, {Key: "path", Value: "/other"}}, Limits: one},
		Override{Domain: "api", Entries: []Entry{{Key: "user", Value: "fay"}}},
	)
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v, want Errors", err)
	}
	want := []string{
		`overrides[1]: a second override of [tenant="acme"]`,
		`overrides[2]: domain "web": unknown domain`,
		`overrides[3]: no rule with limits matches [ip="1.2.3.4"] in domain "api": nothing to override`,
		`overrides[4]: [files="reports/q3.pdf"] matches api.files_reports/*, whose values share one counter (share_threshold): it cannot be overridden for one value`,
		`overrides[5]: entries: empty; want the descriptor to override`,
		`overrides[6]/rate_limits[0]: burst: fixed_window has no burst; use token_bucket, leaky_bucket or gcra`,
		`overrides[7]: no rule with limits matches [user="eve" path="/other"] in domain "api": nothing to override`,
		`overrides[8]: rate_limits: empty; want one or more limits`,
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Error())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("mistakes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// manyOverrides returns n overrides of tenant values against
// overrideRules.
func manyOverrides(n int) []Override {
	ovs := make([]Override, n)
	for i := range ovs {
		ovs[i] = Override{Domain: "api", Entries: []Entry{{Key: "tenant", Value: fmt.Sprintf("tenant-%d", i)}},
			Limits: []RateLimitSpec{{Unit: "second", RequestsPerUnit: int64(100 + i)}}}
	}
	return ovs
}

// BenchmarkWithOverrides builds a Set with 10,000 overrides.
func BenchmarkWithOverrides(b *testing.B) {
	base, err := Parse("rules.yaml", []byte(overrideRules))
	if err != nil {
		b.Fatal(err)
	}
	ovs := manyOverrides(10_000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := base.WithOverrides(time.Time{}, ovs...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMatchOverrides matches a descriptor without an override, and
// one with, in a Set without overrides and one with 10,000.
func BenchmarkMatchOverrides(b *testing.B) {
	base, err := Parse("rules.yaml", []byte(overrideRules))
	if err != nil {
		b.Fatal(err)
	}
	with, err := base.WithOverrides(time.Time{}, manyOverrides(10_000)...)
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range []struct {
		name    string
		set     *Set
		entries []Entry
	}{
		{"none/rule", base, entries("user", "x", "path", "/login")},
		{"10000/rule", with, entries("user", "x", "path", "/login")},
		{"10000/override", with, entries("tenant", "tenant-777")},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if r, err := bb.set.Match("api", bb.entries); r == nil || err != nil {
					b.Fatal(r, err)
				}
			}
		})
	}
	// Each of the 10,000 in turn, as requests of many tenants come,
	// without overrides and with one for each, and as many tenants
	// without one.
	for _, bb := range []struct {
		name, prefix string
		set          *Set
	}{{"none/tenants", "tenant-", base}, {"10000/overrides", "tenant-", with}, {"10000/others", "other-", with}} {
		b.Run(bb.name, func(b *testing.B) {
			es := make([][]Entry, 10_000)
			for i := range es {
				es[i] = entries("tenant", fmt.Sprint(bb.prefix, i))
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if r, err := bb.set.Match("api", es[i%len(es)]); r == nil || err != nil {
					b.Fatal(r, err)
				}
				i++
			}
		})
	}
}

// TestOverrideCheck checks that a store's veto reaches the limits of
// overrides, placed at their index.
func TestOverrideCheck(t *testing.T) {
	t.Parallel()
	base, err := Parse("rules.yaml", []byte(overrideRules))
	if err != nil {
		t.Fatal(err)
	}
	s, err := base.WithOverrides(time.Time{},
		Override{Domain: "api", Entries: []Entry{{Key: "tenant", Value: "acme"}}, Limits: []RateLimitSpec{{Unit: "second", RequestsPerUnit: 500}}},
		Override{Domain: "api", Entries: []Entry{{Key: "tenant", Value: "big"}}, Limits: []RateLimitSpec{{Unit: "second", RequestsPerUnit: 5000}}})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Check(atMost(1000))
	if err == nil || err.Error() != "overrides[1]: limit 5000/1s: rate 5000 above 1000: limit not supported by the store" {
		t.Errorf("Check: %v", err)
	}
	if err := base.Check(atMost(1000)); err != nil {
		t.Errorf("Check of the rules alone: %v", err)
	}
}

// TestOverridesJSON renders a Set's overrides as GET /v1/rules shows them.
func TestOverridesJSON(t *testing.T) {
	t.Parallel()
	base, err := Parse("rules.yaml", []byte(overrideRules))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	s, err := base.WithOverrides(t0, Override{Domain: "api", Entries: []Entry{{Key: "user", Value: "bob"}},
		Limits: []RateLimitSpec{{Unit: "hour", RequestsPerUnit: 0}}, Expires: t0.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	id := s.Overrides()[0].Rule.Limits[0].ID
	want := `"overrides":[{"domain":"api","entries":[{"key":"user","value":"bob"}],"path":"api.user","limits":[{"id":"` + id +
		`","block":true,"unit":"hour","unit_multiplier":1,"algorithm":"fixed_window","period":"1h0m0s","throttling":"hard","line":0}],"expires":"2026-11-23T13:00:00Z"}]}`
	if !strings.HasSuffix(string(b), want) {
		t.Errorf("JSON ends\n%s\nwant\n%s", b[max(0, len(b)-len(want)):], want)
	}
	if b, _ := base.MarshalJSON(); strings.Contains(string(b), "overrides") {
		t.Errorf("a Set without overrides renders them: %s", b)
	}
}
