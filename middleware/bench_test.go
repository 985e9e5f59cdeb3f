package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/middleware"
)

// BenchmarkLimit is one request through the middleware over the memory
// store, limited by a rate limit or by a concurrency limit (a slot taken
// and given back per request), or both, the same identity and handler in
// each:
//
//	go test ./middleware -run '^$' -bench Limit -count 10 | benchstat -col /kind -
func BenchmarkLimit(b *testing.B) {
	for _, bc := range []struct{ name, rules string }{
		{"kind=rate", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"},
		{"kind=concurrency", "domain: api\ndescriptors:\n  - key: user\n    concurrency: 1000\n"},
		{"kind=both", "domain: api\ndescriptors:\n  - key: user\n    concurrency: 1000\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			id, err := identity.New(identity.Config{Domain: "api", RateLimits: []identity.RateLimit{
				{Actions: []identity.Action{{RequestHeaders: &identity.RequestHeaders{HeaderName: "X-User", DescriptorKey: "user"}}}},
			}}, nil)
			if err != nil {
				b.Fatal(err)
			}
			limit, err := middleware.New(middleware.Config{Identity: id, Decider: testenv.Decider(b, bc.rules, nil)})
			if err != nil {
				b.Fatal(err)
			}
			h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.Header.Set("X-User", "alice")
				w := httptest.NewRecorder()
				for pb.Next() {
					h.ServeHTTP(w, r)
					if w.Code != http.StatusOK {
						b.Fatalf("status %d", w.Code)
					}
				}
			})
		})
	}
}
