package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/shed"
)

// TestElasticSpare: behind the middleware with a load shedder, a client
// past its own limit passes its elastic limit only while the handler has
// room: refused (429) while another request holds the only slot a
// sheddable request could have, admitted once it is free.
func TestElasticSpare(t *testing.T) {
	t.Parallel()
	id, err := identity.New(identity.Config{Domain: "api", RateLimits: []identity.RateLimit{
		{Actions: []identity.Action{{RequestHeaders: &identity.RequestHeaders{HeaderName: "X-User", DescriptorKey: "user"}}}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := testenv.Decider(t, `
domain: api
capacity: {unit: second, requests_per_unit: 100}
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, throttling: elastic, elastic_percent: 100}
`, func() time.Time { return time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) })
	// 2 slots, half kept from sheddable requests: room for one more while
	// none is in flight, none while one is.
	gate, err := shed.New(shed.Config{InitialLimit: 2, MinLimit: 2, MaxLimit: 2, ReservePercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	limit, err := middleware.New(middleware.Config{Identity: id, Decider: svc, Shed: gate})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler
	h = limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/nested" { // alice asks while this request holds a slot
			w.WriteHeader(serve(h, "alice", "/"))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	for i := range 2 {
		if code := serve(h, "alice", "/"); code != http.StatusNoContent {
			t.Fatalf("alice's request %d within her limit: %d", i+1, code)
		}
	}
	if code := serve(h, "bob", "/nested"); code != http.StatusTooManyRequests {
		t.Fatalf("alice past her limit with a slot of the handler's taken: %d, want 429", code)
	}
	if code := serve(h, "alice", "/"); code != http.StatusNoContent {
		t.Fatalf("alice past her limit with room: %d, want 204", code)
	}
}

// serve sends a GET of path as user through h and returns the status.
func serve(h http.Handler, user, path string) int {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Header.Set("X-User", user)
	h.ServeHTTP(rec, r)
	return rec.Code
}
