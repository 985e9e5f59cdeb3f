package respond_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/transport/forwardauth"
	"github.com/sluicehq/sluice/transport/proxy"
	"github.com/sluicehq/sluice/transport/respond"
)

// decider is a hand-written fake Decider.
type decider func(context.Context, *decide.Request) (*decide.Response, error)

func (d decider) Decide(ctx context.Context, r *decide.Request) (*decide.Response, error) {
	return d(ctx, r)
}

// writer records whether anything was written, which a ResponseRecorder
// cannot tell for a 200 written on purpose.
type writer struct {
	*httptest.ResponseRecorder
	wrote bool
}

func (w *writer) WriteHeader(code int) { w.wrote = true; w.ResponseRecorder.WriteHeader(code) }
func (w *writer) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseRecorder.Write(b)
}

// wayIn makes one HTTP way in over a Guard's settings; a request it lets
// through is answered 204 (the handler after the middleware, the proxy's
// upstream) or 200 (forward-auth).
type wayIn struct {
	name string
	pass int
	make func(t *testing.T, id *identity.Identity, d respond.Decider, failClosed bool) (http.Handler, error)
}

func waysIn(t *testing.T) []wayIn {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(upstream.Close)
	up, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	return []wayIn{
		{"middleware", http.StatusNoContent, func(t *testing.T, id *identity.Identity, d respond.Decider, failClosed bool) (http.Handler, error) {
			limit, err := middleware.New(middleware.Config{Identity: id, Decider: d, FailClosed: failClosed, Logger: quiet})
			if err != nil {
				return nil, err
			}
			return limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })), nil
		}},
		{"forward-auth", http.StatusOK, func(t *testing.T, id *identity.Identity, d respond.Decider, failClosed bool) (http.Handler, error) {
			return forwardauth.New(forwardauth.Config{Identity: id, Decider: d, FailClosed: failClosed, Logger: quiet})
		}},
		{"proxy", http.StatusNoContent, func(t *testing.T, id *identity.Identity, d respond.Decider, failClosed bool) (http.Handler, error) {
			p, err := proxy.New(proxy.Config{Upstream: up, Identity: id, Decider: d, FailClosed: failClosed, Logger: quiet})
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { p.Close() })
			return p, nil
		}},
	}
}

// byKey limits by the X-Key header; requests without it have no
// descriptor.
func byKey(t *testing.T) *identity.Identity {
	t.Helper()
	id, err := identity.New(identity.Config{Domain: "api", ForwardAuthHeaders: identity.ForwardAuthXOriginal, RateLimits: []identity.RateLimit{
		{Actions: []identity.Action{{RequestHeaders: &identity.RequestHeaders{HeaderName: "X-Key", DescriptorKey: "key"}}}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestGuard runs every HTTP way in through the cases of the step they
// share: a decision over a real service (pass with the fields, then 429),
// a failing Decider (fail open, fail closed), a request without
// descriptors, a client gone while deciding, and a configuration that
// cannot decide.
func TestGuard(t *testing.T) {
	t.Parallel()
	boom := decider(func(context.Context, *decide.Request) (*decide.Response, error) { return nil, errors.New("boom") })
	gone := decider(func(ctx context.Context, _ *decide.Request) (*decide.Response, error) {
		<-ctx.Done() // the client leaves while the store is slow
		return nil, ctx.Err()
	})
	for _, way := range waysIn(t) {
		t.Run(way.name, func(t *testing.T) {
			t.Parallel()
			serve := func(h http.Handler, key string, ctx context.Context) *writer {
				r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx)
				if key != "" {
					r.Header.Set("X-Key", key)
				}
				w := &writer{ResponseRecorder: httptest.NewRecorder()}
				h.ServeHTTP(w, r)
				return w
			}
			bg := context.Background()

			clk := clocktest.New(t0)
			h, err := way.make(t, byKey(t), service(t, "domain: api\ndescriptors:\n  - {key: key, rate_limit: {name: k, unit: minute, requests_per_unit: 1}}\n", clk), false)
			if err != nil {
				t.Fatal(err)
			}
			if w := serve(h, "a", bg); w.Code != way.pass || w.Header().Get("RateLimit") != `"k";r=0;t=60` {
				t.Errorf("first: %d RateLimit %q, want %d with the fields", w.Code, w.Header().Get("RateLimit"), way.pass)
			}
			if w := serve(h, "a", bg); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
				t.Errorf("second: %d Retry-After %q, want 429 with Retry-After", w.Code, w.Header().Get("Retry-After"))
			}

			for _, tt := range []struct {
				name       string
				d          respond.Decider
				failClosed bool
				key        string
				ctx        func() context.Context
				want       int // 0: nothing written
			}{
				{"decider error: fail open", boom, false, "a", nil, way.pass},
				{"decider error: fail closed", boom, true, "a", nil, http.StatusServiceUnavailable},
				{"no descriptors: nothing to decide, even fail closed", boom, true, "", nil, way.pass},
				{"client gone while deciding: nothing written", gone, false, "a", func() context.Context {
					ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
					t.Cleanup(cancel)
					return ctx
				}, 0},
			} {
				h, err := way.make(t, byKey(t), tt.d, tt.failClosed)
				if err != nil {
					t.Fatal(err)
				}
				ctx := bg
				if tt.ctx != nil {
					ctx = tt.ctx()
				}
				w := serve(h, tt.key, ctx)
				if tt.want == 0 {
					if w.wrote {
						t.Errorf("%s: wrote %d %q", tt.name, w.Code, w.Body)
					}
				} else if w.Code != tt.want {
					t.Errorf("%s: %d, want %d", tt.name, w.Code, tt.want)
				}
			}

			if _, err := way.make(t, nil, boom, false); err == nil {
				t.Error("made without an Identity")
			}
			if _, err := way.make(t, byKey(t), nil, false); err == nil {
				t.Error("made without a Decider")
			}
		})
	}
}
