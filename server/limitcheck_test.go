package server

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/testenv"
)

// inexactRules has, at line 6, a limit the Redis store cannot compute
// exactly and the memory store can.
const inexactRules = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: report
    rate_limit: {unit: day, requests_per_unit: 1000003, algorithm: token_bucket}
`

// inexactMsg is how the refusal of that limit starts.
const inexactMsg = ":6: limit 1000003/24h0m0s token_bucket: "

// TestStartRefusesStoreVeto checks that serve and proxy on Redis refuse to
// start with rules whose limits Redis cannot apply, naming file:line.
func TestStartRefusesStoreVeto(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, inexactRules)
	store := "redis://" + testenv.RedisAddr(t)
	for name, proxy := range map[string]*ProxyConfig{
		"serve": nil,
		"proxy": {Listen: "127.0.0.1:0", Upstream: "http://127.0.0.1:1"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := testConfig(path)
			c.Store.URL, c.Proxy = store, proxy
			wantError(t, c, path+inexactMsg)
		})
	}
}

// TestReloadRefusesStoreVeto checks that serve on Redis keeps its rules
// when a reload brings a limit Redis cannot apply, logs why at file:line,
// and still denies a client over its limit.
func TestReloadRefusesStoreVeto(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	domain := fmt.Sprintf("veto%d", time.Now().UnixNano())
	rulesFor := func(body string) string { return strings.Replace(body, "domain: api", "domain: "+domain, 1) }
	// One an hour in a sliding log: no window turns between the first
	// request and the last (a fixed window of a minute did, in the time
	// the reload takes). The store timeout only bounds a hang: fail open
	// would admit alice after a slow round trip.
	writeFile(t, path, rulesFor("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_log}\n"))
	c := testConfig(path)
	c.Store.URL, c.StoreTimeout = "redis://"+testenv.RedisAddr(t), 10*time.Second
	s := startServer(t, c)
	s.waitStore(t)
	ask := func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "alice")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	if got := ask(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v", got)
	}
	writeFile(t, path, rulesFor(inexactRules))
	eventually(t, "the vetoed reload is counted", func() bool {
		return strings.Contains(s.do(t, "GET", "/metrics", "").body, `sluice_rules_reloads_total{result="failure"} 1`)
	})
	rec := s.logs.Find("rules reload failed; the rules in force stay")
	if rec == nil || !strings.Contains(fmt.Sprint(rec["err"]), path+inexactMsg) {
		t.Errorf("vetoed reload logged as %v, want an error at %s", rec, path+inexactMsg)
	}
	if got := ask(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("alice over her limit after the vetoed reload: %v, want OVER_LIMIT", got)
	}
}

// TestRequestCapsOverGRPC checks that a call beyond decide's caps is
// answered InvalidArgument naming the cap: 60,000 descriptors in one call.
func TestRequestCapsOverGRPC(t *testing.T) {
	t.Parallel()
	s := startServer(t, testConfig(exampleRules))
	descs := make([]*ratelimitv3.RateLimitDescriptor, 60000)
	for i := range descs {
		descs[i] = descriptor("user", fmt.Sprint("u", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: descs})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "60000 descriptors, more than the cap of 64") {
		t.Fatalf("60,000 descriptors: %v, want InvalidArgument naming the cap", err)
	}
}
