package proxy_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/transport/proxy"
	"github.com/sluicehq/sluice/transport/respond"
)

// t0 is the start of a second.
var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// clock is the tests' fake clock; its Sleep advances it instead of
// waiting, so that the store sees the time the proxy waited.
type clock = clocktest.Clock

// decider is a hand-written fake Decider.
type decider func(context.Context, *decide.Request) (*decide.Response, error)

func (d decider) Decide(ctx context.Context, r *decide.Request) (*decide.Response, error) {
	return d(ctx, r)
}

// signalSleep returns the proxy's default Sleep, a real timer, that
// signals on entered as it starts to wait.
func signalSleep(entered chan<- struct{}) func(context.Context, time.Duration) error {
	sleep := proxy.DefaultConfig().Sleep
	return func(ctx context.Context, d time.Duration) error {
		entered <- struct{}{}
		return sleep(ctx, d)
	}
}

// service returns the real decision service over the memory store; a nil
// clk means the store's real clock.
func service(t testing.TB, rulesYAML string, clk *clock) *decide.Service {
	if clk == nil {
		return testenv.Decider(t, rulesYAML, nil)
	}
	return testenv.Decider(t, rulesYAML, clk.Now)
}

// everyone puts every request in one generic descriptor.
func everyone(t testing.TB) *identity.Identity {
	t.Helper()
	id, err := identity.New(identity.Config{Domain: "api", RateLimits: []identity.RateLimit{
		{Actions: []identity.Action{{GenericKey: &identity.GenericKey{DescriptorKey: "all", DescriptorValue: "yes"}}}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func newProxy(t testing.TB, upstream string, cfg proxy.Config) *proxy.Proxy {
	t.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Upstream = u
	if cfg.Identity == nil {
		cfg.Identity = everyone(t)
	}
	if cfg.Respond == nil {
		cfg.Respond = respond.New(respond.Config{RetryJitter: -1}) // no jitter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// failingUpstreams returns the URL of an upstream that refuses
// connections and that of one that sends no response headers until the
// request is cancelled or the test ends.
func failingUpstreams(t *testing.T) (refused, late string) {
	t.Helper()
	closed := httptest.NewServer(http.NotFoundHandler())
	refused = closed.URL
	closed.Close()
	stop := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(stop) })
	return refused, slow.URL
}
