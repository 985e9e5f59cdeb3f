package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// specsOf decodes a rules file into DomainSpecs with the yaml package's
// own decoder and the specs' tags: a way to Go values that does not go
// through the package's YAML plumbing.
func specsOf(t *testing.T, data []byte) []DomainSpec {
	t.Helper()
	out, err := decodeSpecs(data)
	if err != nil {
		t.Fatalf("decode specs: %v", err)
	}
	return out
}

func decodeSpecs(data []byte) ([]DomainSpec, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []DomainSpec
	for {
		var ds DomainSpec
		err := dec.Decode(&ds)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if ds.Domain != "" {
			out = append(out, ds)
		}
	}
}

// rendered is a Set as GET /v1/rules renders it, without where it came
// from (files, lines, version), for comparing Sets from different sources.
func rendered(t *testing.T, s *Set) any {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	var strip func(v any)
	strip = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			delete(x, "file")
			delete(x, "line")
			delete(x, "version")
			for _, e := range x {
				strip(e)
			}
		case []any:
			for _, e := range x {
				strip(e)
			}
		}
	}
	strip(v)
	return v
}

// TestNewSetEqualsLoad builds every valid rules file of testdata from Go
// values (decoded apart from the package's YAML plumbing) and checks that
// the Set has the same rules, limits and IDs as the file's, matches the
// same descriptors to the same limits, and survives a round trip through
// YAML and JSON.
func TestNewSetEqualsLoad(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/valid/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	envoy, err := filepath.Glob("testdata/envoy/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range append(files, envoy...) {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			fromFile, err := Parse(file, data)
			if err != nil {
				t.Fatal(err)
			}
			specs := specsOf(t, data)
			fromGo, err := NewSet(specs...)
			if err != nil {
				t.Fatalf("NewSet: %v", err)
			}
			checkValid(t, fromGo)
			if got, want := rendered(t, fromGo), rendered(t, fromFile); !reflect.DeepEqual(got, want) {
				t.Errorf("NewSet renders\n%v\nthe file\n%v", got, want)
			}
			sameMatches(t, fromGo, fromFile)

			for _, enc := range []struct {
				name    string
				marshal func(any) ([]byte, error)
			}{{"yaml", yaml.Marshal}, {"json", json.Marshal}} {
				var doc []byte
				for i, ds := range specs {
					b, err := enc.marshal(ds)
					if err != nil {
						t.Fatal(err)
					}
					if i > 0 {
						doc = append(doc, "\n---\n"...)
					}
					doc = append(doc, b...)
				}
				again, err := Parse("again."+enc.name, doc)
				if err != nil {
					t.Fatalf("the specs as %s do not load: %v\n%s", enc.name, err, doc)
				}
				if got, want := rendered(t, again), rendered(t, fromFile); !reflect.DeepEqual(got, want) {
					t.Errorf("the specs as %s render\n%v\nthe file\n%v", enc.name, got, want)
				}
			}
			if fromGo.Version() == "" || fromGo.Version() == fromFile.Version() {
				t.Errorf("NewSet version %q, file version %q: want a version of its own", fromGo.Version(), fromFile.Version())
			}
			if again, _ := NewSet(specs...); again.Version() != fromGo.Version() {
				t.Errorf("NewSet of the same specs: version %s, then %s", fromGo.Version(), again.Version())
			}
		})
	}
}

// sameMatches checks that a and b match every descriptor that a rule of b
// is written for (its keys and values, and a value beside each wildcard)
// to rules with the same limits and IDs.
func sameMatches(t *testing.T, a, b *Set) {
	t.Helper()
	var walk func(domain string, rules []*Rule, entries []Entry)
	walk = func(domain string, rules []*Rule, entries []Entry) {
		for _, r := range rules {
			e := append(append([]Entry(nil), entries...), Entry{Key: r.Key, Value: r.Value})
			for _, es := range [][]Entry{e, append(append([]Entry(nil), entries...), Entry{Key: r.Key, Value: strings.ReplaceAll(r.Value, "*", "zz")})} {
				ra, erra := a.Match(domain, es)
				rb, errb := b.Match(domain, es)
				if erra != nil || errb != nil || (ra == nil) != (rb == nil) {
					t.Fatalf("Match(%s, %v): %v %v and %v %v", domain, es, ra, erra, rb, errb)
				}
				if ra == nil {
					continue
				}
				if ra.Path != rb.Path || len(ra.Limits) != len(rb.Limits) {
					t.Errorf("Match(%s, %v): %s and %s", domain, es, ra.Path, rb.Path)
					continue
				}
				for i := range ra.Limits {
					la, lb := ra.Limits[i], rb.Limits[i]
					if la.ID != lb.ID || la.Limit != lb.Limit || la.Enforced() != lb.Enforced() || la.Block != lb.Block || la.Unlimited != lb.Unlimited {
						t.Errorf("Match(%s, %v) limit %d: %+v and %+v", domain, es, i, la, lb)
					}
				}
			}
			walk(domain, r.Descriptors, e)
		}
	}
	for _, d := range b.Domains() {
		walk(d, b.Rules(d), nil)
	}
}

