package rules

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// limits describes the limits of a matched rule, for comparisons: "-" when
// nothing matched, else each limit as sluice.Limit.String formats it (or
// "unlimited"), joined by " + ".
func limits(r *Rule) string {
	if r == nil {
		return "-"
	}
	var parts []string
	for _, l := range r.Limits {
		if l.Unlimited {
			parts = append(parts, "unlimited")
		} else {
			parts = append(parts, l.Limit.String())
		}
	}
	return strings.Join(parts, " + ")
}

func entries(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// TestEnvoyExamples loads the examples of Envoy ratelimit's README (written
// out under testdata/envoy, one domain each, as one directory) and matches
// the descriptors the README discusses the way it says Envoy does.
func TestEnvoyExamples(t *testing.T) {
	t.Parallel()
	s, err := Load("testdata/envoy")
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, s)
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		path    string // the matched rule's Path, "" for none
		limits  string
		shadow  bool
	}{
		{"1: users", "mongo_cps", entries("database", "users"), "mongo_cps.database_users", "500/1s", false},
		{"1: default", "mongo_cps", entries("database", "default"), "mongo_cps.database_default", "500/1s", false},
		{"1: other value", "mongo_cps", entries("database", "orders"), "", "-", false},
		{"1: other key", "mongo_cps", entries("table", "users"), "", "-", false},

		{"2: marketing to a number", "messaging", entries("message_type", "marketing", "to_number", "2061111111"), "messaging.message_type_marketing.to_number", "5/24h0m0s", false},
		{"2: marketing to another number", "messaging", entries("message_type", "marketing", "to_number", "2062222222"), "messaging.message_type_marketing.to_number", "5/24h0m0s", false},
		{"2: any message to a number", "messaging", entries("to_number", "2061111111"), "messaging.to_number", "100/24h0m0s", false},
		{"2: the placeholder alone", "messaging", entries("message_type", "marketing"), "", "-", false},
		{"2: another message type", "messaging", entries("message_type", "transactional", "to_number", "2061111111"), "", "-", false},

		{"3: any IP", "edge_proxy_per_ip", entries("remote_address", "50.0.0.1"), "edge_proxy_per_ip.remote_address", "10/1s", false},
		{"3: the listed IP first", "edge_proxy_per_ip", entries("remote_address", "50.0.0.5"), "edge_proxy_per_ip.remote_address_50.0.0.5", "1/1s", false},

		{"4: deeper than the rules", "example4a", entries("key", "value", "subkey", "subvalue"), "", "-", false},
		{"4: as deep as the rules", "example4a", entries("key", "value"), "example4a.key_value", "300/1s", false},
		{"4: nested rule", "example4b", entries("key", "value", "subkey", "subvalue"), "example4b.key_value.subkey", "300/1s", false},
		{"4: nested rule, shallower request", "example4b", entries("key", "value"), "", "-", false},

		{"5: unlimited", "internal", entries("ldap", "x"), "internal.ldap", "unlimited", false},
		{"5: limited", "internal", entries("azure", "x"), "internal.azure", "100/1m0s", false},

		{"6: shadow", "example6", entries("service", "auth-service", "user", "user-a"), "example6.service.user_user-a", "10/1s", true},
		{"6: enforced", "example6", entries("service", "auth-service", "user", "user-b"), "example6.service.user_user-b", "20/1s", false},
		{"6: unlisted user", "example6", entries("service", "auth-service", "user", "user-c"), "", "-", false},

		{"7: named", "example7", entries("key_1", "value_1", "user", "bkthomps"), "example7.key_1_value_1.user_bkthomps", "5/1s", false},
		{"7: replacing", "example7", entries("key_2", "value_2", "user", "bkthomps"), "example7.key_2_value_2.user_bkthomps", "10/1s", false},

		{"8: detailed, any value", "example8", entries("key1", "unspecified_value"), "example8.key1", "10/1m0s", false},
		{"8: listed value", "example8", entries("key1", "value1"), "example8.key1_value1", "20/1m0s", false},

		{"9: wildcard", "example9", entries("key1", "value_1"), "example9.key1_value*", "20/1m0s", false},
		{"9: wildcard, empty rest", "example9", entries("key1", "value"), "example9.key1_value*", "20/1m0s", false},
		{"9: no match", "example9", entries("key1", "valu"), "", "-", false},

		{"share: files", "share", entries("files", "files/a.pdf"), "share.files_files/*", "100/1h0m0s", false},
		{"share: nested", "share", entries("user", "alice", "path", "/api/x"), "share.user.path_/api/*", "60/1m0s", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := s.Match(tt.domain, tt.entries)
			if err != nil {
				t.Fatalf("Match: %v", err)
			}
			path := ""
			if r != nil {
				path = r.Path
				if r.ShadowMode != tt.shadow {
					t.Errorf("ShadowMode = %v, want %v", r.ShadowMode, tt.shadow)
				}
			}
			if path != tt.path || limits(r) != tt.limits {
				t.Errorf("Match(%s, %v) = %q %s, want %q %s", tt.domain, tt.entries, path, limits(r), tt.path, tt.limits)
			}
		})
	}

	t.Run("7: replaces", func(t *testing.T) {
		t.Parallel()
		named, _ := s.Match("example7", entries("key_1", "value_1", "user", "bkthomps"))
		replacing, _ := s.Match("example7", entries("key_2", "value_2", "user", "bkthomps"))
		if named == nil || replacing == nil {
			t.Fatal("example 7 rules not found")
		}
		if got := named.Limits[0].Name; got != "specific_limit" {
			t.Errorf("Name = %q, want specific_limit", got)
		}
		if got := replacing.Limits[0].Replaces; len(got) != 1 || got[0] != "specific_limit" {
			t.Errorf("Replaces = %q, want [specific_limit]", got)
		}
	})
	t.Run("unknown domain", func(t *testing.T) {
		t.Parallel()
		if _, err := s.Match("nope", entries("a", "b")); !errors.Is(err, ErrUnknownDomain) {
			t.Errorf("Match(nope) error = %v, want ErrUnknownDomain", err)
		}
	})
}

