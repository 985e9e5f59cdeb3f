package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// golden compares got with the golden file at path, or rewrites it with
// -update.
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (run go test -update if the change is right)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// cases lists the rules files and directories under dir, skipping golden
// files, as the names of test cases.
func cases(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() || isRulesFile(e.Name()) {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		t.Fatalf("no test cases in %s", dir)
	}
	return names
}

// TestLoadErrors loads every broken rules file (or directory) under
// testdata/invalid and compares all of its file:line errors with its golden
// file.
func TestLoadErrors(t *testing.T) {
	t.Parallel()
	for _, name := range cases(t, "testdata/invalid") {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join("testdata/invalid", name)
			s, err := Load(path)
			if err == nil {
				t.Fatalf("Load(%s) = %v, want errors", path, s.Domains())
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("Load(%s) error %T %v, want Errors", path, err, err)
			}
			for _, e := range errs {
				if !strings.HasPrefix(e.File, "testdata/invalid/"+name) {
					t.Errorf("error %q names file %q, outside the case", e, e.File)
				}
			}
			var one *Error
			if !errors.As(err, &one) || one != errs[0] {
				t.Errorf("errors.As(*Error) = %v, want the first error %v", one, errs[0])
			}
			golden(t, strings.TrimSuffix(path, filepath.Ext(path))+".golden", []byte(err.Error()+"\n"))
		})
	}
}

// TestLoadValid loads every rules file under testdata/valid and compares
// the rules in force, as GET /v1/rules renders them, with its golden file.
func TestLoadValid(t *testing.T) {
	t.Parallel()
	for _, name := range cases(t, "testdata/valid") {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join("testdata/valid", name)
			s, err := Load(path)
			if err != nil {
				t.Fatalf("Load(%s): %v", path, err)
			}
			checkValid(t, s)
			b, err := json.MarshalIndent(s, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden(t, strings.TrimSuffix(path, filepath.Ext(path))+".json", append(b, '\n'))
		})
	}
}

// unitLengths are the units' lengths as Envoy's ratelimit states them,
// written out here apart from the code under test.
var unitLengths = map[string]time.Duration{
	"second": time.Second, "minute": 60 * time.Second, "hour": 3600 * time.Second,
	"day": 86400 * time.Second, "week": 7 * 86400 * time.Second,
	"month": 30 * 86400 * time.Second, "year": 365 * 86400 * time.Second,
}

// checkValid checks what every Set must hold: limits that validate (but
// for unlimited ones), IDs that are unique, and rules that Match finds.
func checkValid(t *testing.T, s *Set) {
	t.Helper()
	ids := map[string]string{}
	var walk func(rules []*Rule, entries []Entry)
	walk = func(rules []*Rule, entries []Entry) {
		for _, r := range rules {
			if r.Depth() != len(entries)+1 {
				t.Errorf("%s: Depth() = %d, want %d", r.Path, r.Depth(), len(entries)+1)
			}
			for _, l := range r.Limits {
				if l.Unlimited {
					continue
				}
				if l.Block {
					one := l.Limit
					one.Rate = 1
					if l.Limit.Rate != 0 || l.Limit.Burst != 0 || l.Throttling != Hard || one.Validate() != nil {
						t.Errorf("%s: blocking limit %v: want a zero rate and burst, hard throttling and a valid period", r.Path, l.Limit)
					}
				} else if err := l.Limit.Validate(); err != nil {
					t.Errorf("%s: limit %v does not validate: %v", r.Path, l.Limit, err)
				}
				if want := unitLengths[l.Unit] * time.Duration(l.UnitMultiplier); l.Period() != want || want == 0 {
					t.Errorf("%s: Period() = %v with unit %q × %d, want %v", r.Path, l.Period(), l.Unit, l.UnitMultiplier, want)
				}
				if prev, dup := ids[l.ID]; dup {
					t.Errorf("limit ID %s of %s also belongs to %s", l.ID, r.Path, prev)
				}
				ids[l.ID] = r.Path
			}
			// A descriptor made of the rule's own key and value (the
			// pattern itself, for a wildcard) lands on it, unless an
			// earlier wildcard of the same key catches the value first.
			e := append(append([]Entry(nil), entries...), Entry{Key: r.Key, Value: r.Value})
			got, err := s.Match(r.Domain, e)
			if err != nil {
				t.Fatalf("Match(%s, %v): %v", r.Domain, e, err)
			}
			if len(r.Limits) > 0 && got != r && !r.Wildcard() {
				t.Errorf("Match(%s, %v) = %v, want the rule at %s:%d", r.Domain, e, got, r.File, r.Line)
			}
			walk(r.Descriptors, e)
		}
	}
	for _, d := range s.Domains() {
		walk(s.Rules(d), nil)
	}
}

