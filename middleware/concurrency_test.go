package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/middleware"
)

// TestConcurrencyPanic: a handler that panics gives its concurrency slot
// back, and while a request is in the handler a second one is refused.
func TestConcurrencyPanic(t *testing.T) {
	t.Parallel()
	id, err := identity.New(identity.Config{Domain: "api", RateLimits: []identity.RateLimit{
		{Actions: []identity.Action{{GenericKey: &identity.GenericKey{DescriptorKey: "all", DescriptorValue: "yes"}}}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := testenv.Decider(t, "domain: api\ndescriptors:\n  - key: all\n    concurrency: 1\n", nil)
	limit, err := middleware.New(middleware.Config{Identity: id, Decider: svc})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler
	inner := 0
	h = limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner++
		switch r.URL.Path {
		case "/panic":
			panic("handler failed")
		case "/nested": // a second request while this one holds the slot
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			w.WriteHeader(rec.Code)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	serve := func(path string) (code int, panicked bool) {
		defer func() {
			if recover() != nil {
				panicked = true
			}
		}()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, false
	}
	if code, _ := serve("/nested"); code != http.StatusTooManyRequests {
		t.Fatalf("a request beside one in flight: %d, want 429", code)
	}
	if _, panicked := serve("/panic"); !panicked {
		t.Fatal("the handler's panic did not go on")
	}
	if code, _ := serve("/"); code != http.StatusNoContent {
		t.Fatalf("after a panic: %d, want 204 (the slot came back)", code)
	}
	if inner != 3 {
		t.Fatalf("the handler ran %d times, want 3", inner)
	}
}
