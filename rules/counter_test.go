package rules_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// TestEditKeepsCount changes a limit's rate under a running decision
// service, as an operator does during an incident, and checks that every
// client keeps its count: raising login from 5 to 6 a minute gives a client
// that used 5 exactly one more, and setting it back to 5 keeps counting.
// Rules, decide and the memory store are the real ones; only the clock is
// injected.
func TestEditKeepsCount(t *testing.T) {
	t.Parallel()
	const five = `
domain: api
descriptors:
  - key: user
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 5}
`
	six := strings.Replace(five, "requests_per_unit: 5", "requests_per_unit: 6", 1)

	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC) // the start of a minute
	now := t0
	mc := memory.DefaultConfig()
	mc.Now = func() time.Time { return now }
	st, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var cur atomic.Pointer[rules.Set]
	load := func(name, src string) {
		t.Helper()
		s, err := rules.Parse(name, []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		cur.Store(s)
	}
	load("five.yaml", five)
	dc := decide.DefaultConfig()
	dc.Rules = cur.Load
	dc.Store = st
	dc.Now = func() time.Time { return now }
	dc.Logger = slog.New(slog.DiscardHandler)
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	// admitted sends n login requests of user and counts those admitted.
	admitted := func(user string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			resp, err := svc.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{
				Entries: []decide.Entry{{Key: "user", Value: user}, {Key: "path", Value: "/login"}}, Cost: 1,
			}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Mode != decide.ModeStore {
				t.Fatalf("decided in mode %v, want the store's", resp.Mode)
			}
			if resp.Overall == decide.OK {
				ok++
			}
		}
		return ok
	}

	steps := []struct {
		at    time.Duration // since t0
		rules string
		user  string
		send  int
		want  int
	}{
		{1 * time.Second, five, "alice", 5, 5},   // alice uses her 5
		{2 * time.Second, five, "bob", 2, 2},     // bob uses 2
		{10 * time.Second, six, "alice", 10, 1},  // raised to 6: alice gets exactly one more
		{11 * time.Second, six, "bob", 10, 4},    // bob has 4 left of 6
		{20 * time.Second, five, "alice", 3, 0},  // back to 5: alice has used 6
		{21 * time.Second, five, "carol", 10, 5}, // a new client gets the limit in force
		{30 * time.Second, six, "carol", 3, 1},   // and keeps her count when it is raised
		{60 * time.Second, five, "alice", 10, 5}, // the next minute starts afresh at 5
	}
	for i, s := range steps {
		now = t0.Add(s.at)
		load("step.yaml", s.rules)
		if got := admitted(s.user, s.send); got != s.want {
			t.Errorf("step %d (%v, %s sends %d): %d admitted, want %d", i, s.at, s.user, s.send, got, s.want)
		}
	}
}

// countingStore counts the requests that reach the store it wraps.
type countingStore struct {
	sluice.Store
	reqs atomic.Int64
}

func (c *countingStore) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	c.reqs.Add(int64(len(reqs)))
	return c.Store.TakeAll(ctx, reqs, ds)
}

