package decide_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// inspectRules give user a rule of three limits (a hard one that binds, a
// wider one, a soft one), send an elastic limit over the domain's pool,
// old a limit that blocks, and free an unlimited one.
const inspectRules = `
domain: api
capacity: {unit: second, requests_per_unit: 10}
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 100}
      - {unit: minute, requests_per_unit: 10, throttling: soft, exceed_percent: 50}
    descriptors:
      - key: api
        value: send
        rate_limit: {unit: second, requests_per_unit: 4, throttling: elastic, elastic_percent: 100}
      - key: api
        value: old
        rate_limit: {unit: minute, requests_per_unit: 0}
      - key: api
        value: free
        rate_limit: {unlimited: true}
`

// TestInspect: Inspect reports each limit of a rule with its own
// remaining and reset, an elastic limit's excess and pool, a blocking and
// an unlimited limit, and which limit binds; looking counts nothing. On
// the memory store, one Redis and a Redis Cluster.
func TestInspect(t *testing.T) {
	t.Parallel()
	set := loadRules(t, inspectRules)
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			cfg := decide.DefaultConfig()
			cfg.Store = sc.open(t, clk)
			cfg.StoreTimeout = 5 * time.Second // a loaded CI machine; no fail mode here
			svc := newService(t, set, clk, cfg)
			for range 3 {
				decideOK(t, svc, req("api", []string{"user", "alice"}))
			}
			for range 6 { // 4 within bob's own limit, 2 past it from excess and pool
				decideOK(t, svc, req("api", []string{"user", "bob", "api", "send"}))
			}
			clk.Advance(10 * time.Second)

			r := req("api", []string{"user", "alice"}, []string{"user", "bob", "api", "send"},
				[]string{"user", "carol", "api", "old"}, []string{"nobody", "x"}, []string{"user", "carol", "api", "free"})
			for look := range 2 { // the first look must count nothing
				ins, err := svc.Inspect(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				if ins.UnknownDomain || len(ins.Descriptors) != 5 {
					t.Fatalf("look %d: %+v, want 5 descriptors", look, ins)
				}

				user := ins.Descriptors[0]
				if user.Rule == nil || user.Rule.Path != "api.user" || len(user.Limits) != 3 {
					t.Fatalf("look %d: user: %+v, want api.user's 3 limits", look, user)
				}
				for i, want := range []struct {
					remaining int64
					reset     time.Duration
				}{{2, 50 * time.Second}, {97, time.Hour - 10*time.Second}, {7, 50 * time.Second}} {
					ls := user.Limits[i]
					if d := ls.Decision; d.Remaining != want.remaining || d.ResetAfter != want.reset || ls.DeniesNext() {
						t.Errorf("look %d: user limit %d (%v): remaining %d, reset %v, denies next %v; want %d, %v, false",
							look, i, ls.Limit.Limit, d.Remaining, d.ResetAfter, ls.DeniesNext(), want.remaining, want.reset)
					}
				}
				if user.Binding != 0 {
					t.Errorf("look %d: user binds on limit %d, want 0 (the least remaining)", look, user.Binding)
				}

				send := ins.Descriptors[1]
				if len(send.Limits) != 1 || send.Binding != 0 {
					t.Fatalf("look %d: send: %+v, want one limit that binds", look, send)
				}
				// 10 s on: a new second, so every counter of bob's has
				// room again, the pool too.
				if ls := send.Limits[0]; ls.Decision.Remaining != 4 || ls.Excess.Remaining != 4 || ls.Pool.Remaining != 10 || ls.DeniesNext() {
					t.Errorf("look %d: send a second on: own %d, excess %d, pool %d; want 4, 4, 10", look,
						ls.Decision.Remaining, ls.Excess.Remaining, ls.Pool.Remaining)
				}

				old := ins.Descriptors[2]
				if len(old.Limits) != 1 || !old.Limits[0].Limit.Block || !old.Limits[0].DeniesNext() ||
					old.Limits[0].Decision.ResetAfter != time.Minute || old.Binding != 0 {
					t.Errorf("look %d: old: %+v, want the blocking limit to deny and bind", look, old)
				}
				if free := ins.Descriptors[4]; len(free.Limits) != 1 || !free.Limits[0].Limit.Unlimited || free.Limits[0].DeniesNext() || free.Binding != -1 {
					t.Errorf("look %d: free: %+v, want its unlimited limit, which binds nothing", look, free)
				}
				if nobody := ins.Descriptors[3]; nobody.Rule != nil || nobody.Binding != -1 || len(nobody.Limits) != 0 {
					t.Errorf("look %d: a descriptor without a rule: %+v", look, nobody)
				}
			}

			// Within bob's second: his own limit spent, 2 of his excess and
			// 6 of the pool's 10 taken.
			for range 6 {
				decideOK(t, svc, req("api", []string{"user", "bob", "api", "send"}))
			}
			ins, err := svc.Inspect(context.Background(), req("api", []string{"user", "bob", "api", "send"}))
			if err != nil {
				t.Fatal(err)
			}
			if ls := ins.Descriptors[0].Limits[0]; ls.Decision.Remaining != 0 || ls.Excess.Remaining != 2 || ls.Pool.Remaining != 4 || ls.DeniesNext() {
				t.Errorf("send within its second: own %d, excess %d, pool %d, denies next %v; want 0, 2, 4, false",
					ls.Decision.Remaining, ls.Excess.Remaining, ls.Pool.Remaining, ls.DeniesNext())
			}
			// The looks took nothing: alice has 2 left of 5 a minute.
			if n := passed(t, svc, req("api", []string{"user", "alice"}), 5); n != 2 {
				t.Errorf("alice passed %d after the looks, want 2", n)
			}
		})
	}
}

// passed decides r n times and returns how many passed.
func passed(t *testing.T, svc *decide.Service, r *decide.Request, n int) int {
	t.Helper()
	k := 0
	for range n {
		if decideOK(t, svc, r).Overall == decide.OK {
			k++
		}
	}
	return k
}

// TestInspectErrors: an invalid request is refused as Decide refuses it, an
// unknown domain has no rules, and a failing store fails the inspection
// (the fail mode does not answer for it).
func TestInspectErrors(t *testing.T) {
	t.Parallel()
	set := loadRules(t, inspectRules)
	clk := newClock()
	svc := newService(t, set, clk, decide.Config{})
	if _, err := svc.Inspect(context.Background(), &decide.Request{Domain: "api"}); !errors.Is(err, decide.ErrInvalidRequest) {
		t.Errorf("no descriptors: %v, want ErrInvalidRequest", err)
	}
	ins, err := svc.Inspect(context.Background(), req("other", []string{"user", "alice"}))
	if err != nil || !ins.UnknownDomain || ins.Descriptors[0].Rule != nil {
		t.Errorf("unknown domain: %+v, %v", ins, err)
	}
	down := errors.New("store down")
	cfg := decide.DefaultConfig()
	cfg.Store = &fakeStore{takeAll: func(context.Context, []sluice.Request, []sluice.Decision) error { return down }}
	cfg.Fail = decide.FailOpen
	failing := newService(t, set, clk, cfg)
	if _, err := failing.Inspect(context.Background(), req("api", []string{"user", "alice"})); !errors.Is(err, down) {
		t.Errorf("failing store: %v, want its error", err)
	}
}
