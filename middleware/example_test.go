package middleware_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/transport/respond"
)

// Example limits a service to 2 requests a minute per client IP and per
// user at once, with the in-memory store.
func Example() {
	set, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: remote_address
    rate_limit: {name: per-ip, unit: minute, requests_per_unit: 100}
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 2}
`))
	if err != nil {
		log.Fatal(err)
	}
	id, err := identity.New(identity.Config{
		Domain: "api",
		RateLimits: []identity.RateLimit{
			{Actions: []identity.Action{{RemoteAddress: &identity.RemoteAddress{}}}},
			{Actions: []identity.Action{{RequestHeaders: &identity.RequestHeaders{HeaderName: "X-User", DescriptorKey: "user"}}}},
		},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	storeCfg := memory.DefaultConfig()
	storeCfg.Now = func() time.Time { return time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) } // a fixed clock for the output below; leave nil in real use
	store, err := memory.New(storeCfg)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	decideCfg := decide.DefaultConfig()
	decideCfg.Rules = func() *rules.Set { return set }
	decideCfg.Store = store
	svc, err := decide.New(decideCfg)
	if err != nil {
		log.Fatal(err)
	}

	limit, err := middleware.New(middleware.Config{
		Identity: id,
		Decider:  svc,
		// The IETF fields and Retry-After, without jitter here, for the
		// output below; leave Respond nil for every field and 1 s of jitter.
		Respond: respond.New(respond.Config{Headers: respond.HeaderRateLimit | respond.HeaderRetryAfter, RetryJitter: -1}),
	})
	if err != nil {
		log.Fatal(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	h := limit(hello)

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "per-ip";r=99;t=60, "per-user";r=1;t=60 Retry-After: ""
	// 200 RateLimit: "per-ip";r=98;t=60, "per-user";r=0;t=60 Retry-After: ""
	// 429 RateLimit: "per-ip";r=98;t=60, "per-user";r=0;t=60 Retry-After: "60"
}
