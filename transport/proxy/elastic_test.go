package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/shed"
	"github.com/sluicehq/sluice/transport/proxy"
)

// TestElasticSpare: through the real proxy with a load shedder, a client
// past its own limit is let through by its elastic limit only while the
// upstream has room: with the upstream at the shedder's limit it gets 429
// at once (it neither waits for a slot nor reaches the upstream), and once
// the upstream has room it reaches its ceiling, the domain's pool being
// idle all along.
func TestElasticSpare(t *testing.T) {
	hold := make(chan struct{})
	var slow, seen atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		if r.URL.Path == "/slow" {
			slow.Add(1)
			select {
			case <-hold:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer backend.Close()
	gate, err := shed.New(shed.Config{InitialLimit: 2, MinLimit: 2, MaxLimit: 2, MaxWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	id, err := identity.New(identity.Config{Domain: "api", RateLimits: []identity.RateLimit{
		{Actions: []identity.Action{{RequestHeaders: &identity.RequestHeaders{HeaderName: "X-User", DescriptorKey: "user"}}}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := service(t, `
domain: api
capacity: {unit: second, requests_per_unit: 100}
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, throttling: elastic, elastic_percent: 100}
`, clocktest.New(t0)) // a clock that stands still: one window throughout
	p := newProxy(t, backend.URL, proxy.Config{Decider: svc, Identity: id, Shed: gate})
	front := httptest.NewServer(p)
	defer front.Close()
	get := func(user, path string) int {
		req, _ := http.NewRequest(http.MethodGet, front.URL+path, nil)
		req.Header.Set("X-User", user)
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	for i := range 2 {
		if code := get("alice", "/"); code != http.StatusOK {
			t.Fatalf("alice's request %d within her limit: %d", i+1, code)
		}
	}
	// bob fills the upstream's two slots.
	done := make(chan int, 2)
	for range 2 {
		go func() { done <- get("bob", "/slow") }()
	}
	testenv.WaitFor(t, "2 at the upstream", func() bool { return slow.Load() == 2 })
	before := seen.Load()
	if code := get("alice", "/"); code != http.StatusTooManyRequests {
		t.Fatalf("alice past her limit with the upstream saturated: %d, want 429", code)
	}
	if seen.Load() != before || gate.Stats().Waiting != 0 {
		t.Fatalf("the refused request reached the upstream or waits: %+v", gate.Stats())
	}

	close(hold)
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Fatalf("bob: %d", code)
		}
	}
	testenv.WaitFor(t, "the slots back", func() bool { return gate.Stats().InFlight == 0 })
	for i := range 2 {
		if code := get("alice", "/"); code != http.StatusOK {
			t.Fatalf("alice's request %d past her limit with room upstream: %d, want 200 (up to her ceiling of 4)", i+1, code)
		}
	}
	if code := get("alice", "/"); code != http.StatusTooManyRequests {
		t.Fatalf("alice past her ceiling: %d, want 429", code)
	}
}
