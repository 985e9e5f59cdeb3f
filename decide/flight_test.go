package decide_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
)

// gateStore is a weatherStore whose calls wait at a gate, while it is
// shut, before the store counts them (only those of key, when set);
// arrived counts those that came.
type gateStore struct {
	*weatherStore
	shut    atomic.Bool
	key     string
	gate    chan struct{}
	arrived atomic.Int64
}

func (g *gateStore) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if g.shut.Load() && (g.key == "" || reqs[0].Key == g.key) {
		g.arrived.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-g.gate:
		}
	}
	return g.weatherStore.TakeAll(ctx, reqs, ds)
}

// TestWeatherFlightsCountAgainstShare: one server's calls of a client are
// in flight (40 of them, the store slow to take them), and its other calls
// of the client, whose callers are gone, are decided locally. The
// store then admits the 40 in flight, which take it to its limit: the
// local decisions must not admit the same room again. A share that left
// the calls in flight out admitted 40 more locally, 140 of a limit of 100
// (the weather suite's host stall on one server: 323-431 of ≤ 316).
func TestWeatherFlightsCountAgainstShare(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	g := &gateStore{weatherStore: w, gate: make(chan struct{})}
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.Ping, cfg.WriteBack, cfg.Restore = g, w.ping, w.writeBack, w.restore
	cfg.StoreTimeout, cfg.StoreMaxTimeout = 10*time.Second, 10*time.Second // the calls in flight are answered in time
	cfg.Servers = func() int64 { return 1 }
	s := newService(t, loadRules(t, weatherRules), clk, cfg)

	admitted, _ := ask(t, s, "over", 60) // a count of 60 read
	g.shut.Store(true)
	const flying = 40
	var wg sync.WaitGroup
	var byStore atomic.Int64
	for range flying {
		wg.Go(func() {
			resp, err := s.Decide(context.Background(), req("api", []string{"user", "over"}))
			if err == nil && resp.Overall == decide.OK {
				byStore.Add(1)
			}
		})
	}
	testenv.WaitFor(t, "40 calls in flight", func() bool { return g.arrived.Load() == flying })
	local := 0
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for range 40 { // callers already gone: decided locally, without a call
		resp, err := s.Decide(gone, req("api", []string{"user", "over"}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Mode != decide.ModeLocal {
			t.Fatalf("a caller that gave up decided in mode %v, want local", resp.Mode)
		}
		if resp.Overall == decide.OK {
			local++
		}
	}
	close(g.gate)
	wg.Wait()
	admitted += local + int(byStore.Load())
	if byStore.Load() != flying || local != 0 {
		t.Errorf("%d of the %d calls in flight admitted by the store, %d admitted locally meanwhile; want %d and none",
			byStore.Load(), flying, local, flying)
	}
	if bound := 100 + 100/20; admitted > bound {
		t.Errorf("%d admitted in all, want at most the bound of %d", admitted, bound)
	}
}
