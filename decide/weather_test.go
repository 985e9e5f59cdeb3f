package decide_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// weatherRules: 100 a minute per user.
const weatherRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// The weathers of a weatherStore.
const (
	fine    = iota
	refused // every call refused at once
	stalled // every call waits for release (or its context)
)

// weatherStore is a real memory store with faults put in by hand: calls
// refused, or stalled until released, then counted (or failed with
// stallErr). Its write-back (decide.Config.WriteBack) adds hits to the
// memory store, whether or not they fit, and tallies them.
type weatherStore struct {
	clk      *clock
	t        *testing.T
	memMu    sync.Mutex
	mem      sluice.Store // replaced by restart
	weather  atomic.Int32
	release  chan struct{} // closed: stalled calls go on
	stallErr error
	calls    atomic.Int64

	mu       sync.Mutex
	written  map[string]int64             // hits written back, by key
	envoy    map[string]sluice.Descriptor // the Envoy descriptor of the hits written back, by key
	writes   int
	restores chan []sluice.Request // the counts put back
}

func newWeatherStore(t *testing.T, clk *clock) *weatherStore {
	return &weatherStore{clk: clk, t: t, mem: newMemory(t, clk), release: make(chan struct{}), written: map[string]int64{},
		envoy:    map[string]sluice.Descriptor{},
		restores: make(chan []sluice.Request, 16)}
}

// store returns the memory store in use.
func (w *weatherStore) store() sluice.Store {
	w.memMu.Lock()
	defer w.memMu.Unlock()
	return w.mem
}

// restart replaces the memory store with an empty one, as a Redis without
// persistence restarts.
func (w *weatherStore) restart() {
	m := newMemory(w.t, w.clk)
	w.memMu.Lock()
	w.mem = m
	w.memMu.Unlock()
}

// restore puts counts back (decide.Config.Restore), merged by maximum: the
// hits a key lacks are taken.
func (w *weatherStore) restore(ctx context.Context, reqs []sluice.Request, _ []int64) error {
	for _, r := range reqs {
		d, err := sluice.Take(ctx, w.store(), r.Key, r.Limit, 0)
		if err != nil {
			return err
		}
		for range r.Cost - (d.Limit - d.Remaining) {
			if _, err := sluice.Take(ctx, w.store(), r.Key, r.Limit, 1); err != nil {
				return err
			}
		}
	}
	w.restores <- reqs
	return nil
}

func (w *weatherStore) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	w.calls.Add(1)
	switch w.weather.Load() {
	case refused:
		return errRefused
	case stalled:
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.release:
		}
		if w.stallErr != nil {
			return w.stallErr
		}
	}
	return w.store().TakeAll(ctx, reqs, ds)
}

// ping is the store's Ping: it answers unless refused or stalled.
func (w *weatherStore) ping(context.Context) error {
	if w.weather.Load() != fine {
		return errRefused
	}
	return nil
}