// TestSameMistakes states each mistake once as YAML and once as Go values:
// both are refused with the same message, the file's at its line, the Go
// values' at a path.
func TestSameMistakes(t *testing.T) {
	t.Parallel()
	one := func(l RateLimitSpec) []DomainSpec {
		return []DomainSpec{{Domain: "api", Descriptors: []DescriptorSpec{{Key: "user", RateLimit: &l}}}}
	}
	tests := []struct {
		name string
		yaml string // the descriptors of domain api, or a whole file with "domain:"
		go_  []DomainSpec
		msg  string // the message of the only mistake, up to " (first at"
		path string // the Go values' Error.Path
		line int    // the file's Error.Line
	}{
		{"unknown unit", "- key: user\n  rate_limit: {unit: fortnight, requests_per_unit: 5}",
			one(RateLimitSpec{Unit: "fortnight", RequestsPerUnit: 5}),
			`unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)`, "api/user/rate_limit", 5},
		{"missing unit", "- key: user\n  rate_limit: {requests_per_unit: 5}",
			one(RateLimitSpec{RequestsPerUnit: 5}),
			"rate_limit: missing unit (second, minute, hour, day, week, month or year)", "api/user/rate_limit", 5},
		{"negative rate", "- key: user\n  rate_limit: {unit: second, requests_per_unit: -1}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: -1}),
			"requests_per_unit: must be at least 0 (0 denies every request), got -1", "api/user/rate_limit", 5},
		{"negative multiplier", "- key: user\n  rate_limit: {unit: second, unit_multiplier: -2, requests_per_unit: 1}",
			one(RateLimitSpec{Unit: "second", UnitMultiplier: -2, RequestsPerUnit: 1}),
			"unit_multiplier: must be at least 1, got -2", "api/user/rate_limit", 5},
		{"burst on a window", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, burst: 10}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Burst: 10}),
			"burst: fixed_window has no burst; use token_bucket, leaky_bucket or gcra", "api/user/rate_limit", 5},
		{"negative burst", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra, burst: -3}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Algorithm: "gcra", Burst: -3}),
			"burst: must be at least 1, got -3", "api/user/rate_limit", 5},
		{"precision on a fixed window", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, precision: 10}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Precision: 10}),
			"precision: only with algorithm: sliding_window, not fixed_window", "api/user/rate_limit", 5},
		{"precision too fine", "- key: user\n  rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window, precision: 61}",
			one(RateLimitSpec{Unit: "hour", RequestsPerUnit: 5, Algorithm: "sliding_window", Precision: 61}),
			"precision: must be between 1 and 60, got 61", "api/user/rate_limit", 5},
		{"negative precision", "- key: user\n  rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window, precision: -2}",
			one(RateLimitSpec{Unit: "hour", RequestsPerUnit: 5, Algorithm: "sliding_window", Precision: -2}),
			"precision: must be between 1 and 60, got -2", "api/user/rate_limit", 5},
		{"precision that does not divide", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window, precision: 7}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Algorithm: "sliding_window", Precision: 7}),
			"precision: 7 sub-windows do not cut 1s into whole microseconds: use 5 or 8", "api/user/rate_limit", 5},
		{"lease of sub-windows", "- key: user\n  rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window, precision: 10, sync: lease}",
			one(RateLimitSpec{Unit: "minute", RequestsPerUnit: 5, Algorithm: "sliding_window", Precision: 10, Sync: "lease"}),
			"sync: lease keeps a sliding_window's two windows; precision above 1 is exact only", "api/user/rate_limit", 5},
		{"global sub-windows", "- key: user\n  rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window, precision: 10, scope: global}",
			one(RateLimitSpec{Unit: "minute", RequestsPerUnit: 5, Algorithm: "sliding_window", Precision: 10, Scope: "global"}),
			"scope: global shares a sliding_window's two windows between regions; precision above 1 is for scope: region", "api/user/rate_limit", 5},
		{"unknown algorithm", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_buckets}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Algorithm: "token_buckets"}),
			`algorithm: unknown algorithm "token_buckets" (want one of fixed_window, sliding_window, sliding_log, token_bucket, leaky_bucket, gcra)`, "api/user/rate_limit", 5},
		{"too fast to compute", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5000000000000}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5_000_000_000_000}),
			"requests_per_unit: 5000000000000 per 1s is too large to compute exactly", "api/user/rate_limit", 5},
		{"unknown throttling", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, throttling: medium}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Throttling: "medium"}),
			`throttling: want hard, soft or elastic, got "medium"`, "api/user/rate_limit", 5},
		{"soft without a percent", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, throttling: soft}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Throttling: "soft"}),
			"throttling: soft needs exceed_percent (how far past the limit to admit)", "api/user/rate_limit", 5},
		{"unknown sync", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, sync: later}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Sync: "later"}),
			`sync: want exact, lease or async, got "later"`, "api/user/rate_limit", 5},
		{"lease of a sliding log", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_log, sync: lease}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Algorithm: "sliding_log", Sync: "lease"}),
			"sync: lease is for every algorithm but sliding_log, which is exact only", "api/user/rate_limit", 5},
		{"async of a sliding log", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_log, sync: async}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Algorithm: "sliding_log", Sync: "async"}),
			"sync: async is for every algorithm but sliding_log, which is exact only", "api/user/rate_limit", 5},
		{"sync with unlimited", "- key: user\n  rate_limit: {unlimited: true, sync: lease}",
			one(RateLimitSpec{Unlimited: true, Sync: "lease"}),
			"sync: not allowed with unlimited: true", "api/user/rate_limit", 5},
		{"a percent without soft", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, exceed_percent: 10}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, ExceedPercent: 10}),
			"exceed_percent: only with throttling: soft", "api/user/rate_limit", 5},
		{"a percent too large", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, throttling: soft, exceed_percent: 2000000}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Throttling: "soft", ExceedPercent: 2_000_000}),
			"exceed_percent: must be between 1 and 1000000, got 2000000", "api/user/rate_limit", 5},
		{"soft that admits nothing more", "- key: user\n  rate_limit: {unit: minute, requests_per_unit: 5, throttling: soft, exceed_percent: 10}",
			one(RateLimitSpec{Unit: "minute", RequestsPerUnit: 5, Throttling: "soft", ExceedPercent: 10}),
			"exceed_percent: 10% past 5/1m0s admits nothing more (the excess rounds down to 0); raise exceed_percent", "api/user/rate_limit", 5},
		{"unlimited with a unit", "- key: user\n  rate_limit: {unlimited: true, unit: second}",
			one(RateLimitSpec{Unlimited: true, Unit: "second"}),
			"unit: not allowed with unlimited: true", "api/user/rate_limit", 5},
		{"a burst on a block", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 0, algorithm: gcra, burst: 5}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 0, Algorithm: "gcra", Burst: 5}),
			"burst: not allowed with requests_per_unit: 0 (every request is denied)", "api/user/rate_limit", 5},
		{"replaces itself", "- key: user\n  rate_limit: {name: a, unit: second, requests_per_unit: 5, replaces: [{name: a}]}",
			one(RateLimitSpec{Name: "a", Unit: "second", RequestsPerUnit: 5, Replaces: []ReplaceSpec{{"a"}}}),
			`replaces: a limit cannot replace itself ("a")`, "api/user/rate_limit", 5},
		{"replaces nothing", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: b}]}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Replaces: []ReplaceSpec{{"b"}}}),
			`replaces: no limit named "b" in domain "api"`, "api/user/rate_limit", 5},
		{"replaces an empty name", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: ''}]}",
			one(RateLimitSpec{Unit: "second", RequestsPerUnit: 5, Replaces: []ReplaceSpec{{""}}}),
			"replaces: name must not be empty", "api/user/rate_limit", 5},
		{"empty key", "- key: ''\n  rate_limit: {unit: second, requests_per_unit: 5}",
			[]DomainSpec{{Domain: "api", Descriptors: []DescriptorSpec{{RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 5}}}}},
			"key: must not be empty", "api/", 4},
		{"share_threshold without a wildcard", "- key: user\n  share_threshold: true\n  rate_limit: {unit: second, requests_per_unit: 5}",
			[]DomainSpec{{Domain: "api", Descriptors: []DescriptorSpec{{Key: "user", ShareThreshold: true, RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 5}}}}},
			"share_threshold: only a wildcard value (with *) can share its threshold", "api/user", 5},
		{"rate_limit and rate_limits", "- key: user\n  rate_limit: {unit: second, requests_per_unit: 5}\n  rate_limits: [{unit: minute, requests_per_unit: 50}]",
			[]DomainSpec{{Domain: "api", Descriptors: []DescriptorSpec{{Key: "user", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 5},
				RateLimits: []RateLimitSpec{{Unit: "minute", RequestsPerUnit: 50}}}}}},
			"descriptor: rate_limit and rate_limits together; put every limit in rate_limits", "api/user", 6},
		{"unlimited beside others", "- key: user\n  rate_limits: [{unlimited: true}, {unit: minute, requests_per_unit: 50}]",
			[]DomainSpec{{Domain: "api", Descriptors: []DescriptorSpec{{Key: "user", RateLimits: []RateLimitSpec{{Unlimited: true}, {Unit: "minute", RequestsPerUnit: 50}}}}}},
			"rate_limits: an unlimited limit cannot sit beside others", "api/user/rate_limits[0]", 5},
		{"the same limit twice", "- key: user\n  rate_limits: [{unit: minute, requests_per_unit: 50}, {unit: minute, requests_per_unit: 50}]",
			[]DomainSpec{{Domain: "api", Descriptors: []DescriptorSpec{{Key: "user", RateLimits: []RateLimitSpec{{Unit: "minute", RequestsPerUnit: 50}, {Unit: "minute", RequestsPerUnit: 50}}}}}},
			"rate_limits: the same limit twice", "api/user/rate_limits[1]", 5},
		{"a repeated descriptor", "- key: user\n  value: bob\n  rate_limit: {unit: second, requests_per_unit: 5}\n- key: user\n  value: bob\n  rate_limit: {unit: second, requests_per_unit: 6}",
			[]DomainSpec{{Domain: "api", Descriptors: []DescriptorSpec{
				{Key: "user", Value: "bob", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 5}},
				{Key: "user", Value: "bob", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 6}}}}},
			`duplicate descriptor key "user" value "bob"`, "api/user=bob", 7},
		{"an empty domain", "domain: ''\ndescriptors: []", []DomainSpec{{}}, "domain: must not be empty", "domains[0]", 1},
		{"a repeated domain", "domain: api\n---\ndomain: api", []DomainSpec{{Domain: "api"}, {Domain: "api"}}, `duplicate domain "api"`, "api", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := tt.yaml
			if !strings.HasPrefix(doc, "domain:") {
				doc = "domain: api\ndescriptors:\n" + indent(doc) + "\n"
				doc = "# " + tt.name + "\n" + doc
			}
			_, ferr := Parse("rules.yaml", []byte(doc))
			_, gerr := NewSet(tt.go_...)
			fe, ge := only(t, "YAML", ferr), only(t, "Go values", gerr)
			if fe == nil || ge == nil {
				return
			}
			msg := func(e *Error) string { m, _, _ := strings.Cut(e.Msg, " (first at"); return m }
			if msg(fe) != tt.msg || msg(ge) != tt.msg {
				t.Errorf("messages\n  file: %s\n  Go:   %s\nwant %s", fe.Msg, ge.Msg, tt.msg)
			}
			if fe.File != "rules.yaml" || fe.Line != tt.line {
				t.Errorf("file's mistake at %s:%d, want rules.yaml:%d", fe.File, fe.Line, tt.line)
			}
			if ge.File != "" || ge.Line != 0 || ge.Path != tt.path {
				t.Errorf("Go values' mistake at %q:%d path %q, want path %q", ge.File, ge.Line, ge.Path, tt.path)
			}
			if want := tt.path + ": " + ge.Msg; ge.Error() != want {
				t.Errorf("Error() = %q, want %q", ge.Error(), want)
			}
		})
	}
}

