package decide_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// elasticRules: each user has 4 a second and may reach 8 (elastic_percent
// 100) while the domain's pool of 10 a second has room.
const elasticRules = `
domain: api
capacity: {unit: second, requests_per_unit: 10}
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 4, throttling: elastic, elastic_percent: 100}
`

// TestElastic: with an idle pool a client reaches its ceiling; with a busy
// pool it is held to its own limit; past-limit requests pass only while
// the pool has room. On the memory store, one Redis and a Redis Cluster.
func TestElastic(t *testing.T) {
	t.Parallel()
	set := loadRules(t, elasticRules)
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			cfg := decide.DefaultConfig()
			cfg.Rules, cfg.Store, cfg.Now = func() *rules.Set { return set }, sc.open(t, clk), clk.Now
			cfg.StoreTimeout = 5 * time.Second // a loaded CI machine; no fail mode here
			svc, err := decide.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ask := func(user string, n int) (passed int, last *decide.Response) {
				t.Helper()
				for range n {
					resp, err := svc.Decide(context.Background(), &decide.Request{Domain: "api",
						Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: user}}, Cost: 1}}})
					if err != nil {
						t.Fatal(err)
					}
					if resp.Mode != decide.ModeStore {
						t.Fatalf("decided by %v, not the store", resp.Mode)
					}
					if resp.Overall == decide.OK {
						passed++
					}
					last = resp
				}
				return passed, last
			}

			// Idle pool: alice reaches her ceiling, 8, and no more.
			if n, last := ask("alice", 12); n != 8 || last.Statuses[0].Decision.RetryAfter <= 0 {
				t.Fatalf("idle pool: alice passed %d of 12, want 8 (her ceiling); last %+v", n, last.Statuses[0])
			}
			// The pool has 2 left (alice's 8): bob's own 4 pass whatever the
			// pool and take its last 2, so none of his past-limit ones does.
			if n, _ := ask("bob", 12); n != 4 {
				t.Fatalf("pool with 2 left: bob passed %d, want 4 (his own; the pool is then full)", n)
			}
			if n, _ := ask("alice", 1); n != 0 {
				t.Fatal("alice passed past her ceiling")
			}

			// Next second: a busy pool. Three users within their own
			// limits fill it (4+4+2 of 10; the rest pass uncounted).
			clk.Advance(time.Second)
			for _, u := range []string{"u1", "u2", "u3"} {
				if n, _ := ask(u, 4); n != 4 {
					t.Fatalf("%s within its own limit passed %d of 4", u, n)
				}
			}
			n, last := ask("carol", 12)
			if n != 4 {
				t.Fatalf("busy pool: carol passed %d of 12, want 4 (her own limit)", n)
			}
			if st := last.Statuses[0]; st.Code != decide.OverLimit || st.Limit == nil || st.Limit.Throttling != rules.Elastic || st.Decision.Limit != 4 {
				t.Fatalf("busy pool: carol's last %+v", st)
			}
		})
	}
}

// TestElasticSpare: a request past its client's limit passes only while
// the service has spare capacity (Request.Spare) as well as the pool; one
// refused for want of it takes nothing from the excess or the pool, and
// Spare is asked only past the limit.
func TestElasticSpare(t *testing.T) {
	t.Parallel()
	set := loadRules(t, elasticRules)
	clk := newClock()
	svc := newService(t, set, clk, decide.Config{})
	spare, asked := false, 0
	ask := func(user string, n int) (passed int) {
		t.Helper()
		for range n {
			r := req("api", []string{"user", user})
			r.Spare = func() bool { asked++; return spare }
			if decideOK(t, svc, r).Overall == decide.OK {
				passed++
			}
		}
		return passed
	}
	if n := ask("alice", 4); n != 4 || asked != 0 {
		t.Fatalf("within her limit: %d of 4 passed, Spare asked %d times; want 4, 0", n, asked)
	}
	if n := ask("alice", 3); n != 0 || asked != 3 {
		t.Fatalf("no spare capacity: %d past her limit passed, Spare asked %d times; want 0, 3", n, asked)
	}
	spare = true
	if n := ask("alice", 6); n != 4 {
		t.Fatalf("spare capacity again: %d of 6 passed, want 4 (her whole excess: the refused ones took none)", n)
	}
	ins, err := svc.Inspect(context.Background(), req("api", []string{"user", "alice"}))
	if err != nil {
		t.Fatal(err)
	}
	if p := ins.Descriptors[0].Limits[0].Pool; p.Remaining != 2 {
		t.Errorf("pool %d remaining, want 2 (alice's 8; the refused ones took none)", p.Remaining)
	}
}