func (w *weatherStore) writeBack(ctx context.Context, reqs []sluice.Request, _ []int64) error {
	if w.weather.Load() != fine {
		return errRefused
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	for _, r := range reqs {
		w.written[r.Key] += r.Cost
		w.envoy[r.Key] = r.Envoy
		// Debited whatever is left, one hit at a time: what fits counts.
		for range r.Cost {
			if _, err := sluice.Take(ctx, w.store(), r.Key, r.Limit, 1); err != nil {
				return err
			}
		}
	}
	return nil
}

// counted returns the hits the memory store holds on user's key under
// 100 a minute.
func (w *weatherStore) counted(t *testing.T, user string) int64 {
	t.Helper()
	d, err := sluice.Take(context.Background(), w.store(), userKey(t, user), sluice.Limit{Rate: 100, Period: time.Minute}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Limit - d.Remaining
}

// userKey returns the store key of user under weatherRules, as decide
// names it.
func userKey(t *testing.T, user string) string {
	t.Helper()
	rec := &recorder{Store: newMemory(t, newClock())}
	s := newService(t, loadRules(t, weatherRules), newClock(), decide.Config{Store: rec})
	decideOK(t, s, req("api", []string{"user", user}))
	return rec.requests()[0].Key
}

// weatherService returns a Service with the defaults (fail local) over w,
// counting n servers.
func weatherService(t *testing.T, w *weatherStore, clk *clock, n int64) *decide.Service {
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.Ping, cfg.WriteBack, cfg.Restore = w, w.ping, w.writeBack, w.restore
	// Long enough for a healthy call on a loaded machine running -race;
	// a stalled call is left after it.
	cfg.StoreTimeout, cfg.StoreMaxTimeout = 200*time.Millisecond, 200*time.Millisecond
	cfg.BreakerFailures, cfg.BreakerCoolDown = 3, time.Second
	cfg.Servers = func() int64 { return n }
	return newService(t, loadRules(t, weatherRules), clk, cfg)
}

// ask decides n requests of user on s and returns how many were admitted,
// and the modes they were decided in.
func ask(t *testing.T, s *decide.Service, user string, n int) (admitted int, modes map[decide.Mode]int) {
	t.Helper()
	modes = map[decide.Mode]int{}
	for range n {
		resp := decideOK(t, s, req("api", []string{"user", user}))
		modes[resp.Mode]++
		if resp.Overall == decide.OK {
			admitted++
		}
	}
	return admitted, modes
}

// TestWeatherRefused: a store that refuses every call, then answers again.
// A client under its limit is never denied; one over it gets what the
// store had left, no more; when the store answers, the first Probe (the
// server's, four a second) writes back the hits admitted without it, once,
// and decisions go back to it half a second later (while the other servers
// write theirs).
func TestWeatherRefused(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	s := weatherService(t, w, clk, 1)

	ask(t, s, "under", 10)
	if got, _ := ask(t, s, "over", 60); got != 60 {
		t.Fatalf("over: %d of 60 admitted on a healthy store", got)
	}
	w.weather.Store(refused)
	if got, modes := ask(t, s, "under", 20); got != 20 || modes[decide.ModeLocal] != 20 {
		t.Errorf("under, refused: %d of 20 admitted in modes %v, want all, locally", got, modes)
	}
	if got, _ := ask(t, s, "over", 100); got != 40 {
		t.Errorf("over, refused: %d of 100 admitted, want 40: what the store had left", got)
	}
	if s.Mode() != decide.ModeLocal {
		t.Errorf("Mode() = %v while refused, want local", s.Mode())
	}
	if err := s.Probe(context.Background()); err == nil {
		t.Error("Probe succeeded on a store that refuses")
	}

	w.weather.Store(fine)
	clk.Advance(250 * time.Millisecond) // the server's next Probe
	if err := s.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Decisions stay local half a second, while the other servers write
	// their hits back too.
	if s.Mode() != decide.ModeLocal {
		t.Errorf("Mode() = %v at the first Probe on a store that answers again, want local", s.Mode())
	}
	for range 2 {
		clk.Advance(250 * time.Millisecond)
		if err := s.Probe(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if s.Mode() != decide.ModeStore {
		t.Errorf("Mode() = %v 500ms after the store answered again, want store", s.Mode())
	}
	w.mu.Lock()
	writes, under, over := w.writes, w.written[userKey(t, "under")], w.written[userKey(t, "over")]
	w.mu.Unlock()
	if writes != 1 || under != 20 || over != 40 {
		t.Errorf("written back in %d writes: under %d, over %d; want 20 and 40 in one", writes, under, over)
	}
	if got, modes := ask(t, s, "over", 10); got != 0 || modes[decide.ModeStore] != 10 {
		t.Errorf("over, back: %d of 10 admitted in modes %v, want none, by the store", got, modes)
	}
	if got, modes := ask(t, s, "under", 10); got != 10 || modes[decide.ModeStore] != 10 {
		t.Errorf("under, back: %d of 10 admitted in modes %v, want all, by the store", got, modes)
	}
	if err := s.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w.writes != 1 {
		t.Errorf("%d writes back, want 1: nothing is written twice", w.writes)
	}
	if n := w.counted(t, "under"); n != 40 {
		t.Errorf("the store counts %d hits of under, want 40: each once", n)
	}
}

// TestWeatherStall: the store stalls; calls over the timeout are decided
// locally and go on. When the stall ends and they are counted, nothing is
// written back; when they fail instead, their hits are written back once.
func TestWeatherStall(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		err     error
		written int64
	}{
		// The call that went on is counted by the store; the 4 decided
		// after it without a call are written back.
		{name: "counted late", written: 4},
		{name: "failed late", err: errors.New("connection reset"), written: 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			w := newWeatherStore(t, clk)
			w.stallErr = tt.err
			s := weatherService(t, w, clk, 1)
			ask(t, s, "u", 10)
			w.weather.Store(stalled)
			if got, modes := ask(t, s, "u", 5); got != 5 || modes[decide.ModeLocal] != 5 {
				t.Errorf("stalled: %d of 5 admitted in modes %v, want all, locally", got, modes)
			}
			// The first call goes on to the store; the key, with a hit in
			// flight, is decided locally until the store has it.
			if n := w.calls.Load(); n != 11 {
				t.Errorf("%d store calls, want 11", n)
			}
			w.weather.Store(fine)
			close(w.release)
			if err := s.Close(context.Background()); err != nil { // waits for the call, writes back
				t.Fatal(err)
			}
			w.mu.Lock()
			written := w.written[userKey(t, "u")]
			w.mu.Unlock()
			if counted := w.counted(t, "u"); counted != 15 || written != tt.written {
				t.Errorf("the store counts %d hits (%d written back), want 15 (%d written back)", counted, written, tt.written)
			}
		})
	}
}

// TestWeatherServers: three servers on a store that fails, each counting
// three. A client at a tenth of its limit, spread over them, is never
// denied; a client at many times its limit gets at most the limit and a hit
// a server for the rounding of the shares.
func TestWeatherServers(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	const servers = 3
	var svcs [servers]*decide.Service
	for i := range svcs {
		svcs[i] = weatherService(t, w, clk, servers)
	}
	for i := range 30 { // the over client's count is known
		decideOK(t, svcs[i%servers], req("api", []string{"user", "over"}))
	}
	w.weather.Store(refused)
	under, over := 0, 30
	for i := range 600 {
		if i%60 == 0 {
			n, _ := ask(t, svcs[(i/60)%servers], "under", 1)
			under += n
		}
		n, _ := ask(t, svcs[i%servers], "over", 1)
		over += n
	}
	if under != 10 {
		t.Errorf("under: %d of 10 admitted, want all", under)
	}
	if bound := 100 + servers; over > bound || over < 100-servers {
		t.Errorf("over: %d admitted, want about the limit of 100, at most %d", over, bound)
	}
}

// TestWeatherMovedClient: the bound of docs/stores.md for a client whose
// calls move while the store fails. Its 100 hits of a limit of 100 all
// reached one server of three, which read its count; the other two never
// did, and start their shares from nothing: each admits up to its share
// (⌈100/3⌉ = 34) once the client's calls reach it, the limit's 100 plus
// two shares in all, no more.
func TestWeatherMovedClient(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	const servers, share = 3, 34
	var svcs [servers]*decide.Service
	for i := range svcs {
		svcs[i] = weatherService(t, w, clk, servers)
	}
	admitted, _ := ask(t, svcs[0], "moved", 100)
	w.weather.Store(refused)
	for i := range 600 {
		n, _ := ask(t, svcs[i%servers], "moved", 1)
		admitted += n
	}
	if bound := 100 + (servers-1)*share; admitted > bound || admitted < 100 {
		t.Errorf("admitted %d of a limit of 100, want at least the limit and at most %d (two shares more)", admitted, bound)
	}
	t.Logf("admitted %d of a limit of 100 (two servers that never read its count: up to a share more each)", admitted)
}

// TestWeatherRestartEmpty: the store restarts empty. The first decision
// after shows the ledger the store forgot the count of a key it holds; the
// count goes back (merged by maximum), and the key gets only what was left.
func TestWeatherRestartEmpty(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	s := weatherService(t, w, clk, 1)
	ask(t, s, "over", 60)
	w.restart()
	if got, _ := ask(t, s, "over", 1); got != 1 {
		t.Fatal("the first request on the empty store denied")
	}
	if put := <-w.restores; len(put) != 1 || put[0].Cost != 61 { // 60 lost and 1 new
		t.Fatalf("put back %+v, want the 61 hits of over", put)
	}
	if got, _ := ask(t, s, "over", 100); got != 39 {
		t.Errorf("over, once its count is back: %d of 100 admitted, want 39", got)
	}
	// A count at the limit, as the store reports it once over, is no loss.
	if err := s.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(w.restores); n != 0 {
		t.Errorf("%d more counts put back, want none: the store lost nothing more", n)
	}
}

// TestWeatherRestartEmptyAtLimit: the store restarts empty while a key is
// at its limit. The first answer after, an admission on the count the
// store forgot, is a denial: the key was over its limit.
func TestWeatherRestartEmptyAtLimit(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	s := weatherService(t, w, clk, 1)
	if got, _ := ask(t, s, "over", 100); got != 100 {
		t.Fatalf("over: %d of 100 admitted on a healthy store", got)
	}
	w.restart()
	if got, _ := ask(t, s, "over", 5); got != 0 {
		t.Errorf("over, at its limit, after the store restarted empty: %d of 5 admitted, want none", got)
	}
	if err := s.Close(context.Background()); err != nil { // waits for the restore
		t.Fatal(err)
	}
	if n := w.counted(t, "over"); n < 100 {
		t.Errorf("the store counts %d hits of over, want its 100 put back", n)
	}
}

// TestWeatherRefusedThenEmpty: the store refuses calls, then answers again
// empty (it restarted without persistence while down). The Probe that
// finds it back puts back the counts the server knew before decisions go
// back to it (merged by maximum: a store that kept them is left as it
// is), then writes back the hits admitted meanwhile: the store's first
// decision is on the whole count, not on what was written back.
func TestWeatherRefusedThenEmpty(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	s := weatherService(t, w, clk, 1)
	if got, _ := ask(t, s, "over", 60); got != 60 {
		t.Fatalf("over: %d of 60 admitted on a healthy store", got)
	}
	w.weather.Store(refused)
	if got, _ := ask(t, s, "over", 10); got != 10 {
		t.Errorf("over, refused: %d of 10 admitted, want all", got)
	}
	w.restart()
	w.weather.Store(fine)
	for range 3 { // the server's Probes until decisions go back to the store
		clk.Advance(250 * time.Millisecond)
		if err := s.Probe(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if s.Mode() != decide.ModeStore {
		t.Fatalf("Mode() = %v after the store answered again, want store", s.Mode())
	}
	if n := w.counted(t, "over"); n != 70 {
		t.Errorf("back to the store, it counts %d hits of over, want 70: the 60 it forgot put back and the 10 admitted without it", n)
	}
	if got, _ := ask(t, s, "over", 50); got != 30 {
		t.Errorf("over, back: %d of 50 admitted, want 30", got)
	}
}

// TestWeatherRefusedBrieflyThenEmpty: a store refused fewer calls than
// open the breaker, then came back empty (a restart without persistence,
// quick enough that the breaker never opened): the Probe that writes
// back the hits admitted without it puts back first the count it forgot,
// as after an open breaker. Before, only an open breaker's Probe did, and
// the count stayed lost until the key's next answer revealed it (1 of 4
// runs of server's TestServeEnvoyKeysWeather).
func TestWeatherRefusedBrieflyThenEmpty(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	s := weatherService(t, w, clk, 1)
	if got, _ := ask(t, s, "over", 60); got != 60 {
		t.Fatalf("over: %d of 60 admitted on a healthy store", got)
	}
	w.weather.Store(refused)
	if got, _ := ask(t, s, "over", 1); got != 1 { // fewer than BreakerFailures
		t.Errorf("over, refused: %d of 1 admitted, want it", got)
	}
	w.restart()
	w.weather.Store(fine)
	clk.Advance(250 * time.Millisecond)
	if err := s.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := w.counted(t, "over"); n != 61 {
		t.Errorf("after a Probe, the store counts %d hits of over, want 61: the 60 it forgot put back and the 1 admitted without it", n)
	}
	if got, _ := ask(t, s, "over", 50); got != 39 {
		t.Errorf("over, back: %d of 50 admitted, want 39", got)
	}
}

// hookStore is a weatherStore that runs a hook, once, after the store has
// decided a call and before its answer comes back: what happens meanwhile
// on the other servers, or on this one.
type hookStore struct {
	*weatherStore
	hook atomic.Pointer[func()]
}

func (h *hookStore) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	err := h.weatherStore.TakeAll(ctx, reqs, ds)
	if f := h.hook.Swap(nil); f != nil {
		(*f)()
	}
	return err
}

// TestWeatherLateAnswer: a store answer that comes late is no sign the
// store lost a count, and nothing is put back (each put back would count
// hits twice: a client under its limit denied, the host stall of the
// weather suite). The store lost nothing; it counts every hit once.
func TestWeatherLateAnswer(t *testing.T) {
	t.Parallel()
	lim := sluice.Limit{Rate: 100, Period: time.Minute}
	for _, tt := range []struct {
		name string
		// meanwhile runs between the store's count of a call and its
		// answer reaching the ledger.
		meanwhile func(t *testing.T, clk *clock, w *weatherStore, s *decide.Service)
		want      int64 // the store's count of u at the end
	}{
		{
			// The server stopped (SIGSTOP) while the answer waited in its
			// socket: it reads it a window later, then the new window's
			// count, lower.
			name: "read a window later",
			meanwhile: func(t *testing.T, clk *clock, _ *weatherStore, _ *decide.Service) {
				clk.Advance(time.Minute)
			},
			want: 5, // this window's
		},
		{
			// Two calls overlap: the store counts the first, then the
			// other servers' 30 hits and the second, whose answer, higher,
			// comes first.
			name: "older answer after a newer",
			meanwhile: func(t *testing.T, _ *clock, w *weatherStore, s *decide.Service) {
				if _, err := sluice.Take(context.Background(), w.store(), userKey(t, "u"), lim, 30); err != nil {
					t.Error(err)
				}
				if got, _ := ask(t, s, "u", 1); got != 1 {
					t.Error("the overlapping call denied")
				}
			},
			want: 30 + 1 + 30 + 1 + 5,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			h := &hookStore{weatherStore: newWeatherStore(t, clk)}
			w := h.weatherStore
			cfg := decide.DefaultConfig()
			cfg.Store, cfg.Ping, cfg.WriteBack, cfg.Restore = h, w.ping, w.writeBack, w.restore
			cfg.StoreTimeout, cfg.StoreMaxTimeout = 200*time.Millisecond, 200*time.Millisecond
			cfg.Servers = func() int64 { return 1 }
			s := newService(t, loadRules(t, weatherRules), clk, cfg)

			ask(t, s, "u", 30) // a count the ledger holds
			f := func() { tt.meanwhile(t, clk, w, s) }
			h.hook.Store(&f)
			if got, _ := ask(t, s, "u", 1); got != 1 {
				t.Fatal("the late-read call denied")
			}
			if got, _ := ask(t, s, "u", 5); got != 5 {
				t.Errorf("%d of 5 admitted, want all", got)
			}
			if err := s.Close(context.Background()); err != nil { // waits for the restores, if any
				t.Fatal(err)
			}
			if n := len(w.restores); n != 0 {
				t.Errorf("%d counts put back (%v), want none: the store lost nothing", n, <-w.restores)
			}
			if got := w.counted(t, "u"); got != tt.want {
				t.Errorf("the store counts %d hits of u, want %d: each once", got, tt.want)
			}
		})
	}
}

// TestWeatherCloseStoreDown: Close on a store that is down, with hits
// admitted locally that it could not count, is no error (a server's
// SIGTERM exited 1 with "redis store not connected yet"): it says at WARN
// how many hits it could not write back.
func TestWeatherCloseStoreDown(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	var logs syncBuilder
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.Ping, cfg.WriteBack, cfg.Restore = w, w.ping, w.writeBack, w.restore
	cfg.StoreTimeout, cfg.StoreMaxTimeout = 200*time.Millisecond, 200*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg.Rules = func() *rules.Set { return loadRules(t, weatherRules) }
	cfg.Now = clk.Now
	s, err := decide.New(cfg) // newService's logger discards
	if err != nil {
		t.Fatal(err)
	}
	w.weather.Store(refused)
	if got, modes := ask(t, s, "u", 7); got != 7 || modes[decide.ModeLocal] != 7 {
		t.Fatalf("%d of 7 admitted in modes %v, want all, locally", got, modes)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v on a store that is down, want nil", err)
	}
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "could not be written back") ||
		!strings.Contains(out, "hits=7 keys=1") {
		t.Errorf("log %q, want a WARN of the 7 hits of 1 key not written back", out)
	}
}

// stallOnce is a weatherStore whose next call, once armed, waits until
// release is closed (or its context ends) before the store counts it: a
// call in flight when a server is stopped.
type stallOnce struct {
	*weatherStore
	armed   atomic.Bool
	release chan struct{}
}

func (s *stallOnce) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if s.armed.CompareAndSwap(true, false) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.release:
		}
	}
	return s.weatherStore.TakeAll(ctx, reqs, ds)
}

