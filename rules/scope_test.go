package rules

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// TestScopeGlobal: scope: global loads as GlobalScope, decided exactly
// (sync exact), and shows in the rules in force; scope: region and no scope
// are RegionScope, and show nothing.
func TestScopeGlobal(t *testing.T) {
	set, err := Parse("scope.yaml", []byte(`domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000, scope: global}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10, scope: region}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window, sync: exact, scope: global}
`))
	if err != nil {
		t.Fatal(err)
	}
	byKey := make(map[string]*Limit)
	for _, r := range set.Rules("api") {
		byKey[r.Key] = r.Limits[0]
	}
	for _, tc := range []struct {
		key   string
		scope sluice.Scope
		sync  sluice.Sync
		json  string
	}{
		{"user", sluice.GlobalScope, sluice.Exact, `"scope":"global"`},
		{"ip", sluice.RegionScope, sluice.DefaultSync, ""},
		{"path", sluice.GlobalScope, sluice.Exact, `"scope":"global"`},
	} {
		l := byKey[tc.key]
		if l.Scope != tc.scope || l.Sync != tc.sync {
			t.Errorf("%s: scope %v, sync %v; want %v, %v", tc.key, l.Scope, l.Sync, tc.scope, tc.sync)
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(b); tc.json != "" && !strings.Contains(got, tc.json) || tc.json == "" && strings.Contains(got, "scope") {
			t.Errorf("%s: rules in force %s, want %q in it", tc.key, got, tc.json)
		}
	}
}
