package rules

import "testing"

// TestEnvoyKey checks Envoy's counter keys and which limits have them.
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
		return string(r.AppendEnvoyKey([]byte("pfx_"), entries)), r.EnvoyKeyed(r.Limits[0])
	}
	for _, tc := range []struct {
		entries []Entry
		want    string
		keyed   bool
	}{
		{[]Entry{{"a", "b_c"}}, "pfx_api_a_b_c_", true},
		{[]Entry{{"a_b", "c"}}, "pfx_api_a_b_c_", true}, // Envoy's collision, on purpose
		{[]Entry{{"user", "alice"}, {"tenant", "t42"}}, "pfx_api_user_alice_tenant_t*_", true},
		{[]Entry{{"two", "x"}}, "pfx_api_two_x_", false},
		{[]Entry{{"mixed", "x"}}, "pfx_api_mixed_x_", true},
		{[]Entry{{"five", "x"}}, "pfx_api_five_x_", false},
		{[]Entry{{"bucket", "x"}}, "pfx_api_bucket_x_", false},
		{[]Entry{{"free", "x"}}, "pfx_api_free_x_", false},
	} {
		got, keyed := key(tc.entries...)
		if got != tc.want || keyed != tc.keyed {
			t.Errorf("%v: key %q, Envoy keyed %v; want %q, %v", tc.entries, got, keyed, tc.want, tc.keyed)
		}
	}
}