// TestWeatherHostStall: one of three servers is stopped 3 s (the weather
// suite's host stall, SIGSTOP) with a hit admitted locally in flight,
// while the other two take a client from the 30 hits that server read to
// its limit of 100 on the store. When it resumes, the count it read is
// stale: its decisions wait for the store, which denies, instead of going
// local for the call in flight and admitting the client its share again
// (before: 20 of 20 more admitted, 121 in all, over the bound of 108).
func TestWeatherHostStall(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		maxLate int
	}{
		{"a late call free", 0},
		// Every late call in flight (the stalled one): as on a server
		// that resumes with more calls queued than MaxLateCalls, the
		// decision calls the store itself (before: 20 of 20 admitted
		// locally).
		{"no late call free", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			hostStall(t, tt.maxLate)
		})
	}
}

// hostStall is TestWeatherHostStall with MaxLateCalls maxLate (0: the
// default).
func hostStall(t *testing.T, maxLate int) {
	clk := newClock()
	w := newWeatherStore(t, clk)
	stopped := &stallOnce{weatherStore: w, release: make(chan struct{})}
	const servers = 3
	service := func(st sluice.Store) *decide.Service {
		cfg := decide.DefaultConfig()
		cfg.Store, cfg.Ping, cfg.WriteBack, cfg.Restore = st, w.ping, w.writeBack, w.restore
		cfg.StoreTimeout, cfg.StoreMaxTimeout = 200*time.Millisecond, 200*time.Millisecond
		cfg.Servers = func() int64 { return servers }
		if st == stopped && maxLate > 0 {
			cfg.MaxLateCalls = maxLate
		}
		return newService(t, loadRules(t, weatherRules), clk, cfg)
	}
	a, b, c := service(stopped), service(w), service(w)

	admitted, _ := ask(t, a, "over", 30) // a reads a count of 30
	stopped.armed.Store(true)
	got, modes := ask(t, a, "over", 1) // its call goes on past the store timeout
	if got != 1 || modes[decide.ModeLocal] != 1 {
		t.Fatalf("the call that stalls: %d of 1 admitted in modes %v, want 1, locally", got, modes)
	}
	admitted += got

	clk.Advance(3 * time.Second) // a is stopped; b and c decide on the store
	for i := range 100 {
		got, _ := ask(t, []*decide.Service{b, c}[i%2], "over", 1)
		admitted += got
	}
	if admitted != 101 {
		t.Fatalf("%d admitted before a resumes, want 101: the store's 100 and a's 1 in flight", admitted)
	}

	got, modes = ask(t, a, "over", 20) // a resumes, its call still in flight
	if got != 0 || modes[decide.ModeStore] == 0 {
		t.Errorf("after the stop: %d of 20 admitted in modes %v, want none, the first by the store", got, modes)
	}
	admitted += got
	close(stopped.release)
	if err := a.Close(context.Background()); err != nil { // waits for the call, writes its hit back
		t.Fatal(err)
	}
	if bound := 100 + 100/20 + servers; admitted > bound {
		t.Errorf("%d admitted in all, want at most the bound of %d", admitted, bound)
	}
	if n := w.counted(t, "over"); n != 100 {
		t.Errorf("the store counts %d hits, want its limit of 100", n)
	}
}

