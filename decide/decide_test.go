package decide_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// want is the expected status of one descriptor. unit names the binding
// limit by its unit ("" for no limit); retry is checked when not zero.
type want struct {
	code       decide.Code
	unit       string
	remaining  int64
	shadowOver bool
	retry      time.Duration
}

var (
	ok = func(unit string, remaining int64) want {
		return want{code: decide.OK, unit: unit, remaining: remaining}
	}
	over = func(unit string, retry time.Duration) want {
		return want{code: decide.OverLimit, unit: unit, retry: retry}
	}
	nolimit = want{code: decide.OK}
)

// step is one decision of a scenario, after moving the clock by advance.
type step struct {
	advance time.Duration
	req     *decide.Request
	overall decide.Code
	want    []want
}

func TestDecide(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		rules string
		steps []step
	}{
		{
			name: "one counter per value, fixed window",
			rules: `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
`,
			steps: []step{
				{req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 2)}},
				{req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 1)}},
				{req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 0)}},
				{advance: 15 * time.Second, req: req("api", []string{"user", "alice"}), overall: decide.OverLimit, want: []want{over("minute", 45*time.Second)}},
				{req: req("api", []string{"user", "bob"}), overall: decide.OK, want: []want{ok("minute", 2)}},
				{advance: 45 * time.Second, req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 2)}},
			},
		},
		{
			name: "several limits on one descriptor: the one with the least remaining binds",
			rules: `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5}
`,
			steps: []step{
				{req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("second", 1)}},
				{req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("second", 0)}},
				{req: req("api", []string{"user", "alice"}), overall: decide.OverLimit, want: []want{over("second", time.Second)}},
				{advance: time.Second, req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("second", 1)}},
				{req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("second", 0)}}, // second 0, minute 1
				{advance: time.Second, req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 0)}},
				{req: req("api", []string{"user", "alice"}), overall: decide.OverLimit, want: []want{over("minute", 58*time.Second)}},
			},
		},
		{
			name: "a request denied by one descriptor consumes nothing of the others",
			rules: `
domain: api
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`,
			steps: []step{
				{req: req("api", []string{"ip", "10.0.0.1"}, []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 0), ok("minute", 9)}},
				// ip denies: user consumes nothing and reports the 9 really left.
				{req: req("api", []string{"ip", "10.0.0.1"}, []string{"user", "alice"}), overall: decide.OverLimit, want: []want{over("minute", time.Minute), ok("minute", 9)}},
				{req: req("api", []string{"ip", "10.0.0.1"}, []string{"user", "alice"}), overall: decide.OverLimit, want: []want{over("minute", time.Minute), ok("minute", 9)}},
				{req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 8)}},
			},
		},
		{
			name: "after a denial the others report what is really left, whatever their algorithm and cost",
			rules: `
domain: api
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 20, algorithm: token_bucket}
      - {unit: hour, requests_per_unit: 30, algorithm: gcra}
      - {unit: minute, requests_per_unit: 25, algorithm: sliding_window}
      - {unit: minute, requests_per_unit: 40, algorithm: sliding_log}
`,
			steps: []step{
				{req: withCost(req("api", []string{"ip", "10.0.0.1"}, []string{"user", "alice"}), 4), overall: decide.OK, want: []want{ok("minute", 2), ok("minute", 16)}},
				// ip denies the next 4: user's binding limit, the token
				// bucket, still has 16, not 12.
				{req: withCost(req("api", []string{"ip", "10.0.0.1"}, []string{"user", "alice"}), 4), overall: decide.OverLimit, want: []want{over("minute", time.Minute), ok("minute", 16)}},
				{req: withCost(req("api", []string{"user", "alice"}), 4), overall: decide.OK, want: []want{ok("minute", 12)}},
			},
		},
		{
			name: "shadow mode reports over limit and answers OK, and never blocks the others",
			rules: `
domain: api
descriptors:
  - key: export
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`,
			steps: []step{
				{req: req("api", []string{"export", "x"}, []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 0), ok("minute", 4)}},
				{req: req("api", []string{"export", "x"}, []string{"user", "alice"}), overall: decide.OK, want: []want{{code: decide.OK, unit: "minute", shadowOver: true, retry: time.Minute}, ok("minute", 3)}},
				{req: req("api", []string{"user", "alice"}), overall: decide.OK, want: []want{ok("minute", 2)}},
			},
		},
		{
			name: "soft throttling admits exceed_percent more and reports the nominal limit",
			rules: `
domain: api
descriptors:
  - key: path
    value: /search
    rate_limit: {unit: minute, requests_per_unit: 5, throttling: soft, exceed_percent: 40}
`,
			steps: []step{
				{req: req("api", []string{"path", "/search"}), overall: decide.OK, want: []want{ok("minute", 4)}},
				{req: withCost(req("api", []string{"path", "/search"}), 4), overall: decide.OK, want: []want{ok("minute", 0)}},
				// 5 × 1.4 = 7: two more pass, reporting nothing remaining.
				{req: req("api", []string{"path", "/search"}), overall: decide.OK, want: []want{ok("minute", 0)}},
				{req: req("api", []string{"path", "/search"}), overall: decide.OK, want: []want{ok("minute", 0)}},
				{req: req("api", []string{"path", "/search"}), overall: decide.OverLimit, want: []want{over("minute", time.Minute)}},
			},
		},
		{
			name: "unlimited and unmatched descriptors are OK with no limit",
			rules: `
domain: api
descriptors:
  - key: user
    value: admin
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`,
			steps: []step{
				{req: req("api", []string{"user", "admin"}, []string{"plan", "gold"}), overall: decide.OK, want: []want{nolimit, nolimit}},
				{req: req("api", []string{"user", "admin"}, []string{"user", "bob"}), overall: decide.OK, want: []want{nolimit, ok("minute", 0)}},
				{req: req("api", []string{"user", "admin"}, []string{"user", "bob"}), overall: decide.OverLimit, want: []want{nolimit, over("minute", time.Minute)}},
			},
		},
		{
			name: "share_threshold: every value the wildcard matches shares one counter",
			rules: `
domain: api
descriptors:
  - key: path
    value: /shared/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /own/*
    rate_limit: {unit: minute, requests_per_unit: 2}
`,
			steps: []step{
				{req: req("api", []string{"path", "/shared/a"}), overall: decide.OK, want: []want{ok("minute", 1)}},
				{req: req("api", []string{"path", "/shared/b"}), overall: decide.OK, want: []want{ok("minute", 0)}},
				{req: req("api", []string{"path", "/shared/c"}), overall: decide.OverLimit, want: []want{over("minute", time.Minute)}},
				{req: req("api", []string{"path", "/own/a"}), overall: decide.OK, want: []want{ok("minute", 1)}},
				{req: req("api", []string{"path", "/own/b"}), overall: decide.OK, want: []want{ok("minute", 1)}},
			},
		},
		{
			name: "cost 0 checks without counting; a cost above the limit never passes",
			rules: `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
`,
			steps: []step{
				{req: withCost(req("api", []string{"user", "alice"}), 0), overall: decide.OK, want: []want{ok("minute", 3)}},
				{req: withCost(req("api", []string{"user", "alice"}), 2), overall: decide.OK, want: []want{ok("minute", 1)}},
				{req: withCost(req("api", []string{"user", "alice"}), 0), overall: decide.OK, want: []want{ok("minute", 1)}},
				{req: withCost(req("api", []string{"user", "bob"}), 4), overall: decide.OverLimit, want: []want{over("minute", sluice.Never)}},
			},
		},
		{
			name: "replaces: a limit named by another matched limit is left out",
			rules: `
domain: api
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1, name: per_ip}
  - key: partner
    rate_limit:
      unit: minute
      requests_per_unit: 5
      replaces: [{name: per_ip}]
`,
			steps: []step{
				{req: req("api", []string{"ip", "1.2.3.4"}, []string{"partner", "acme"}), overall: decide.OK, want: []want{nolimit, ok("minute", 4)}},
				{req: req("api", []string{"ip", "1.2.3.4"}, []string{"partner", "acme"}), overall: decide.OK, want: []want{nolimit, ok("minute", 3)}},
				{req: req("api", []string{"ip", "1.2.3.4"}), overall: decide.OK, want: []want{ok("minute", 0)}},
				{req: req("api", []string{"ip", "1.2.3.4"}), overall: decide.OverLimit, want: []want{over("minute", time.Minute)}},
			},
		},
		{
			name: "an unknown domain is OK with no limit",
			rules: `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`,
			steps: []step{
				{req: req("other", []string{"user", "alice"}), overall: decide.OK, want: []want{nolimit}},
				{req: req("other", []string{"user", "alice"}), overall: decide.OK, want: []want{nolimit}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			s := newService(t, loadRules(t, tt.rules), clk, decide.DefaultConfig())
			for i, st := range tt.steps {
				clk.Advance(st.advance)
				resp := decideOK(t, s, st.req)
				if resp.Overall != st.overall {
					t.Errorf("step %d: overall %v, want %v", i, resp.Overall, st.overall)
				}
				if resp.Mode != decide.ModeStore {
					t.Errorf("step %d: mode %v, want store", i, resp.Mode)
				}
				for j, w := range st.want {
					checkStatus(t, i, j, resp.Statuses[j], w)
				}
			}
		})
	}
}

