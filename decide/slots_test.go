package decide_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/slots"
)

// failingSlots is Slots whose store is down.
type failingSlots struct{}

func (failingSlots) Acquire(context.Context, string, int64, time.Duration) (slots.Grant, error) {
	return slots.Grant{}, errors.New("down")
}
func (failingSlots) Release(context.Context, string, uint64) error { return errors.New("down") }

const slotRules = `
domain: api
descriptors:
  - key: user
    concurrency: 2
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: route
    value: /export
    concurrency: 1
    shadow_mode: true
`

// TestConcurrencyLease: a decision API request (no Hold) holds its slot
// for Lease; one that holds (the proxy's, the middleware's) until Done.
// Slots are per value; a denial reports the concurrency, Retry after at
// least a second, and a request denied keeps no slot.
func TestConcurrencyLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newClock()
	set := loadRules(t, slotRules)
	cfg := decide.DefaultConfig()
	cfg.Rules, cfg.Store, cfg.Now, cfg.Lease = func() *rules.Set { return set }, newMemory(t, clk), clk.Now, 5*time.Second
	svc, err := decide.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := func(user string, hold bool) *decide.Request {
		return &decide.Request{Domain: "api", Hold: hold, Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: user}}, Cost: 1}}}
	}
	decideOK := func(r *decide.Request) *decide.Response {
		t.Helper()
		resp, err := svc.Decide(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	held := decideOK(req("alice", true))
	leased := decideOK(req("alice", false))
	if held.Overall != decide.OK || leased.Overall != decide.OK {
		t.Fatalf("two of two: %v %v", held.Overall, leased.Overall)
	}
	third := decideOK(req("alice", true))
	st := third.Statuses[0]
	if third.Overall != decide.OverLimit || !st.Concurrency || st.Limit != nil || st.Decision.Limit != 2 || st.Decision.RetryAfter < time.Second {
		t.Fatalf("the third: %v %+v, want over the concurrency of 2", third.Overall, st)
	}
	third.Done(ctx) // nothing held: nothing happens
	if r := decideOK(req("bob", false)); r.Overall != decide.OK {
		t.Fatal("another user refused")
	}
	held.Done(ctx)
	held.Done(ctx) // twice is once
	if r := decideOK(req("alice", false)); r.Overall != decide.OK {
		t.Fatal("the slot Done gave back is refused")
	}
	if r := decideOK(req("alice", false)); r.Overall != decide.OverLimit {
		t.Fatal("a third slot granted after Done")
	}
	clk.Advance(5 * time.Second) // the leases end
	for i := range 2 {
		if r := decideOK(req("alice", false)); r.Overall != decide.OK {
			t.Fatalf("slot %d after the leases: %v", i, r.Overall)
		}
	}
	// Shadow mode: over the concurrency is reported, not enforced.
	route := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "route", Value: "/export"}}, Cost: 1}}}
	decideOK(route)
	if r := decideOK(route); r.Overall != decide.OK || !r.Statuses[0].ShadowOverLimit {
		t.Fatalf("shadow: %v %+v", r.Overall, r.Statuses[0])
	}
}

// TestConcurrencyFail: slots that fail are decided by the fail mode.
func TestConcurrencyFail(t *testing.T) {
	t.Parallel()
	set := loadRules(t, slotRules)
	for _, tc := range []struct {
		name string
		fail decide.Fail
		want decide.Code
	}{
		{"open", decide.FailOpen, decide.OK},
		{"closed", decide.FailClosed, decide.OverLimit},
		{"local", decide.FailLocal, decide.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			cfg := decide.DefaultConfig()
			mem := newMemory(t, clk)
			cfg.Rules, cfg.Store, cfg.Local, cfg.Now, cfg.Fail = func() *rules.Set { return set }, mem, mem, clk.Now, tc.fail
			cfg.Slots = failingSlots{}
			svc, err := decide.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := &decide.Request{Domain: "api", Hold: true, Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: "u"}}, Cost: 1}}}
			var codes []decide.Code
			for range 3 {
				resp, err := svc.Decide(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				codes = append(codes, resp.Overall)
			}
			want := []decide.Code{tc.want, tc.want, tc.want}
			if tc.fail == decide.FailLocal { // the node's own slots: 2 of them
				want[2] = decide.OverLimit
			}
			for i := range codes {
				if codes[i] != want[i] {
					t.Fatalf("codes %v, want %v", codes, want)
				}
			}
		})
	}
}
