package decide_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

const oneLimit = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: export
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// hang is a store that blocks until the call's context is done, as a
// store behind a dead network does; it checks the call has a deadline.
func hang(t *testing.T) func(ctx context.Context, _ []sluice.Request, _ []sluice.Decision) error {
	return func(ctx context.Context, _ []sluice.Request, _ []sluice.Decision) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("store called without a deadline")
		}
		<-ctx.Done()
		return ctx.Err()
	}
}

var errRefused = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")

func refuse(context.Context, []sluice.Request, []sluice.Decision) error { return errRefused }

func TestFailModes(t *testing.T) {
	t.Parallel()
	set := loadRules(t, oneLimit)
	tests := []struct {
		name  string
		fail  decide.Fail
		store func(t *testing.T) func(context.Context, []sluice.Request, []sluice.Decision) error
		// want: the overall codes of two requests in a row, the mode they
		// are decided in, and the Service's Mode after.
		want [2]decide.Code
		mode decide.Mode
		now  decide.Mode
		// calls: the store calls, when not 4 (each request's enforcing
		// TakeAll and its shadow one): the fail mode local leaves a store
		// call it has no time left for.
		calls int64
	}{
		// A store that times out is slow, not down: its limits hold.
		{name: "open, timeout", fail: decide.FailOpen, store: hang, want: [2]decide.Code{decide.OverLimit, decide.OverLimit}, mode: decide.ModeSlow, now: decide.ModeSlow},
		{name: "open, error", fail: decide.FailOpen, store: func(*testing.T) func(context.Context, []sluice.Request, []sluice.Decision) error { return refuse }, want: [2]decide.Code{decide.OK, decide.OK}, mode: decide.ModeOpen},
		{name: "closed, timeout", fail: decide.FailClosed, store: hang, want: [2]decide.Code{decide.OverLimit, decide.OverLimit}, mode: decide.ModeSlow, now: decide.ModeSlow},
		{name: "closed, error", fail: decide.FailClosed, store: func(*testing.T) func(context.Context, []sluice.Request, []sluice.Decision) error { return refuse }, want: [2]decide.Code{decide.OverLimit, decide.OverLimit}, mode: decide.ModeClosed},
		{name: "local, timeout", fail: decide.FailLocal, store: hang, want: [2]decide.Code{decide.OK, decide.OverLimit}, mode: decide.ModeLocal, now: decide.ModeLocal, calls: 2},
		{name: "local, error", fail: decide.FailLocal, store: func(*testing.T) func(context.Context, []sluice.Request, []sluice.Decision) error { return refuse }, want: [2]decide.Code{decide.OK, decide.OverLimit}, mode: decide.ModeLocal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			fake := &fakeStore{takeAll: tt.store(t)}
			cfg := decide.DefaultConfig()
			cfg.Store, cfg.Fail, cfg.StoreTimeout = fake, tt.fail, 10*time.Millisecond
			cfg.BreakerFailures = -1 // no breaker: every decision goes to the store
			s := newService(t, set, clk, cfg)
			for i, code := range tt.want {
				resp := decideOK(t, s, req("api", []string{"user", "alice"}, []string{"export", "x"}))
				if resp.Overall != code || resp.Mode != tt.mode {
					t.Errorf("request %d: %v in mode %v, want %v in mode %v", i, resp.Overall, resp.Mode, code, tt.mode)
				}
				if sh := resp.Statuses[1]; sh.Code != decide.OK {
					t.Errorf("request %d: shadow descriptor %v, want OK", i, sh.Code)
				}
				st := resp.Statuses[0]
				switch tt.mode {
				case decide.ModeOpen:
					if st.Limit != nil {
						t.Errorf("request %d: fail open reports limit %v, want none", i, st.Limit)
					}
				case decide.ModeClosed, decide.ModeSlow:
					if st.Limit == nil || st.Decision.RetryAfter != cfg.BreakerCoolDown || st.Decision.Remaining != 0 {
						t.Errorf("request %d: %v status %+v, want the limit, nothing remaining, retry after the cool-down", i, tt.mode, st)
					}
				case decide.ModeLocal:
					if st.Limit == nil || st.Decision.Limit != 1 {
						t.Errorf("request %d: local status %+v, want the limit of 1", i, st)
					}
				}
			}
			// Two descriptors: one enforcing TakeAll and one for the shadow one.
			want := cmp.Or(tt.calls, 4)
			if got := fake.calls.Load(); got != want {
				t.Errorf("store called %d times, want %d", got, want)
			}
			if s.Mode() != tt.now {
				t.Errorf("Mode() = %v without a breaker, want %v", s.Mode(), tt.now)
			}
		})
	}
}

