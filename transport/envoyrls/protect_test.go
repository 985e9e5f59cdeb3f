package envoyrls

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// TestProtectOverGRPC: through the gRPC service on the real decision
// service, a concurrency limit holds each request's slot for the lease
// (gRPC reports no end) and an elastic limit reaches its ceiling while the
// pool is idle.
func TestProtectOverGRPC(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	set, err := rules.Parse("r.yaml", []byte(`
domain: api
capacity: {unit: second, requests_per_unit: 100}
descriptors:
  - key: report
    concurrency: 2
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2, throttling: elastic, elastic_percent: 50}
`))
	if err != nil {
		t.Fatal(err)
	}
	mc := memory.DefaultConfig()
	mc.Now = clk.Now
	st, err := memory.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ac := admit.DefaultConfig()
	ac.Now = clk.Now
	step, err := admit.New(ac)
	if err != nil {
		t.Fatal(err)
	}
	dc := decide.DefaultConfig()
	dc.Rules, dc.Store, dc.Now, dc.Logger = func() *rules.Set { return set }, st, clk.Now, slog.New(slog.DiscardHandler)
	dc.Admit = step
	svc, err := decide.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	client := rlsv3.NewRateLimitServiceClient(serve(t, New(svc, Config{})))
	ask := func(key, value string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(key, value)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	var codes []rlsv3.RateLimitResponse_Code
	for range 3 {
		codes = append(codes, ask("report", "monthly"))
	}
	clk.Advance(ac.Lease) // the leases end
	codes = append(codes, ask("report", "monthly"))
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	if want := []rlsv3.RateLimitResponse_Code{ok, ok, over, ok}; !slices.Equal(codes, want) {
		t.Fatalf("concurrency 2 over gRPC: %v, want %v", codes, want)
	}
	codes = codes[:0]
	for range 4 {
		codes = append(codes, ask("user", "alice"))
	}
	if want := []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}; !slices.Equal(codes, want) {
		t.Fatalf("elastic 2 (ceiling 3) over gRPC: %v, want %v", codes, want)
	}
}