// TestLoadDirectory loads a directory as a ConfigMap mount presents it:
// rules files as symlinks into ..data, a symlink to a timestamped
// directory, beside hidden files, other files and subdirectories, which
// are all skipped.
func TestLoadDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "..2026_11_21_23_00_00.000000001", "api.yaml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	write(t, filepath.Join(dir, "..2026_11_21_23_00_00.000000001", "edge.yml"), "domain: edge\n")
	symlink(t, "..2026_11_21_23_00_00.000000001", filepath.Join(dir, "..data"))
	symlink(t, "..data/api.yaml", filepath.Join(dir, "api.yaml"))
	symlink(t, "..data/edge.yml", filepath.Join(dir, "edge.yml"))
	write(t, filepath.Join(dir, ".hidden.yaml"), "domain: hidden\n")
	write(t, filepath.Join(dir, "README.md"), "not rules\n")
	write(t, filepath.Join(dir, "nested.yaml", "x.yaml"), "domain: nested\n") // a directory named like a file
	write(t, filepath.Join(dir, "sub", "sub.yaml"), "domain: sub\n")

	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(s.Domains(), ","), "api,edge"; got != want {
		t.Errorf("Domains() = %s, want %s", got, want)
	}
	r, err := s.Match("api", []Entry{{Key: "user", Value: "alice"}})
	if err != nil || r == nil || r.Limits[0].Limit.Rate != 5 {
		t.Errorf("Match(api, user=alice) = %v, %v; want the 5/s rule", r, err)
	}
	if r != nil && r.File != filepath.Join(dir, "api.yaml") {
		t.Errorf("rule file = %s, want the name in the directory", r.File)
	}

	empty := t.TempDir()
	write(t, filepath.Join(empty, "notes.txt"), "nothing\n")
	_, err = Load(empty)
	var errs Errors
	if !errors.As(err, &errs) || !strings.Contains(err.Error(), "no *.yaml or *.yml files") {
		t.Errorf("Load(empty dir) = %v, want an Error about no rules files", err)
	}

	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want os.ErrNotExist", err)
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestLimitIDStable checks that a limit's ID, and so its counter, follows
// what it counts (domain, descriptor path, algorithm, period) and nothing
// else: edits of the rate, the burst, throttling, shadow mode, names and
// order keep it; edits of what is counted change it.
func TestLimitIDStable(t *testing.T) {
	t.Parallel()
	const base = `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10}
`
	const bucket = `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
`
	tests := []struct {
		name       string
		base, yaml string
		same       bool
	}{
		{"unchanged", base, base, true},
		{"reordered, commented, renamed, shadowed, soft", base, `
domain: api
descriptors:
  - key: ip   # first now
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: user
    descriptors:
      - key: path
        value: /login
        shadow_mode: true
        rate_limit: {name: login, requests_per_unit: 5, unit: minute, throttling: soft, exceed_percent: 20}
`, true},
		{"first in a list of limits", base, `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limits:
          - {unit: minute, requests_per_unit: 5}
          - {unit: hour, requests_per_unit: 50}
`, true},
		{"explicit defaults", base, `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, unit_multiplier: 1, requests_per_unit: 5, algorithm: fixed_window}
`, true},
		{"the same period in other units", base, strings.Replace(base, "{unit: minute,", "{unit: second, unit_multiplier: 60,", 1), true},
		{"new rate", base, strings.Replace(base, "requests_per_unit: 5}", "requests_per_unit: 6}", 1), true},
		{"new burst", bucket, strings.Replace(bucket, "burst: 10", "burst: 20", 1), true},
		{"new rate and no burst", bucket, strings.Replace(bucket, "requests_per_unit: 5, algorithm: token_bucket, burst: 10", "requests_per_unit: 50, algorithm: token_bucket", 1), true},
		{"new unit", base, strings.Replace(base, "{unit: minute", "{unit: hour", 1), false},
		{"new multiplier", base, strings.Replace(base, "{unit: minute,", "{unit: minute, unit_multiplier: 2,", 1), false},
		{"new algorithm", base, strings.Replace(base, "requests_per_unit: 5}", "requests_per_unit: 5, algorithm: sliding_window}", 1), false},
		{"precision 1", strings.Replace(base, "requests_per_unit: 5}", "requests_per_unit: 5, algorithm: sliding_window}", 1), strings.Replace(base, "requests_per_unit: 5}", "requests_per_unit: 5, algorithm: sliding_window, precision: 1}", 1), true},
		{"new precision", strings.Replace(base, "requests_per_unit: 5}", "requests_per_unit: 5, algorithm: sliding_window}", 1), strings.Replace(base, "requests_per_unit: 5}", "requests_per_unit: 5, algorithm: sliding_window, precision: 10}", 1), false},
		{"new place", base, strings.Replace(base, "value: /login", "value: /signin", 1), false},
		{"new parent", base, strings.Replace(base, "key: user", "key: account", 1), false},
		{"new domain", base, strings.Replace(base, "domain: api", "domain: web", 1), false},
		{"unlimited", base, strings.Replace(base, "{unit: minute, requests_per_unit: 5}", "{unlimited: true}", 1), false},
	}
	login := func(t *testing.T, s *Set) *Rule {
		t.Helper()
		for _, d := range s.Domains() {
			for _, v := range []string{"/login", "/signin"} {
				for _, k := range []string{"user", "account"} {
					if r, err := s.Match(d, []Entry{{Key: k, Value: "alice"}, {Key: "path", Value: v}}); err == nil && r != nil {
						return r
					}
				}
			}
		}
		t.Fatalf("no login rule in %v", s.Domains())
		return nil
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s0, err := Parse("base.yaml", []byte(tt.base))
			if err != nil {
				t.Fatal(err)
			}
			s, err := Parse(tt.name+".yaml", []byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			id0, id := login(t, s0).Limits[0].ID, login(t, s).Limits[0].ID
			if (id == id0) != tt.same {
				t.Errorf("ID %s, base ID %s: same = %v, want %v", id, id0, id == id0, tt.same)
			}
		})
	}
}

