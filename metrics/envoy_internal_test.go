package metrics

import "testing"

// TestEnvoyCounts checks the split of hits into Envoy's within_limit,
// near_limit and over_limit on Envoy's own arithmetic: a limit of 10 and
// the default ratio make 8 the near-limit threshold.
func TestEnvoyCounts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                   string
		limit, remaining, hits int64
		overLimit              bool
		ratio                  float64
		within, near, over     int64
	}{
		{name: "far from the limit", limit: 10, remaining: 5, hits: 1, within: 1},
		{name: "at the threshold", limit: 10, remaining: 2, hits: 1, within: 1},
		{name: "past the threshold", limit: 10, remaining: 1, hits: 1, within: 1, near: 1},
		{name: "across the threshold", limit: 10, remaining: 1, hits: 3, within: 3, near: 1},
		{name: "the last hit", limit: 10, remaining: 0, hits: 1, within: 1, near: 1},
		{name: "across the limit", limit: 10, remaining: 1, hits: 3, overLimit: true, near: 1, over: 2},
		{name: "from below the threshold across the limit", limit: 10, remaining: 5, hits: 10, overLimit: true, near: 2, over: 5},
		{name: "already over", limit: 10, remaining: 0, hits: 2, overLimit: true, over: 2},
		{name: "a limit of 0", limit: 0, remaining: 0, hits: 4, overLimit: true, over: 4},
		{name: "another ratio", limit: 100, remaining: 45, hits: 10, ratio: 0.5, within: 10, near: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ratio := tt.ratio
			if ratio == 0 {
				ratio = DefaultNearLimitRatio
			}
			w, n, o := envoyCounts(tt.limit, tt.remaining, tt.hits, tt.overLimit, ratio)
			if w != tt.within || n != tt.near || o != tt.over {
				t.Errorf("within %d near %d over %d, want %d %d %d", w, n, o, tt.within, tt.near, tt.over)
			}
		})
	}
}

func TestEnvoyLabels(t *testing.T) {
	t.Parallel()
	for key, want := range map[string][3]string{
		"api":                        {"api", "", ""},
		"api.user":                   {"api", "user", ""},
		"api.user.path_/login":       {"api", "user", "path_/login"},
		"api.user.api_messages.send": {"api", "user", "api_messages"},
		"api.remote_address_::1":     {"api", "remote_address___1", ""},
		"a|b.c":                      {"a_b", "c", ""},
	} {
		d, k1, k2 := envoyLabels([]byte(key))
		if got := [3]string{d, k1, k2}; got != want {
			t.Errorf("envoyLabels(%q) = %q, want %q", key, got, want)
		}
	}
}
