package decide_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// ctxKey marks the context a Starter returns.
type ctxKey struct{}

// watcher is an Observer that notes what it is told in calls; starter is
// one that is a Starter too.
type watcher struct {
	name  string
	calls *[]string
}

func (o watcher) Observe(ctx context.Context, r *decide.Request, resp *decide.Response, err error) {
	mark, _ := ctx.Value(ctxKey{}).(string)
	switch {
	case err != nil:
		*o.calls = append(*o.calls, o.name+" error "+mark)
	default:
		*o.calls = append(*o.calls, o.name+" "+resp.Overall.String()+" "+mark)
	}
}

type starter struct{ watcher }

func (o starter) Start(ctx context.Context, r *decide.Request) context.Context {
	*o.calls = append(*o.calls, o.name+" start "+r.Domain)
	return context.WithValue(ctx, ctxKey{}, "started")
}

// TestObservers checks that Decide tells its observers of each decision,
// in order, after Starters began it, with the context they returned (which
// the store sees too), and of invalid requests with their error.
func TestObservers(t *testing.T) {
	t.Parallel()
	clk := newClock()
	mem := newMemory(t, clk)
	var calls []string
	var storeMark string
	store := &fakeStore{takeAll: func(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
		storeMark, _ = ctx.Value(ctxKey{}).(string)
		return mem.TakeAll(ctx, reqs, ds)
	}}
	cfg := decide.Config{Store: store, Observers: []decide.Observer{
		watcher{name: "metrics", calls: &calls},
		starter{watcher{name: "tracing", calls: &calls}},
	}}
	s := newService(t, loadRules(t, oneLimit), clk, cfg)
	decideOK(t, s, req("api", []string{"user", "alice"}))
	decideOK(t, s, req("api", []string{"user", "alice"}))
	if _, err := s.Decide(context.Background(), &decide.Request{Domain: "api"}); !errors.Is(err, decide.ErrInvalidRequest) {
		t.Fatalf("a request without descriptors: %v, want ErrInvalidRequest", err)
	}
	want := []string{
		"tracing start api", "metrics OK started", "tracing OK started",
		"tracing start api", "metrics OVER_LIMIT started", "tracing OVER_LIMIT started",
		"tracing start api", "metrics error started", "tracing error started",
	}
	if len(calls) != len(want) {
		t.Fatalf("observers heard %q, want %q", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("call %d: %q, want %q", i, calls[i], want[i])
		}
	}
	if storeMark != "started" {
		t.Errorf("the store saw the context %q, want the Starter's", storeMark)
	}
}

// TestShadowAll checks Config.Shadow: every limit in shadow mode, as
// Envoy's SHADOW_MODE. A request over its limit is OK, its status a
// shadow over-limit, and observers see it so.
func TestShadowAll(t *testing.T) {
	t.Parallel()
	clk := newClock()
	var calls []string
	cfg := decide.Config{Shadow: true, Observers: []decide.Observer{watcher{name: "metrics", calls: &calls}}}
	s := newService(t, loadRules(t, oneLimit), clk, cfg)
	for i := range 2 {
		resp := decideOK(t, s, req("api", []string{"user", "alice"}))
		st := resp.Statuses[0]
		if resp.Overall != decide.OK || st.Code != decide.OK || st.ShadowOverLimit != (i == 1) || st.Shadow != (i == 1) {
			t.Errorf("request %d: %v, status %+v; want OK, a shadow over-limit the second time", i, resp.Overall, st)
		}
	}
	if len(calls) != 2 || calls[1] != "metrics OK " {
		t.Errorf("observers heard %q, want two OKs", calls)
	}
}