// TestMetricKeys checks the names of metrics, Envoy's way: the rules
// file's path, the request's values with detailed_metric, and the value at
// one level with value_to_metric.
func TestMetricKeys(t *testing.T) {
	t.Parallel()
	s, err := Load("testdata/envoy")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		want    string
	}{
		{"key only", "messaging", entries("to_number", "2061111111"), "messaging.to_number"},
		{"nested", "messaging", entries("message_type", "marketing", "to_number", "2061111111"), "messaging.message_type_marketing.to_number"},
		{"detailed_metric", "example8", entries("key1", "unspecified_value"), "example8.key1_unspecified_value"},
		{"detailed_metric, listed value", "example8", entries("key1", "value1"), "example8.key1_value1"},
		{"wildcard", "example9", entries("key1", "value_1"), "example9.key1_value*"},
		{"share_threshold", "share", entries("files", "files/a.pdf"), "share.files_files/*"},
		{"value_to_metric on a wildcard", "share", entries("models", "models/gpt"), "share.models_models/gpt"},
		{"value_to_metric on a parent", "share", entries("user", "alice", "path", "/api/x"), "share.user_alice.path_/api/*"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := s.Match(tt.domain, tt.entries)
			if err != nil || r == nil {
				t.Fatalf("Match(%s, %v) = %v, %v", tt.domain, tt.entries, r, err)
			}
			if got := string(r.AppendMetricKey(nil, tt.entries)); got != tt.want {
				t.Errorf("AppendMetricKey = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestStoreKeys checks that share_threshold makes every value matching a
// wildcard count against one key, while other rules count each value on
// its own, and that keys of distinct descriptors never collide.
func TestStoreKeys(t *testing.T) {
	t.Parallel()
	s, err := Load("testdata/envoy")
	if err != nil {
		t.Fatal(err)
	}
	key := func(domain string, es []Entry) string {
		t.Helper()
		r, err := s.Match(domain, es)
		if err != nil || r == nil {
			t.Fatalf("Match(%s, %v) = %v, %v", domain, es, r, err)
		}
		return string(r.AppendKey(nil, r.Limits[0], es))
	}
	tests := []struct {
		name   string
		domain string
		a, b   []Entry
		same   bool
	}{
		{"share_threshold: one counter", "share", entries("files", "files/a.pdf"), entries("files", "files/b.csv"), true},
		{"wildcard: a counter per value", "example9", entries("key1", "value_1"), entries("key1", "value_2"), false},
		{"value_to_metric: a counter per value", "share", entries("models", "models/a"), entries("models", "models/b"), false},
		{"nested share_threshold: one counter per parent value", "share", entries("user", "alice", "path", "/api/a"), entries("user", "alice", "path", "/api/b"), true},
		{"nested share_threshold: parents apart", "share", entries("user", "alice", "path", "/api/a"), entries("user", "bob", "path", "/api/a"), false},
		{"key only: a counter per value", "messaging", entries("to_number", "1"), entries("to_number", "2"), false},
		{"values that would run together", "messaging", entries("message_type", "marketing", "to_number", "1|2"), entries("message_type", "marketing", "to_number", "1"), false},
		{"same descriptor", "messaging", entries("to_number", "1"), entries("to_number", "1"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ka, kb := key(tt.domain, tt.a), key(tt.domain, tt.b)
			if (ka == kb) != tt.same {
				t.Errorf("keys %q and %q: same = %v, want %v", ka, kb, ka == kb, tt.same)
			}
		})
	}
}

// TestMatch covers the matching order (exact, then wildcards in file order,
// then the key alone), wildcards anywhere in a value, nesting and depth.
func TestMatch(t *testing.T) {
	t.Parallel()
	const rules = `
domain: m
descriptors:
  - key: path
    value: /api/users
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*/export
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: "*.json"
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: host
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: user
        value: "a*b*c"
        rate_limit: {unit: second, requests_per_unit: 7}
      - key: user
        descriptors:
          - key: method
            value: POST
            rate_limit: {unit: second, requests_per_unit: 8}
  - key: open
`
	s, err := Parse("match.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, s)
	tests := []struct {
		name    string
		entries []Entry
		want    string
	}{
		{"exact beats wildcards", entries("path", "/api/users"), "1/1s"},
		{"wildcard in the middle", entries("path", "/api/orders/export"), "2/1s"},
		{"first wildcard in file order", entries("path", "/api/x.json"), "3/1s"},
		{"trailing wildcard", entries("path", "/api/orders"), "3/1s"},
		{"trailing wildcard, empty rest", entries("path", "/api/"), "3/1s"},
		{"leading wildcard", entries("path", "/static/app.json"), "4/1s"},
		{"key alone last", entries("path", "/login"), "5/1s"},
		{"empty value falls to the key alone", entries("path", ""), "5/1s"},
		{"lone star matches anything", entries("host", "example.com"), "6/1s"},
		{"lone star matches empty", entries("host", ""), "6/1s"},
		{"parent alone", entries("tenant", "acme"), "100/1m0s"},
		{"nested stars", entries("tenant", "acme", "user", "a-b-c"), "7/1s"},
		{"nested stars, minimal", entries("tenant", "acme", "user", "abc"), "7/1s"},
		{"nested stars, order matters", entries("tenant", "acme", "user", "cba"), "-"},
		{"nested stars, suffix kept apart", entries("tenant", "acme", "user", "ab"), "-"},
		{"placeholder without limits", entries("tenant", "acme", "user", "zed"), "-"},
		{"third level", entries("tenant", "acme", "user", "zed", "method", "POST"), "8/1s"},
		{"third level, other value", entries("tenant", "acme", "user", "zed", "method", "GET"), "-"},
		{"deeper than the rules", entries("path", "/login", "method", "GET"), "-"},
		{"exact match does not fall back", entries("tenant", "acme", "user", "abc", "method", "POST"), "-"},
		{"unknown key", entries("nope", "x"), "-"},
		{"whitelisted", entries("open", "x"), "-"},
		{"no entries", nil, "-"},
		{"key case matters", entries("Path", "/login"), "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := s.Match("m", tt.entries)
			if err != nil {
				t.Fatal(err)
			}
			if got := limits(r); got != tt.want {
				t.Errorf("Match(%v) = %s, want %s", tt.entries, got, tt.want)
			}
		})
	}
}

// TestGlob checks wildcard patterns against a slow reference: a recursive
// matcher written from the definition.
func TestGlob(t *testing.T) {
	t.Parallel()
	var ref func(p, s string) bool
	ref = func(p, s string) bool {
		if p == "" {
			return s == ""
		}
		if p[0] == '*' {
			for i := 0; i <= len(s); i++ {
				if ref(p[1:], s[i:]) {
					return true
				}
			}
			return false
		}
		return s != "" && s[0] == p[0] && ref(p[1:], s[1:])
	}
	patterns := []string{"*", "**", "a*", "*a", "a*a", "*a*", "a*b*a", "ab*ba", "*ab*ab*", "a**b"}
	values := []string{"", "a", "b", "aa", "ab", "ba", "aba", "abba", "abab", "ababab", "bab", "aab", "abb"}
	for _, p := range patterns {
		g := compileGlob(p)
		for _, v := range values {
			t.Run(fmt.Sprintf("%s~%s", p, v), func(t *testing.T) {
				if got, want := g.match(v), ref(p, v); got != want {
					t.Errorf("match(%q, %q) = %v, want %v", p, v, got, want)
				}
			})
		}
	}
}

// BenchmarkMatch measures Match on descriptors of one, two and three
// entries that land on exact, wildcard and key-only rules.
func BenchmarkMatch(b *testing.B) {
	s, err := Load("testdata/valid/design.yaml")
	if err != nil {
		b.Fatal(err)
	}
	w, err := Load("testdata/envoy")
	if err != nil {
		b.Fatal(err)
	}
	benches := []struct {
		name    string
		set     *Set
		domain  string
		entries []Entry
	}{
		{"key only", s, "api", entries("remote_address", "10.0.0.1")},
		{"nested exact", s, "api", entries("user", "alice", "path", "/login")},
		{"wildcard", w, "share", entries("user", "alice", "path", "/api/orders")},
		{"three levels miss", w, "messaging", entries("message_type", "marketing", "to_number", "2061111111", "x", "y")},
	}
	for _, bb := range benches {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := bb.set.Match(bb.domain, bb.entries); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
	b.Run("key", func(b *testing.B) {
		es := entries("user", "alice", "path", "/login")
		r, _ := s.Match("api", es)
		buf := make([]byte, 0, 128)
		b.ReportAllocs()
		for b.Loop() {
			buf = r.AppendKey(buf[:0], r.Limits[0], es)
		}
	})
}

// TestMatchAllocs checks that Match and AppendKey allocate nothing.
func TestMatchAllocs(t *testing.T) {
	s, err := Load("testdata/envoy")
	if err != nil {
		t.Fatal(err)
	}
	es := entries("user", "alice", "path", "/api/orders")
	buf := make([]byte, 0, 256)
	allocs := testing.AllocsPerRun(100, func() {
		r, err := s.Match("share", es)
		if err != nil || r == nil {
			t.Fatal("no match")
		}
		buf = r.AppendKey(buf[:0], r.Limits[0], es)
		buf = r.AppendMetricKey(buf[:0], es)
		if _, err := s.Match("nope", es); err == nil {
			t.Fatal("unknown domain matched")
		}
	})
	if allocs != 0 {
		t.Errorf("Match, AppendKey, AppendMetricKey: %v allocations, want 0", allocs)
	}
}