func checkStatus(t *testing.T, step, desc int, got decide.Status, w want) {
	t.Helper()
	unit := ""
	if got.Limit != nil {
		unit = got.Limit.Unit
	}
	if got.Code != w.code || unit != w.unit || got.ShadowOverLimit != w.shadowOver {
		t.Errorf("step %d descriptor %d: code %v limit %q shadow over %v, want %v %q %v",
			step, desc, got.Code, unit, got.ShadowOverLimit, w.code, w.unit, w.shadowOver)
	}
	if w.unit == "" {
		return
	}
	if got.Decision.Remaining != w.remaining && w.code == decide.OK {
		t.Errorf("step %d descriptor %d: remaining %d, want %d", step, desc, got.Decision.Remaining, w.remaining)
	}
	if got.Decision.Limit != got.Limit.Limit.Rate && got.Decision.Limit != got.Limit.Limit.Burst {
		t.Errorf("step %d descriptor %d: decision limit %d, want the rules' %v", step, desc, got.Decision.Limit, got.Limit.Limit)
	}
	if w.retry != 0 && got.Decision.RetryAfter != w.retry {
		t.Errorf("step %d descriptor %d: retry after %v, want %v", step, desc, got.Decision.RetryAfter, w.retry)
	}
}

func TestDecideInvalid(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s := newService(t, loadRules(t, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), clk, decide.DefaultConfig())
	tests := []struct {
		name string
		req  *decide.Request
		msg  string
	}{
		{name: "nil", req: nil, msg: "no request"},
		{name: "no domain", req: req("", []string{"user", "a"}), msg: "no domain"},
		{name: "no descriptors", req: &decide.Request{Domain: "api"}, msg: "no descriptors"},
		{name: "unknown unit of a descriptor's limit", req: &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{
			{Cost: 1, Limit: &rules.RequestLimit{RequestsPerUnit: 1, Unit: "fortnight"}}}}, msg: `descriptor 0: limit: unit: unknown unit "fortnight"`},
		{name: "negative rate of a descriptor's limit", req: &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{
			{Cost: 1, Limit: &rules.RequestLimit{RequestsPerUnit: -1, Unit: "second"}}}}, msg: "descriptor 0: limit: requests_per_unit: must be at least 0"},
		{name: "negative cost", req: withCost(req("api", []string{"user", "a"}), -1), msg: "negative cost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, err := s.Decide(context.Background(), tt.req)
			if !errors.Is(err, decide.ErrInvalidRequest) || resp != nil {
				t.Fatalf("Decide = %v, %v; want ErrInvalidRequest", resp, err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not say %q", err, tt.msg)
			}
		})
	}
}

