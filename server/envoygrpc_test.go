package server

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestEnvoyPrometheusSeries checks /metrics against what Envoy ratelimit's
// Prometheus sink writes: its server's total_requests and response time
// by gRPC method, and a descriptor of one level without a key2 label
// beside one of two levels with it.
func TestEnvoyPrometheusSeries(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 5}
`)
	c := testConfig(rules)
	c.Envoy.Metrics = true
	s := startServer(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, d := range []*ratelimitv3.RateLimitDescriptor{descriptor("user", "alice"), descriptor("user", "alice", "path", "/login")} {
		if _, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}); err != nil {
			t.Fatal(err)
		}
	}
	// The response time is observed when the call's stats end, which may
	// come after its answer reached the client: wait for both calls'.
	var body string
	eventually(t, "both calls' response times on /metrics", func() bool {
		body = s.do(t, "GET", "/metrics", "").body
		return strings.Contains(body, `ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 2`+"\n")
	})
	for _, want := range []string{
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 2`,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 2`,
		`ratelimit_service_rate_limit_total_hits{domain="api",key1="user"} 1`,
		`ratelimit_service_rate_limit_total_hits{domain="api",key1="user",key2="path"} 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `key2=""`) {
		t.Error(`/metrics has key2="", which Envoy's sink never writes`)
	}
}