// switchable is a store that fails while down is set and otherwise passes
// calls on to a real store.
type switchable struct {
	sluice.Store
	down  atomic.Bool
	calls atomic.Int64
}

func (s *switchable) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	s.calls.Add(1)
	if s.down.Load() {
		return errRefused
	}
	return s.Store.TakeAll(ctx, reqs, ds)
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		fail decide.Fail
		mode decide.Mode
	}{
		{name: "open", fail: decide.FailOpen, mode: decide.ModeOpen},
		{name: "closed", fail: decide.FailClosed, mode: decide.ModeClosed},
		{name: "local", fail: decide.FailLocal, mode: decide.ModeLocal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			st := &switchable{Store: newMemory(t, clk)}
			cfg := decide.DefaultConfig()
			cfg.Store, cfg.Fail = st, tt.fail
			cfg.BreakerFailures, cfg.BreakerCoolDown = 3, 10*time.Second
			s := newService(t, loadRules(t, oneLimit), clk, cfg)
			r := func() *decide.Request { return withCost(req("api", []string{"user", "alice"}), 0) }

			check := func(step string, calls int64, mode decide.Mode) {
				t.Helper()
				resp := decideOK(t, s, r())
				if resp.Mode != mode {
					t.Errorf("%s: decided in mode %v, want %v", step, resp.Mode, mode)
				}
				if got := st.calls.Load(); got != calls {
					t.Errorf("%s: %d store calls, want %d", step, got, calls)
				}
			}
			check("healthy", 1, decide.ModeStore)
			st.down.Store(true)
			check("first failure", 2, tt.mode)
			check("second failure", 3, tt.mode)
			if s.Mode() != decide.ModeStore {
				t.Errorf("Mode() = %v before the breaker opens, want store", s.Mode())
			}
			check("third failure opens the breaker", 4, tt.mode)
			if s.Mode() != tt.mode {
				t.Errorf("Mode() = %v with the breaker open, want %v", s.Mode(), tt.mode)
			}
			check("open: the store is left alone", 4, tt.mode)
			clk.Advance(10 * time.Second)
			check("the probe fails and reopens", 5, tt.mode)
			check("reopened", 5, tt.mode)
			st.down.Store(false)
			clk.Advance(9 * time.Second)
			check("still cooling down", 5, tt.mode)
			clk.Advance(time.Second)
			check("the probe succeeds", 6, decide.ModeStore)
			if s.Mode() != decide.ModeStore {
				t.Errorf("Mode() = %v after recovery, want store", s.Mode())
			}
			check("back on the store", 7, decide.ModeStore)
		})
	}
}

// TestBreakerIgnoresCallerCancel checks that calls the caller gave up on do
// not count against the store.
func TestBreakerIgnoresCallerCancel(t *testing.T) {
	t.Parallel()
	clk := newClock()
	fake := &fakeStore{takeAll: func(ctx context.Context, _ []sluice.Request, _ []sluice.Decision) error { return ctx.Err() }}
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.BreakerFailures, cfg.Fail = fake, 1, decide.FailOpen
	s := newService(t, loadRules(t, oneLimit), clk, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		resp, err := s.Decide(ctx, req("api", []string{"user", "alice"}))
		if err != nil || resp.Overall != decide.OK || resp.Mode != decide.ModeOpen {
			t.Fatalf("Decide with a canceled context = %+v, %v; want OK in fail_open", resp, err)
		}
	}
	if fake.calls.Load() != 3 || s.Mode() != decide.ModeStore {
		t.Errorf("%d store calls and mode %v, want 3 calls and the breaker closed", fake.calls.Load(), s.Mode())
	}
}