// TestDecideKeys checks the store keys and groups: all limits of a
// descriptor share a Group, different descriptors, domains or values never
// share a key or a group, and no key holds Redis hash-tag syntax (placing
// keys is the store's business).
func TestDecideKeys(t *testing.T) {
	t.Parallel()
	clk := newClock()
	rec := &recorder{Store: newMemory(t, clk)}
	set := loadRules(t, `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: api
        rate_limits:
          - {unit: second, requests_per_unit: 10}
          - {unit: minute, requests_per_unit: 100}
---
domain: web
descriptors:
  - key: user
    descriptors:
      - key: api
        rate_limit: {unit: second, requests_per_unit: 10}
`)
	s := newService(t, set, clk, decide.Config{Store: rec})
	decideOK(t, s, req("api", []string{"user", "alice", "api", "send"}))
	decideOK(t, s, req("api", []string{"user", "alice", "api", "read"}))
	decideOK(t, s, req("api", []string{"user", "al", "api", "icesend"}))
	decideOK(t, s, req("web", []string{"user", "alice", "api", "send"}))
	reqs := rec.requests()
	if len(reqs) != 7 {
		t.Fatalf("got %d requests %+v, want 7", len(reqs), reqs)
	}
	if reqs[0].Group == "" || reqs[0].Group != reqs[1].Group {
		t.Errorf("limits of one descriptor in groups %q and %q, want one", reqs[0].Group, reqs[1].Group)
	}
	seen := map[string]bool{}
	for _, r := range reqs {
		if seen[r.Key] {
			t.Errorf("key %q used twice in %+v", r.Key, reqs)
		}
		seen[r.Key] = true
		if strings.ContainsAny(r.Key, "{}") {
			t.Errorf("key %q holds hash-tag syntax", r.Key)
		}
	}
	if reqs[0].Group == reqs[2].Group || reqs[0].Group == reqs[4].Group {
		t.Errorf("different values share a group: %+v", reqs)
	}
}