// indent indents YAML lines by two spaces, under descriptors:.
func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

// only returns the only *Error of err, failing the test otherwise.
func only(t *testing.T, what string, err error) *Error {
	t.Helper()
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 {
		t.Errorf("%s: error %v, want exactly one mistake", what, err)
		return nil
	}
	return es[0]
}

// TestNewSetExample builds rules from a Go literal, as a program or a rules
// database would, and checks a mistake deep in it is placed by its path.
func TestNewSetExample(t *testing.T) {
	t.Parallel()
	login := DescriptorSpec{Key: "path", Value: "/login", RateLimits: []RateLimitSpec{
		{Unit: "minute", RequestsPerUnit: 5},
		{Unit: "hour", RequestsPerUnit: 20, Algorithm: "gcra", Burst: 5},
	}}
	specs := []DomainSpec{{Domain: "api", Descriptors: []DescriptorSpec{
		{Key: "user", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 30, Algorithm: "token_bucket", Burst: 100},
			Descriptors: []DescriptorSpec{login}},
	}}}
	s, err := NewSet(specs...)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Match("api", []Entry{{Key: "user", Value: "alice"}, {Key: "path", Value: "/login"}})
	if err != nil || r == nil || len(r.Limits) != 2 || r.Limits[1].Limit.Burst != 5 || r.File != "" || r.Line != 0 {
		t.Fatalf("Match(user=alice, path=/login) = %+v, %v", r, err)
	}
	specs[0].Descriptors[0].Descriptors[0].RateLimits[1].Burst = -1
	_, err = NewSet(specs...)
	if err == nil || err.Error() != "api/user/path=/login/rate_limits[1]: burst: must be at least 1, got -1" {
		t.Errorf("NewSet with a bad burst: %v", err)
	}
	_, err = NewSet(DomainSpec{Domain: "api", Descriptors: []DescriptorSpec{{Key: "k", Metadata: map[string]any{"c": make(chan int)}}}})
	if err == nil || err.Error() != "api/k: metadata: c: a chan int is not JSON data" {
		t.Errorf("NewSet with a channel in metadata: %v", err)
	}
}