// TestDecideConcurrentOutage decides from many goroutines while the store
// hangs: every decision returns, denied as the store is slow; once the hang
// has lasted the breaker's window, the breaker opens and the fail mode
// decides.
func TestDecideConcurrentOutage(t *testing.T) {
	t.Parallel()
	clk := newClock()
	fake := &fakeStore{takeAll: hang(t)}
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.StoreTimeout, cfg.BreakerFailures, cfg.Fail = fake, 5*time.Millisecond, 4, decide.FailOpen
	s := newService(t, loadRules(t, oneLimit), clk, cfg)
	const workers, each = 8, 10
	round := func(code decide.Code, mode decide.Mode) {
		t.Helper()
		errs := make(chan error, workers)
		for w := range workers {
			go func() {
				for range each {
					resp, err := s.Decide(context.Background(), req("api", []string{"user", string(rune('a' + w))}))
					if err == nil && (resp.Overall != code || resp.Mode != mode) {
						err = fmt.Errorf("decision %v in mode %v, want %v in %v", resp.Overall, resp.Mode, code, mode)
					}
					if err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range workers {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
	round(decide.OverLimit, decide.ModeSlow)
	if s.Mode() != decide.ModeSlow {
		t.Errorf("Mode() = %v, want slow", s.Mode())
	}
	if n := fake.calls.Load(); n != workers*each {
		t.Errorf("the store saw %d calls, want all %d: the breaker opened before its window", n, workers*each)
	}
	clk.Advance(cfg.BreakerWindow)
	if resp := decideOK(t, s, req("api", []string{"user", "z"})); resp.Mode != decide.ModeSlow {
		t.Errorf("the call that opens the breaker decided in mode %v, want slow", resp.Mode)
	}
	round(decide.OK, decide.ModeOpen)
	if s.Mode() != decide.ModeOpen {
		t.Errorf("Mode() = %v, want fail_open", s.Mode())
	}
	if n := fake.calls.Load(); n != workers*each+1 {
		t.Errorf("the store saw %d calls, want %d: the breaker did not open", n, workers*each+1)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	clk := newClock()
	mem := newMemory(t, clk)
	tests := []struct {
		name string
		cfg  decide.Config
	}{
		{name: "no store", cfg: decide.Config{}},
		{name: "unknown fail mode", cfg: decide.Config{Store: mem, Fail: decide.Fail(9)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if s, err := decide.New(tt.cfg); err == nil {
				t.Errorf("New = %v, want an error", s)
			}
		})
	}
}

func TestParseFail(t *testing.T) {
	t.Parallel()
	for _, f := range []decide.Fail{decide.FailOpen, decide.FailClosed, decide.FailLocal} {
		var g decide.Fail
		if err := g.UnmarshalText([]byte(f.String())); err != nil || g != f {
			t.Errorf("round trip of %v gave %v, %v", f, g, err)
		}
	}
	if _, err := decide.ParseFail("maybe"); err == nil {
		t.Error("ParseFail(maybe) succeeded")
	}
}

// TestNonBlockingStore checks that a store that declares it never blocks
// is called without a deadline, and others with one.
func TestNonBlockingStore(t *testing.T) {
	t.Parallel()
	set := loadRules(t, oneLimit)
	tests := []struct {
		name     string
		wrap     func(sluice.Store) sluice.Store
		deadline bool
	}{
		{name: "plain store", wrap: func(s sluice.Store) sluice.Store { return s }, deadline: true},
		{name: "non-blocking store", wrap: func(s sluice.Store) sluice.Store { return nonBlocking{s} }, deadline: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			mem := newMemory(t, clk)
			var sawDeadline atomic.Bool
			fake := &fakeStore{takeAll: func(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
				_, ok := ctx.Deadline()
				sawDeadline.Store(ok)
				return mem.TakeAll(ctx, reqs, ds)
			}}
			s := newService(t, set, clk, decide.Config{Store: tt.wrap(fake), StoreTimeout: time.Second})
			resp := decideOK(t, s, req("api", []string{"user", "alice"}))
			if resp.Overall != decide.OK || fake.calls.Load() != 1 {
				t.Fatalf("decided %v with %d store calls, want OK from the store", resp.Overall, fake.calls.Load())
			}
			if sawDeadline.Load() != tt.deadline {
				t.Errorf("store call had a deadline: %v, want %v", sawDeadline.Load(), tt.deadline)
			}
		})
	}
}

// notReady is a switchable store that is Ready only once up is set.
type notReady struct {
	*switchable
	up atomic.Bool
}

func (n *notReady) Ready() bool { return n.up.Load() }

// TestReadyStore checks that Mode reports the fail mode while the store
// is not Ready, before any decision failed, and the store once it is.
func TestReadyStore(t *testing.T) {
	t.Parallel()
	clk := newClock()
	st := &notReady{switchable: &switchable{Store: newMemory(t, clk)}}
	st.down.Store(true)
	cfg := decide.DefaultConfig()
	cfg.Store, cfg.Fail = st, decide.FailClosed
	s := newService(t, loadRules(t, oneLimit), clk, cfg)
	if s.Mode() != decide.ModeClosed {
		t.Errorf("Mode() = %v with the store not ready, want closed", s.Mode())
	}
	st.down.Store(false)
	st.up.Store(true)
	if s.Mode() != decide.ModeStore {
		t.Errorf("Mode() = %v with the store ready, want store", s.Mode())
	}
	if resp := decideOK(t, s, req("api", []string{"user", "alice"})); resp.Mode != decide.ModeStore {
		t.Errorf("decided in mode %v, want store", resp.Mode)
	}
}

// TestFailDecisions checks that decisions the store did not make are
// counted by mode, and said at Warn level at once and then at most once a
// minute, with the counts since the last line.
func TestFailDecisions(t *testing.T) {
	t.Parallel()
	clk := newClock()
	var logs strings.Builder
	cfg := decide.DefaultConfig()
	cfg.Rules = func() *rules.Set { return loadRules(t, oneLimit) }
	cfg.Store, cfg.Fail = &fakeStore{takeAll: refuse}, decide.FailOpen
	cfg.BreakerFailures = -1
	cfg.Now = clk.Now
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	s, err := decide.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		decideOK(t, s, req("api", []string{"user", "alice"}))
	}
	clk.Advance(time.Minute)
	decideOK(t, s, req("api", []string{"user", "alice"}))
	if got := s.FailDecisions(); got[decide.ModeOpen] != 4 || got[decide.ModeStore] != 0 {
		t.Errorf("FailDecisions() = %v, want 4 in fail_open", got)
	}
	want := `level=WARN msg="decided without the store: fail open admitted requests without their limits" fail_open=1 mode=store
level=WARN msg="decided without the store: fail open admitted requests without their limits" fail_open=3 since=1m0s mode=store
`
	if logs.String() != want {
		t.Errorf("logged\n%s\nwant\n%s", logs.String(), want)
	}
}

// TestFailLogSaysWhatHappened checks that the warning of decisions made
// without the store names the modes that made them since the last line,
// and only those: slow denials are not "fail open admitted requests".
func TestFailLogSaysWhatHappened(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fail  decide.Fail
		store func(t *testing.T) func(context.Context, []sluice.Request, []sluice.Decision) error
		want  string
	}{
		{name: "open, slow", fail: decide.FailOpen, store: hang,
			want: `level=WARN msg="decided without the store: denied requests the store did not answer in time" slow=1 mode=slow`},
		{name: "local, refused", fail: decide.FailLocal, store: func(*testing.T) func(context.Context, []sluice.Request, []sluice.Decision) error { return refuse },
			want: `level=WARN msg="decided without the store: decided locally, within this server's share of the limits" local=1 mode=store`},
		{name: "local, slow", fail: decide.FailLocal, store: hang,
			want: `level=WARN msg="decided without the store: decided locally, within this server's share of the limits" local=1 mode=local`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			var logs syncBuilder
			cfg := decide.DefaultConfig()
			cfg.Rules = func() *rules.Set { return loadRules(t, oneLimit) }
			cfg.Store, cfg.Fail = &fakeStore{takeAll: tt.store(t)}, tt.fail
			// A store that hangs is left at once; one that refuses has
			// all the time it needs, however loaded the machine.
			cfg.StoreTimeout, cfg.StoreMaxTimeout = time.Millisecond, time.Millisecond
			if tt.name == "local, refused" {
				cfg.StoreTimeout, cfg.StoreMaxTimeout = time.Minute, time.Minute
			}
			cfg.BreakerFailures = -1
			cfg.Now = clk.Now
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{
				Level: slog.LevelWarn,
				ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
					if a.Key == slog.TimeKey {
						return slog.Attr{}
					}
					return a
				},
			}))
			s, err := decide.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer closeNow(s)
			decideOK(t, s, req("api", []string{"user", "alice"}))
			if got := strings.TrimSpace(logs.String()); got != tt.want {
				t.Errorf("logged\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}
