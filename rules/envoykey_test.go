package rules

import (
	"slices"
	"testing"
)

// TestEnvoyKey checks the descriptors of Envoy's counters and which limits
// have them (store/envoykeys makes the keys: "api_" then "key_value_" for
// each entry).
func TestEnvoyKey(t *testing.T) {
	t.Parallel()
	set, err := Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: a_b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    descriptors:
      - key: tenant
        value: "t*"
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: two
    rate_limits:
      - {unit: minute, requests_per_unit: 1}
      - {unit: hour, requests_per_unit: 1}
  - key: mixed
    rate_limits:
      - {unit: minute, requests_per_unit: 1}
      - {unit: hour, requests_per_unit: 1, algorithm: sliding_window}
  - key: five
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 1}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: token_bucket}
  - key: free
    rate_limit: {unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	key := func(entries ...Entry) (string, bool) {
		t.Helper()
		r, err := set.Match("api", entries)
		if err != nil || r == nil {
			t.Fatalf("Match(%v) = %v, %v", entries, r, err)
		}
		before := append([]Entry(nil), entries...)
		d := r.EnvoyDescriptor(entries)
		if !slices.Equal(entries, before) {
			t.Fatalf("EnvoyDescriptor changed the request's entries: %v, were %v", entries, before)
		}
		key := "pfx_" + d.Domain + "_"
		for _, e := range d.Entries {
			key += e.Key + "_" + e.Value + "_"
		}
		return key, r.EnvoyKeyed(r.Limits[0])
	}
	for _, tc := range []struct {
		entries []Entry
		want    string
		keyed   bool
	}{
		{[]Entry{{Key: "a", Value: "b_c"}}, "pfx_api_a_b_c_", true},
		{[]Entry{{Key: "a_b", Value: "c"}}, "pfx_api_a_b_c_", true}, // Envoy's collision, on purpose
		{[]Entry{{Key: "user", Value: "alice"}, {Key: "tenant", Value: "t42"}}, "pfx_api_user_alice_tenant_t*_", true},
		{[]Entry{{Key: "two", Value: "x"}}, "pfx_api_two_x_", false},
		{[]Entry{{Key: "mixed", Value: "x"}}, "pfx_api_mixed_x_", true},
		{[]Entry{{Key: "five", Value: "x"}}, "pfx_api_five_x_", false},
		{[]Entry{{Key: "bucket", Value: "x"}}, "pfx_api_bucket_x_", false},
		{[]Entry{{Key: "free", Value: "x"}}, "pfx_api_free_x_", false},
	} {
		got, keyed := key(tc.entries...)
		if got != tc.want || keyed != tc.keyed {
			t.Errorf("%v: key %q, Envoy keyed %v; want %q, %v", tc.entries, got, keyed, tc.want, tc.keyed)
		}
	}
}
