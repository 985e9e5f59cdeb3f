package middleware_test

import (
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
	limit, err := middleware.New(middleware.Config{Identity: id, Decider: svc})
	if err != nil {
		t.Fatal(err)
	}
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

// TestNewErrors: a configuration that cannot decide is refused by New,
// not answered 500 at run time.
func TestNewErrors(t *testing.T) {
	t.Parallel()
	id, svc := hybrid(t)
	for _, tt := range []struct {
		name string
		cfg  middleware.Config
	}{
		{"no decider", middleware.Config{Identity: id}},
		{"no identity", middleware.Config{Decider: svc}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if limit, err := middleware.New(tt.cfg); err == nil || limit != nil {
				t.Fatalf("New = %v, %v; want an error", limit != nil, err)
			}
		})
	}
}