// TestLimitIDSiblings checks that limits of one descriptor that share an
// algorithm and a period count apart, told by their order among
// themselves, and that the first keeps the ID it has alone.
func TestLimitIDSiblings(t *testing.T) {
	t.Parallel()
	const alone = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 100}
`
	const three = `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 100}
      - {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
      - {unit: second, requests_per_unit: 50, algorithm: token_bucket, burst: 50}
      - {unit: second, requests_per_unit: 20, algorithm: gcra}
`
	// The second token bucket of a second, with another rate and burst.
	const edited = `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 100}
      - {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
      - {unit: second, requests_per_unit: 60, algorithm: token_bucket, burst: 70}
      - {unit: second, requests_per_unit: 20, algorithm: gcra}
`
	ids := func(src string) []string {
		t.Helper()
		s, err := Parse("rules.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range s.Rules("api")[0].Limits {
			out = append(out, l.ID)
		}
		return out
	}
	a, l, e := ids(alone), ids(three), ids(edited)
	if a[0] != l[0] {
		t.Errorf("first of its kind: ID %s, alone %s; want the same", l[0], a[0])
	}
	seen := map[string]int{}
	for i, id := range l {
		if j, dup := seen[id]; dup {
			t.Errorf("limits %d and %d share ID %s", j, i, id)
		}
		seen[id] = i
	}
	if !slices.Equal(l, e) {
		t.Errorf("IDs %v after editing a rate and burst, %v before; want the same", e, l)
	}
}

// TestParseVersion checks that Version follows the contents.
func TestParseVersion(t *testing.T) {
	t.Parallel()
	const a = "domain: api\n"
	s1, err1 := Parse("a.yaml", []byte(a))
	s2, err2 := Parse("a.yaml", []byte(a))
	s3, err3 := Parse("a.yaml", []byte(a+"# edited\n"))
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatal(err)
	}
	if s1.Version() != s2.Version() || s1.Version() == s3.Version() || s1.Version() == "" {
		t.Errorf("versions %q %q %q: want the first two equal, the third different", s1.Version(), s2.Version(), s3.Version())
	}
	var nilSet *Set
	if _, err := nilSet.Match("api", nil); !errors.Is(err, ErrUnknownDomain) {
		t.Errorf("nil Set: Match error %v, want ErrUnknownDomain", err)
	}
	if b, err := nilSet.MarshalJSON(); err != nil || string(b) != `{"version":"","domains":[]}` {
		t.Errorf("nil Set JSON = %s, %v", b, err)
	}
}

// TestSizeCaps checks that a rules file above the cap on one file, or a
// directory above the cap on all its files, is refused before it is
// parsed, naming the file and the cap, and that one at the cap loads.
func TestSizeCaps(t *testing.T) {
	t.Parallel()
	const rules = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	// padded returns the rules padded with a comment to exactly n bytes,
	// or, with broken, text that is not YAML at all.
	padded := func(n int, broken bool) []byte {
		b := []byte(rules + "#")
		if broken {
			b = []byte("{[: not yaml\n#")
		}
		b = append(b, bytes.Repeat([]byte{'x'}, n-len(b)-1)...)
		return append(b, '\n')
	}
	dir := t.TempDir()
	at := filepath.Join(dir, "at.yaml")
	over := filepath.Join(dir, "over.yaml")
	overBroken := filepath.Join(dir, "over-broken.yaml")
	for name, data := range map[string][]byte{
		at: padded(DefaultMaxFileBytes, false), over: padded(DefaultMaxFileBytes+1, false),
		overBroken: padded(DefaultMaxFileBytes+1, true),
	} {
		if err := os.WriteFile(name, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The size alone decides, not the parse: a file at the cap is read
	// (its parse is left to the small caps below, which are cheaper).
	if _, err := (Loader{}).readFile(at); err != nil {
		t.Errorf("readFile(a file of exactly %d bytes): %v", DefaultMaxFileBytes, err)
	}
	wantCap := func(t *testing.T, err error, file, msg string) {
		t.Helper()
		var es Errors
		if !errors.As(err, &es) || len(es) != 1 {
			t.Fatalf("error %v, want one Error", err)
		}
		if es[0].File != file || !strings.Contains(es[0].Msg, msg) {
			t.Errorf("error %q, want one naming %s with %q", es[0], file, msg)
		}
	}
	_, err := Load(over)
	wantCap(t, err, over, "too large: 16777217 bytes, above the cap of 16 MiB (16777216 bytes) on one rules file")
	// Not parsed: the refusal is about the size, not the YAML.
	_, err = Load(overBroken)
	wantCap(t, err, overBroken, "above the cap of 16 MiB")
	_, err = Parse("over.yaml", padded(DefaultMaxFileBytes+1, false))
	wantCap(t, err, "over.yaml", "above the cap of 16 MiB")

	small := Loader{MaxFileBytes: 200, MaxTotalBytes: 300}
	sdir := t.TempDir()
	write(t, filepath.Join(sdir, "a.yaml"), string(padded(200, false)))
	if _, err := small.Load(sdir); err != nil {
		t.Errorf("Load(a directory of one 200-byte file) with caps 200/300: %v", err)
	}
	_, err = small.Load(filepath.Join(sdir, "a.yaml"))
	if err != nil {
		t.Errorf("Load(a 200-byte file) with a cap of 200: %v", err)
	}
	write(t, filepath.Join(sdir, "b.yaml"), "domain: web\n"+strings.Repeat("#", 110)+"\n")
	_, err = small.Load(sdir)
	wantCap(t, err, sdir, "add up to more than the cap of 300 bytes on a directory (reached at b.yaml)")
	write(t, filepath.Join(sdir, "b.yaml"), string(padded(201, false)))
	_, err = Loader{MaxFileBytes: 200, MaxTotalBytes: 1000}.Load(sdir)
	wantCap(t, err, filepath.Join(sdir, "b.yaml"), "201 bytes, above the cap of 200 bytes on one rules file")
}

// TestMergeDomains splits one domain over several files, as Envoy's
// MERGE_DOMAIN_CONFIG allows: refused by default, joined with
// Loader.MergeDomains (limits of either file may replace the other's), and
// a descriptor stated in two files refused with both places named.
func TestMergeDomains(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {name: per_user, unit: second, requests_per_unit: 5}\n")
	write(t, filepath.Join(dir, "b.yaml"), "domain: api\ndescriptors:\n  - key: user\n    value: bob\n    rate_limit: {unit: second, requests_per_unit: 50, replaces: [{name: per_user}]}\n---\ndomain: web\n")

	_, err := Load(dir)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "b.yaml")+`:1: duplicate domain "api" (first at `+filepath.Join(dir, "a.yaml")+":1)") {
		t.Errorf("Load without merging: %v, want a duplicate domain", err)
	}
	s, err := Loader{MergeDomains: true}.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, s)
	if got := strings.Join(s.Domains(), ","); got != "api,web" {
		t.Errorf("Domains() = %s", got)
	}
	for user, rate := range map[string]int64{"alice": 5, "bob": 50} {
		r, err := s.Match("api", []Entry{{Key: "user", Value: user}})
		if err != nil || r == nil || r.Limits[0].Limit.Rate != rate {
			t.Errorf("Match(user=%s) = %v, %v; want the %d/s rule", user, r, err, rate)
		}
	}

	write(t, filepath.Join(dir, "c.yml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 9}\n")
	_, err = Loader{MergeDomains: true}.Load(dir)
	if err == nil || err.Error() != filepath.Join(dir, "c.yml")+`:3: duplicate descriptor key "user" without value in domain "api" (first at `+filepath.Join(dir, "a.yaml")+":3)" {
		t.Errorf("Load with a descriptor in two files: %v", err)
	}

	g, err := Loader{MergeDomains: true}.NewSet(
		DomainSpec{Domain: "api", Descriptors: []DescriptorSpec{{Key: "user", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 5}}}},
		DomainSpec{Domain: "api", Descriptors: []DescriptorSpec{{Key: "ip", RateLimit: &RateLimitSpec{Unit: "second", RequestsPerUnit: 7}}}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := g.Match("api", []Entry{{Key: "ip", Value: "1.2.3.4"}}); r == nil || r.Limits[0].Limit.Rate != 7 {
		t.Errorf("NewSet with merging: Match(ip) = %v", r)
	}
}

// TestLoadEnvoyLayout reads a directory as Envoy's runtime does: every
// file below it, any extension, subdirectories too, links to files but not
// to directories, hidden files unless IgnoreDotFiles; and, by default,
// only its own *.yaml and *.yml files.
func TestLoadEnvoyLayout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "runtime", "config")
	rules := func(domain string) string { return "domain: " + domain + "\n" }
	write(t, filepath.Join(cfg, "a.yaml"), rules("a"))
	write(t, filepath.Join(cfg, "sub", "b.conf"), rules("b"))
	write(t, filepath.Join(cfg, "sub", "deeper", "c"), rules("c"))
	write(t, filepath.Join(cfg, ".hidden"), rules("h"))
	write(t, filepath.Join(cfg, ".dotdir", "d.yaml"), rules("d"))
	write(t, filepath.Join(dir, "elsewhere", "l.txt"), rules("l"))
	write(t, filepath.Join(dir, "elsewhere", "dir", "z.yaml"), rules("z"))
	symlink(t, filepath.Join(dir, "elsewhere", "l.txt"), filepath.Join(cfg, "link"))
	symlink(t, filepath.Join(dir, "elsewhere", "dir"), filepath.Join(cfg, "linkdir"))
	symlink(t, cfg, filepath.Join(dir, "current")) // the root itself a link

	tests := []struct {
		name string
		ld   Loader
		path string
		want string
	}{
		{"default", Loader{}, cfg, "a"},
		{"envoy", Loader{EnvoyLayout: true}, cfg, "a,b,c,d,h,l"},
		{"envoy without dot files", Loader{EnvoyLayout: true, IgnoreDotFiles: true}, cfg, "a,b,c,l"},
		{"envoy through a linked root", Loader{EnvoyLayout: true, IgnoreDotFiles: true}, filepath.Join(dir, "current"), "a,b,c,l"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := tt.ld.Load(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(s.Domains(), ","); got != tt.want {
				t.Errorf("Domains() = %s, want %s", got, tt.want)
			}
		})
	}
	s, err := Loader{EnvoyLayout: true}.Load(filepath.Join(dir, "current"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.domains["c"].file, filepath.Join(dir, "current", "sub", "deeper", "c"); got != want {
		t.Errorf("domain c's file %s, want %s (named under the path given)", got, want)
	}

	// A Kubernetes ConfigMap mount: with IgnoreDotFiles each file once.
	cm := t.TempDir()
	write(t, filepath.Join(cm, "..2026_11_21_23_00_00.000000001", "api.yaml"), rules("api"))
	symlink(t, "..2026_11_21_23_00_00.000000001", filepath.Join(cm, "..data"))
	symlink(t, "..data/api.yaml", filepath.Join(cm, "api.yaml"))
	if s, err := (Loader{EnvoyLayout: true, IgnoreDotFiles: true}).Load(cm); err != nil || strings.Join(s.Domains(), ",") != "api" {
		t.Errorf("ConfigMap mount with IgnoreDotFiles: %v, %v", s.Domains(), err)
	}
	if _, err := (Loader{EnvoyLayout: true}).Load(cm); err == nil || !strings.Contains(err.Error(), `duplicate domain "api"`) {
		t.Errorf("ConfigMap mount with dot files read: %v, want the domain twice, as Envoy", err)
	}
	empty := t.TempDir()
	if _, err := (Loader{EnvoyLayout: true}).Load(empty); err == nil || !strings.Contains(err.Error(), "no rules: the directory has no files") {
		t.Errorf("empty directory: %v", err)
	}
}
