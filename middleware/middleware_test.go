package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/middleware"
)

func hybrid(t *testing.T) (*identity.Identity, *decide.Service) {
	t.Helper()
	c, err := identity.Parse("identity.yaml", []byte(`
domain: api
trusted_proxies: [10.0.0.1]
rate_limits:
  - actions: [{remote_address: {}}]
  - actions: [{request_headers: {header_name: X-User, descriptor_key: user}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	id, err := identity.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := testenv.Decider(t, `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {name: per-ip, unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 2}
`, func() time.Time { return time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) })
	return id, svc
}

// TestHybrid: users behind one gateway address are limited each on their
// own, and all together by the address.
func TestHybrid(t *testing.T) {
	t.Parallel()
	id, svc := hybrid(t)
	calls := 0
	h := middleware.New(middleware.Config{Identity: id, Decider: svc})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(http.StatusNoContent)
	}))
	steps := []struct {
		name string
		user string
		want int
	}{
		{"alice 1", "alice", 204},
		{"alice 2", "alice", 204},
		{"alice 3 is over her limit", "alice", 429},
		{"bob behind the same gateway is not", "bob", 204},
		{"bob 2", "bob", 204},
		{"carol: the gateway's fifth", "carol", 204},
		{"dave: the gateway is over its limit", "dave", 429},
	}
	for _, s := range steps {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "10.0.0.1:5000"
		r.Header.Set("X-Forwarded-For", "198.51.100.7")
		r.Header.Set("X-User", s.user)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != s.want {
			t.Fatalf("%s: %d, want %d (headers %v)", s.name, w.Code, s.want, w.Header())
		}
		if w.Header().Get("RateLimit-Policy") == "" || w.Header().Get("X-RateLimit-Limit") == "" {
			t.Fatalf("%s: no rate limit fields: %v", s.name, w.Header())
		}
	}
	if calls != 5 {
		t.Fatalf("next handler ran %d times, want 5", calls)
	}
}

type decider struct {
	decide func(context.Context, *decide.Request) (*decide.Response, error)
}

func (d decider) Decide(ctx context.Context, r *decide.Request) (*decide.Response, error) {
	return d.decide(ctx, r)
}

func TestErrors(t *testing.T) {
	t.Parallel()
	id, _ := hybrid(t)
	failing := decider{func(context.Context, *decide.Request) (*decide.Response, error) { return nil, errors.New("boom") }}
	quiet := slog.New(slog.DiscardHandler)
	tests := []struct {
		name string
		cfg  middleware.Config
		want int
	}{
		{"decider error: fail open", middleware.Config{Identity: id, Decider: failing, Logger: quiet}, 204},
		{"decider error: fail closed", middleware.Config{Identity: id, Decider: failing, FailClosed: true, Logger: quiet}, 503},
		{"no descriptors: nothing to decide, even fail closed", middleware.Config{Identity: noDescriptors(t), Decider: failing, FailClosed: true, Logger: quiet}, 204},
		{"no decider", middleware.Config{Identity: id, Logger: quiet}, 500},
		{"no identity", middleware.Config{Decider: failing, Logger: quiet}, 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := middleware.New(tt.cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			if w.Code != tt.want {
				t.Fatalf("%d, want %d", w.Code, tt.want)
			}
		})
	}
}

// noDescriptors is an identity whose only action needs a header the test
// requests do not send.
func noDescriptors(t *testing.T) *identity.Identity {
	t.Helper()
	id, err := identity.New(identity.Config{Domain: "api", RateLimits: []identity.RateLimit{
		{Actions: []identity.Action{{RequestHeaders: &identity.RequestHeaders{HeaderName: "X-Absent", DescriptorKey: "k"}}}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
