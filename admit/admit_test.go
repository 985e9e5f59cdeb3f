package admit_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/slots"
	"github.com/sluicehq/sluice/store/memory"
)

// t0 is the fixed start of every test's clock.
var t0 = time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)

func newClock() *clocktest.Clock { return clocktest.New(t0) }

// loadRules parses yaml as a rules file.
func loadRules(t testing.TB, yaml string) *rules.Set {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("load rules: %v", err)
	}
	return set
}

// newMemory returns a memory store on clk.
func newMemory(t testing.TB, clk *clocktest.Clock) *memory.Store {
	t.Helper()
	cfg := memory.DefaultConfig()
	cfg.Now = clk.Now
	s, err := memory.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newService returns the decision service over set, a memory store on clk
// (unless dc has a Store) and dc's other fields, with the Step of ac on
// clk as its Admit, as the server composes them.
func newService(t testing.TB, set *rules.Set, clk *clocktest.Clock, dc decide.Config, ac admit.Config) *decide.Service {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	ac.Now, ac.Logger, ac.Fail = clk.Now, quiet, dc.Fail
	step, err := admit.New(ac)
	if err != nil {
		t.Fatal(err)
	}
	dc.Rules, dc.Now, dc.Logger, dc.Admit = func() *rules.Set { return set }, clk.Now, quiet, step
	if dc.Store == nil {
		dc.Store = newMemory(t, clk)
	}
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// failingSlots is a slots.Counter whose store is down.
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
	ac := admit.DefaultConfig()
	ac.Lease = 5 * time.Second
	svc := newService(t, set, clk, decide.DefaultConfig(), ac)
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
			cfg.Store, cfg.Fail = mem, tc.fail
			ac := admit.DefaultConfig()
			ac.Slots = failingSlots{}
			svc := newService(t, set, clk, cfg, ac)
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

// TestRequestLimitKeepsConcurrency checks that a descriptor's own limit
// replaces the rules' rate limit only: the rule's concurrency still caps
// the requests in flight.
func TestRequestLimitKeepsConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newClock()
	s := newService(t, loadRules(t, slotRules), clk, decide.DefaultConfig(), admit.DefaultConfig())
	own := &rules.RequestLimit{RequestsPerUnit: 1000, Unit: "hour"}
	r := &decide.Request{Domain: "api", Hold: true, Descriptors: []decide.Descriptor{{Cost: 1, Limit: own,
		Entries: []decide.Entry{{Key: "user", Value: "alice"}}}}}
	for i, want := range []decide.Code{decide.OK, decide.OK, decide.OverLimit} {
		resp, err := s.Decide(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if resp.Overall != want || (want == decide.OK && st.Limit.Limit.Rate != 1000) || (want == decide.OverLimit && !st.Concurrency) {
			t.Fatalf("call %d: %v %+v, want %v (the own limit of 1000, then the concurrency of 2)", i, resp.Overall, st, want)
		}
	}
}

// recordingSlots is the real slots.Memory that records the keys asked for.
type recordingSlots struct {
	m    *slots.Memory
	mu   sync.Mutex
	keys []string
}

func (r *recordingSlots) Acquire(ctx context.Context, key string, limit int64, lease time.Duration) (slots.Grant, error) {
	r.mu.Lock()
	r.keys = append(r.keys, key)
	r.mu.Unlock()
	return r.m.Acquire(ctx, key, limit, lease)
}
func (r *recordingSlots) Release(ctx context.Context, key string, token uint64) error {
	return r.m.Release(ctx, key, token)
}

// TestSlotKeys pins the layout of slot keys, which servers of two
// versions share in Redis: the rule's ConcurrencyID, then the values as in
// store keys, a long value (or one that looks like a digest) as its
// digest. The expected keys are those decide wrote when it took the slots
// itself.
func TestSlotKeys(t *testing.T) {
	t.Parallel()
	set := loadRules(t, slotRules)
	m, err := slots.NewMemory(slots.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingSlots{m: m}
	ac := admit.DefaultConfig()
	ac.Slots = rec
	svc := newService(t, set, newClock(), decide.DefaultConfig(), ac)
	for _, v := range []string{"alice", strings.Repeat("x", 300), "sha256:abc"} {
		r := &decide.Request{Domain: "api", Descriptors: []decide.Descriptor{{Entries: []decide.Entry{{Key: "user", Value: v}}, Cost: 1}}}
		if resp, err := svc.Decide(context.Background(), r); err != nil || resp.Overall != decide.OK {
			t.Fatalf("%.10s: %v %v", v, resp, err)
		}
	}
	id := "adebe55f8a0baff7" // the user rule's ConcurrencyID
	want := []string{id + "|5:alice", id + "|29:sha256:DU4sqenLztenpTgOsp4aNw", id + "|29:sha256:Z-m8PP0hY8KXg1jf4A0vkQ"}
	if strings.Join(rec.keys, " ") != strings.Join(want, " ") {
		t.Fatalf("slot keys %q, want %q", rec.keys, want)
	}
}