// TestBlockingLimit loads Envoy's requests_per_unit: 0 (block a client)
// and decides with the real decide and memory store: the blocked client is
// always over the limit without a store call, even while the store is
// down (fail open), other clients are counted as usual, a request blocked
// by one descriptor consumes nothing of its others, and in shadow mode a
// block only reports that it would deny.
func TestBlockingLimit(t *testing.T) {
	t.Parallel()
	set, err := rules.Parse("rules.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: user
    value: mallory
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	mc := memory.DefaultConfig()
	mc.Now = func() time.Time { return t0 }
	mem, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	st := &countingStore{Store: mem}
	dc := decide.DefaultConfig()
	dc.Rules = func() *rules.Set { return set }
	dc.Store = st
	dc.Fail = decide.FailOpen // what the store-down step below checks (local is the default)
	dc.Now = func() time.Time { return t0 }
	dc.Logger = slog.New(slog.DiscardHandler)
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(descs ...[]decide.Entry) *decide.Response {
		t.Helper()
		r := &decide.Request{Domain: "edge"}
		for _, es := range descs {
			r.Descriptors = append(r.Descriptors, decide.Descriptor{Entries: es, Cost: 1})
		}
		resp, err := svc.Decide(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	ip := func(a string) []decide.Entry { return []decide.Entry{{Key: "remote_address", Value: a}} }
	user := func(u string) []decide.Entry { return []decide.Entry{{Key: "user", Value: u}} }

	for i := range 3 {
		resp := ask(ip("50.0.0.5"))
		s := resp.Statuses[0]
		if resp.Overall != decide.OverLimit || s.Limit == nil || !s.Limit.Block || s.Decision.RetryAfter != sluice.Never || s.Decision.ResetAfter != time.Second {
			t.Errorf("blocked IP, request %d: %v %+v; want OVER_LIMIT by the blocking limit, no retry time (sluice.Never), reset after 1s", i, resp.Overall, s)
		}
	}
	if n := st.reqs.Load(); n != 0 {
		t.Errorf("%d store requests for a blocked client, want 0", n)
	}
	// Another IP and a user beside the blocked IP: the request is denied
	// and consumes nothing, so the user still has both of a minute's 2.
	if resp := ask(user("alice"), ip("50.0.0.5")); resp.Overall != decide.OverLimit || resp.Statuses[0].Code != decide.OK {
		t.Errorf("alice with the blocked IP: %v, statuses %+v; want OVER_LIMIT with alice's own OK", resp.Overall, resp.Statuses)
	}
	for i, want := range []decide.Code{decide.OK, decide.OK, decide.OverLimit} {
		if got := ask(user("alice"), ip("10.0.0.1")).Overall; got != want {
			t.Errorf("alice, request %d: %v, want %v", i, got, want)
		}
	}
	// Shadow mode: OK, and the status says it would have been denied.
	resp := ask(user("mallory"))
	if s := resp.Statuses[0]; resp.Overall != decide.OK || !s.Shadow || !s.ShadowOverLimit {
		t.Errorf("mallory in shadow mode: %v %+v; want OK with ShadowOverLimit", resp.Overall, s)
	}
	// The store down, fail open: the block holds, other clients pass.
	if err := mem.Close(); err != nil {
		t.Fatal(err)
	}
	if got := ask(ip("50.0.0.5")).Overall; got != decide.OverLimit {
		t.Errorf("blocked IP with the store down: %v, want OVER_LIMIT", got)
	}
	if resp := ask(ip("10.0.0.9")); resp.Overall != decide.OK || resp.Mode != decide.ModeOpen {
		t.Errorf("another IP with the store down: %v in mode %v, want OK in fail_open", resp.Overall, resp.Mode)
	}
}

// TestQuotaMode decides Envoy's quota_mode with the real decide and memory
// store: a quota-mode descriptor over its limit denies the request only
// when every quota-mode descriptor of the request is over, while its own
// status says OVER_LIMIT; other descriptors deny as usual.
func TestQuotaMode(t *testing.T) {
	t.Parallel()
	set, err := rules.Parse("rules.yaml", []byte(`
domain: q
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plan
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 6}
`))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	mc := memory.DefaultConfig()
	mc.Now = func() time.Time { return t0 }
	st, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dc := decide.DefaultConfig()
	dc.Rules = func() *rules.Set { return set }
	dc.Store = st
	dc.Logger = slog.New(slog.DiscardHandler)
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(kv ...string) *decide.Response {
		t.Helper()
		r := &decide.Request{Domain: "q"}
		for i := 0; i+1 < len(kv); i += 2 {
			r.Descriptors = append(r.Descriptors, decide.Descriptor{Entries: []decide.Entry{{Key: kv[i], Value: kv[i+1]}}, Cost: 1})
		}
		resp, err := svc.Decide(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	O, X := decide.OK, decide.OverLimit
	steps := []struct {
		overall      decide.Code
		tenant, plan decide.Code
	}{
		{O, O, O}, {O, O, O}, // both quotas have room
		{O, X, O}, {O, X, O}, // the tenant's is spent, the plan's has room
		{X, X, X}, // both spent: denied
	}
	for i, s := range steps {
		resp := ask("tenant", "acme", "plan", "gold")
		if resp.Overall != s.overall || resp.Statuses[0].Code != s.tenant || resp.Statuses[1].Code != s.plan {
			t.Errorf("request %d: %v (tenant %v, plan %v), want %v (%v, %v)", i, resp.Overall,
				resp.Statuses[0].Code, resp.Statuses[1].Code, s.overall, s.tenant, s.plan)
		}
	}
	// One quota descriptor alone, over its limit: every quota one is over.
	if got := ask("tenant", "acme").Overall; got != X {
		t.Errorf("the spent tenant alone: %v, want OVER_LIMIT", got)
	}
	// A descriptor not in quota mode denies by itself, beside a quota with room.
	for range 6 {
		ask("ip", "10.0.0.1")
	}
	if resp := ask("tenant", "other", "ip", "10.0.0.1"); resp.Overall != X || resp.Statuses[0].Code != O {
		t.Errorf("a spent IP beside a tenant with room: %v, statuses %+v; want OVER_LIMIT", resp.Overall, resp.Statuses)
	}
}

// TestOverrideKeepsCount sets, changes and removes an override of one
// tenant under a running decision service: the tenant's count carries
// over each time, as with an edit of the rule, while other tenants keep
// the rule's limit.
func TestOverrideKeepsCount(t *testing.T) {
	t.Parallel()
	base, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	now := t0
	mc := memory.DefaultConfig()
	mc.Now = func() time.Time { return now }
	st, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var cur atomic.Pointer[rules.Set]
	cur.Store(base)
	dc := decide.DefaultConfig()
	dc.Rules = cur.Load
	dc.Store = st
	dc.Logger = slog.New(slog.DiscardHandler)
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	admitted := func(tenant string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			resp, err := svc.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{
				Entries: []decide.Entry{{Key: "tenant", Value: tenant}}, Cost: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Overall == decide.OK {
				ok++
			}
		}
		return ok
	}
	override := func(rate int64) {
		t.Helper()
		var ovs []rules.Override
		if rate >= 0 {
			ovs = append(ovs, rules.Override{Domain: "api", Entries: []rules.Entry{{Key: "tenant", Value: "acme"}},
				Limits: []rules.RateLimitSpec{{Unit: "minute", RequestsPerUnit: rate}}})
		}
		s, err := base.WithOverrides(now, ovs...)
		if err != nil {
			t.Fatal(err)
		}
		cur.Store(s)
	}
	steps := []struct {
		override int64 // -1: none
		tenant   string
		send     int
		want     int
	}{
		{-1, "acme", 5, 5},    // acme uses the rule's 5
		{8, "acme", 10, 3},    // raised to 8 for acme alone: 3 more
		{8, "globex", 10, 5},  // other tenants keep 5
		{-1, "acme", 3, 0},    // the override removed: acme has used 8
		{20, "acme", 30, 12},  // raised to 20: 12 more
		{0, "acme", 3, 0},     // blocked
		{0, "initech", 10, 5}, // others still pass
	}
	for i, s := range steps {
		override(s.override)
		if got := admitted(s.tenant, s.send); got != s.want {
			t.Errorf("step %d (override %d, %s sends %d): %d admitted, want %d", i, s.override, s.tenant, s.send, got, s.want)
		}
	}
}