// TestSync reads sluice's sync: the mode a limit names, empty for the
// server's default.
func TestSync(t *testing.T) {
	t.Parallel()
	set, err := Parse("rules.yaml", []byte(`domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window, sync: lease}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 100, sync: exact}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: gcra}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, sync: async}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket, burst: 200, sync: async}
  - key: leased
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: gcra, burst: 300, sync: lease}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, want string }{{"user", "lease"}, {"ip", "exact"}, {"path", ""}, {"tenant", "async"}, {"bucket", "async"}, {"leased", "lease"}} {
		r, err := set.Match("api", []Entry{{Key: tc.key, Value: "x"}})
		if err != nil || r == nil {
			t.Fatalf("Match %s: %v, %v", tc.key, r, err)
		}
		if got := r.Limits[0].Sync.String(); got != tc.want {
			t.Errorf("%s: sync %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestCaps checks the caps on rules as data: descriptors nested too deep,
// from Go values and from YAML alike, and more descriptors and limits than
// a source may state.
func TestCaps(t *testing.T) {
	t.Parallel()
	nested := func(depth int) DomainSpec {
		d := DescriptorSpec{Key: "k", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 1}}
		for range depth - 1 {
			d = DescriptorSpec{Key: "k", Descriptors: []DescriptorSpec{d}}
		}
		return DomainSpec{Domain: "api", Descriptors: []DescriptorSpec{d}}
	}
	if _, err := NewSet(nested(maxDepth)); err != nil {
		t.Errorf("descriptors %d deep: %v", maxDepth, err)
	}
	_, err := NewSet(nested(maxDepth + 1))
	if e := only(t, "Go values", err); e != nil && !strings.HasSuffix(e.Error(), fmt.Sprintf(": descriptors nested more than %d deep", maxDepth)) {
		t.Errorf("descriptors %d deep: %v", maxDepth+1, err)
	}
	doc, err := yaml.Marshal(nested(maxDepth + 1))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse("deep.yaml", doc)
	if e := only(t, "YAML", err); e != nil && (e.Line == 0 || !strings.Contains(e.Msg, "nested more than")) {
		t.Errorf("descriptors %d deep in YAML: %v", maxDepth+1, err)
	}

	var errs Errors
	c := &checker{rp: &report{errs: &errs}, budget: 5}
	specs := make([]DescriptorSpec, 4)
	for i := range specs {
		specs[i] = DescriptorSpec{Key: fmt.Sprint("k", i), RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 1}}
	}
	c.descriptors(specs, &parsedDomain{name: "api", names: map[string]bool{}}, nil, "api")
	if len(errs) != 1 || errs[0].Msg != fmt.Sprintf("too large: more than %d descriptors and limits", maxRules) || !c.rp.over {
		t.Errorf("8 descriptors and limits against a budget of 5: %v", errs)
	}
}