// TestWeatherWriteBackEnvoy: the hits of a limit Envoy's ratelimit could
// count under its key are written back with the descriptor it counts them
// by (sluice.Request.Envoy), so that a store that counts them there
// (store/envoykeys) writes them where Envoy's servers read them; the
// ledger used to drop it.
func TestWeatherWriteBackEnvoy(t *testing.T) {
	t.Parallel()
	clk := newClock()
	w := newWeatherStore(t, clk)
	s := weatherService(t, w, clk, 1)
	w.weather.Store(refused)
	if got, _ := ask(t, s, "u", 3); got != 3 {
		t.Fatalf("%d of 3 admitted locally, want 3", got)
	}
	w.weather.Store(fine)
	clk.Advance(250 * time.Millisecond)
	if err := s.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A write-back begun by a local decision (Service.kick) may still be
	// in flight: Close waits for it.
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	key := userKey(t, "u")
	w.mu.Lock()
	written, envoy := w.written[key], w.envoy[key]
	w.mu.Unlock()
	want := sluice.Descriptor{Domain: "api", Entries: []sluice.Entry{{Key: "user", Value: "u"}}}
	if written != 3 || envoy.Domain != want.Domain || len(envoy.Entries) != 1 || envoy.Entries[0] != want.Entries[0] {
		t.Errorf("written back %d hits with Envoy descriptor %+v, want 3 with %+v", written, envoy, want)
	}
}
