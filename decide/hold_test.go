package decide_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
)

// holdService returns a Service with the defaults (fail local) over g,
// counting servers servers (three: a share of 34 of weatherRules' 100 a
// minute), with a store timeout of timeout and a breaker that stays
// closed.
func holdService(t *testing.T, g *gateStore, timeout time.Duration, servers int64) *decide.Service {
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.Ping, cfg.WriteBack, cfg.Restore = g, g.ping, g.writeBack, g.restore
	cfg.StoreTimeout, cfg.StoreMaxTimeout = timeout, timeout
	cfg.BreakerFailures = 1000 // closed: the store answers, slowly
	cfg.Servers = func() int64 { return servers }
	return newService(t, loadRules(t, weatherRules), g.clk, cfg)
}

// burst sends n calls of user to s at once and returns a channel of their
// responses.
func burst(t *testing.T, s *decide.Service, user string, n int) <-chan *decide.Response {
	out := make(chan *decide.Response, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, err := s.Decide(context.Background(), req("api", []string{"user", user}))
			if err != nil {
				t.Error(err)
				return
			}
			out <- resp
		})
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out
}

// pauseBurst: one of three servers, whose store counted before of user's
// 100 a minute, resumes from a pause with a burst of n calls of user (the
// calls that queued meanwhile), whose store calls take longer than the
// store timeout to answer. It returns how many were admitted, how many
// decided by the store, and the hits the store counts in the end.
func pauseBurst(t *testing.T, user string, before, n int) (admitted, byStore int, counted int64) {
	clk := newClock()
	w := newWeatherStore(t, clk)
	g := &gateStore{weatherStore: w, gate: make(chan struct{}), key: userKey(t, user)}
	s := holdService(t, g, 20*time.Millisecond, 3)
	if got, _ := ask(t, s, user, before); got != before {
		t.Fatalf("%s: %d of %d admitted on a healthy store", user, got, before)
	}
	clk.Advance(2 * time.Second) // paused
	g.shut.Store(true)
	out := burst(t, s, user, n)
	count := func(resp *decide.Response) {
		if resp.Overall == decide.OK {
			admitted++
		}
		if resp.Mode == decide.ModeStore {
			byStore++
		}
	}
	for resp := range out { // the share's admissions, at the timeout
		if count(resp); admitted == 20 {
			break
		}
	}
	testenv.WaitFor(t, "every call at the store", func() bool { return g.arrived.Load() == int64(n) })
	close(g.gate)
	for resp := range out {
		count(resp)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	return admitted, byStore, w.counted(t, user)
}

// TestWeatherPauseDenialWaitsForStore: the burst after a pause is 40 calls
// of a client under its limit. The calls the server's share of 34 admits
// are decided locally at the timeout; those it would deny wait for the
// store's answers instead, which admit them (the weather suite's host
// stall denied such calls). The store counts each hit once.
func TestWeatherPauseDenialWaitsForStore(t *testing.T) {
	t.Parallel()
	const n = 40
	admitted, byStore, counted := pauseBurst(t, "burst", 0, n)
	if admitted != n || byStore < n-34 {
		t.Errorf("%d of %d admitted, %d by the store; want all, at least %d by the store", admitted, n, byStore, n-34)
	}
	if counted != n {
		t.Errorf("the store counts %d hits, want %d: each once", counted, n)
	}
}

// TestWeatherPauseDenialOverLimit: the same burst from a client the store
// counted at 80 of its 100: the calls beyond what is left wait for the
// store, which denies them. Waiting lets no client past its limit.
func TestWeatherPauseDenialOverLimit(t *testing.T) {
	t.Parallel()
	admitted, _, _ := pauseBurst(t, "over", 80, 40)
	if bound := 100 + 100/20 + 3; 80+admitted > bound {
		t.Errorf("%d admitted in all, want at most the bound of %d", 80+admitted, bound)
	}
}

// TestWeatherBusyDenialGoesToStore: a server's share of a client is taken
// by hits the store has not counted: one call in flight (decided locally
// at the timeout: the server stalled, say) and the hits decided locally
// after it, the key busy, written back. The store answers the server's
// other calls. The client's next call, which the share denies, waits for
// the call in flight to end and the key to settle (the other servers
// write back meanwhile), then goes to the store, which admits it: the
// client is under its limit.
func TestWeatherBusyDenialGoesToStore(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	g := &gateStore{weatherStore: w, gate: make(chan struct{}), key: userKey(t, "busy")}
	s := holdService(t, g, 20*time.Millisecond, 3)
	g.shut.Store(true)
	if got, modes := ask(t, s, "busy", 34); got != 34 || modes[decide.ModeLocal] != 34 {
		t.Fatalf("busy, its call slow: %d of 34 admitted in modes %v, want all, locally", got, modes)
	}
	if got, modes := ask(t, s, "other", 1); got != 1 || modes[decide.ModeStore] != 1 {
		t.Fatalf("other: %d of 1 admitted in modes %v, want it, by the store", got, modes)
	}
	next := burst(t, s, "busy", 1)
	testenv.WaitFor(t, "the next call waiting", func() bool { return decide.HoldingDenials(s) == 1 })
	close(g.gate)
	testenv.WaitFor(t, "the call in flight counted", func() bool { return w.counted(t, "busy") == 34 })
	clk.Advance(500 * time.Millisecond) // settleFor
	if resp := <-next; resp.Overall != decide.OK || resp.Mode != decide.ModeStore {
		t.Errorf("the call beyond the share: %v in mode %v, want admitted by the store", resp.Overall, resp.Mode)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := w.counted(t, "busy"); got != 35 {
		t.Errorf("the store counts %d hits, want 35: each once", got)
	}
}

// TestWeatherSettlingDenialWaits: a key of one of two servers settles (its
// calls were refused, then the store answered one), and the calls decided
// locally meanwhile use up its share, the client under its limit. A call
// the share denies waits for the settling to end, then the store, which
// has room, admits it; a caller that cannot wait that long gets the
// share's denial at once.
func TestWeatherSettlingDenialWaits(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	g := &gateStore{weatherStore: w, gate: make(chan struct{})}
	s := holdService(t, g, time.Second, 2)
	w.weather.Store(refused)
	if got, modes := ask(t, s, "settle", 30); got != 30 || modes[decide.ModeLocal] != 30 {
		t.Fatalf("settle, refused: %d of 30 admitted in modes %v, want all, locally", got, modes)
	}
	w.weather.Store(fine)
	if err := s.Probe(context.Background()); err != nil { // writes the 30 back
		t.Fatal(err)
	}
	if got, modes := ask(t, s, "settle", 1); got != 1 || modes[decide.ModeStore] != 1 {
		t.Fatalf("settle, the store back: %d of 1 admitted in modes %v, want it, by the store", got, modes)
	}
	// Settling from now: local, on the share of 50, until it is used up.
	short := func() *decide.Response {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		resp, err := s.Decide(ctx, req("api", []string{"user", "settle"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	admitted := 31
	var resp *decide.Response
	for range 60 {
		if resp = short(); resp.Overall != decide.OK {
			break
		}
		if resp.Mode != decide.ModeLocal {
			t.Fatalf("settle, settling: decided in mode %v, want local", resp.Mode)
		}
		admitted++
	}
	if resp.Overall == decide.OK || resp.Mode != decide.ModeLocal || admitted >= 100 {
		t.Fatalf("a caller that cannot wait, after %d admitted: %v in mode %v, want denied locally, under the limit",
			admitted, resp.Overall, resp.Mode)
	}
	next := burst(t, s, "settle", 1)
	testenv.WaitFor(t, "the call waiting for the key to settle", func() bool { return decide.HoldingDenials(s) == 1 })
	clk.Advance(500 * time.Millisecond) // settleFor
	if resp := <-next; resp.Overall != decide.OK || resp.Mode != decide.ModeStore {
		t.Errorf("a caller that waits: %v in mode %v, want admitted by the store", resp.Overall, resp.Mode)
	}
	if store, local := s.HeldDenials(); store != 1 || local != 1 {
		t.Errorf("HeldDenials() = %d, %d; want 1 to the store, 1 that stood (the caller that could not wait)", store, local)
	}
}