// TestDecideWithoutStore checks that descriptors with nothing to count
// never reach the store: unlimited, unmatched, replaced, or in an unknown
// domain.
func TestDecideWithoutStore(t *testing.T) {
	t.Parallel()
	set := loadRules(t, `
domain: api
descriptors:
  - key: user
    value: admin
    rate_limit: {unlimited: true}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1, name: per_ip}
  - key: partner
    value: internal
    rate_limit:
      unlimited: true
      replaces: [{name: per_ip}]
`)
	tests := []struct {
		name string
		req  *decide.Request
	}{
		{name: "unlimited", req: req("api", []string{"user", "admin"})},
		{name: "unmatched", req: req("api", []string{"plan", "gold"}, []string{"user", "bob"})},
		{name: "replaced", req: req("api", []string{"ip", "1.2.3.4"}, []string{"partner", "internal"})},
		{name: "unknown domain", req: req("web", []string{"ip", "1.2.3.4"})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := &fakeStore{takeAll: refuse}
			s := newService(t, set, newClock(), decide.Config{Store: fake})
			resp := decideOK(t, s, tt.req)
			if resp.Overall != decide.OK || resp.Mode != decide.ModeStore || fake.calls.Load() != 0 {
				t.Errorf("decided %v in mode %v with %d store calls, want OK from no store call", resp.Overall, resp.Mode, fake.calls.Load())
			}
			for i, st := range resp.Statuses {
				if st.Code != decide.OK || st.Limit != nil {
					t.Errorf("descriptor %d: %v with limit %v, want OK with none", i, st.Code, st.Limit)
				}
			}
		})
	}
}
