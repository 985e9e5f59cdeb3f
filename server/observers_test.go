package server

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestObserversSeeEveryDecision pins what the watchers of a decision
// report for one sequence of gRPC decisions under global shadow mode and
// tracing: the answers (shadow), sluice_decisions_total and the other
// decision metrics, the store's timings, the heavy hitters and the spans.
// The same figures held when metrics, heavy hitters, tracing and shadow
// were decorators around decide (issue 34): the observers see exactly what
// the decorators counted.
func TestObserversSeeEveryDecision(t *testing.T) {
	t.Parallel()
	col, addr := startCollector(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), dashboardRules) // user: 5 a minute
	c := testConfig(dir)
	c.Shadow = true
	c.Tracing.Endpoint, c.Tracing.ServiceName = "http://"+addr, "rls"
	s := startServer(t, c)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	const n = 8 // 5 admitted, 3 over the limit in shadow
	for i := range n {
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "mallory")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("decision %d: %v, want OK (global shadow)", i, resp.GetOverallCode())
		}
		if st := resp.GetStatuses(); len(st) != 1 || st[0].GetCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("decision %d: statuses %v, want one OK", i, st)
		}
	}
	if _, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "nowhere",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "mallory")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no descriptors: %v, want InvalidArgument", err)
	}

	// The decision metrics, the store's and the mode.
	body := s.do(t, "GET", "/metrics", "").body
	for _, want := range []string{
		`sluice_decisions_total{descriptor="api.user",domain="api",result="ok"} 5`,
		`sluice_decisions_total{descriptor="api.user",domain="api",result="shadow_over_limit"} 3`,
		`sluice_unknown_domain_requests_total 1`,
		`sluice_invalid_requests_total 1`,
		fmt.Sprintf(`sluice_store_duration_seconds_count{op="take_all"} %d`, n),
		`sluice_mode{mode="store"} 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `result="over_limit"} `) && !strings.Contains(body, `result="over_limit"} 0`) {
		t.Errorf("/metrics counts an over_limit under global shadow")
	}

	// The heavy hitters: mallory's 8 requests, 3 of them denials.
	for by, want := range map[string]uint64{"requests": n, "denied": 3} {
		r := s.do(t, "GET", "/v1/top?domain=api&key=user&by="+by, "")
		var top struct {
			Clients []struct {
				Value string
				Count uint64
			}
		}
		if err := json.Unmarshal([]byte(r.body), &top); err != nil || r.code != 200 {
			t.Fatalf("/v1/top: %d %s", r.code, r.body)
		}
		if len(top.Clients) != 1 || top.Clients[0].Value != "mallory" || top.Clients[0].Count != want {
			t.Errorf("/v1/top by %s: %s, want mallory %d", by, r.body, want)
		}
	}

	// The spans: one per decision (the invalid one with an error status),
	// and one store call under each decision that reached the store.
	if err := s.stop(); err != nil { // flushes the spans
		t.Fatal(err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	decisions, errs := map[string]bool{}, 0
	for _, sp := range col.spans {
		if sp.GetName() == "sluice.decide" {
			decisions[string(sp.GetSpanId())] = true
			if sp.GetStatus().GetCode() == 2 { // STATUS_CODE_ERROR
				errs++
			}
		}
	}
	stores := 0
	for _, sp := range col.spans {
		if sp.GetName() == "sluice.store.take_all" {
			stores++
			if !decisions[string(sp.GetParentSpanId())] {
				t.Errorf("a store span outside every decision's span")
			}
		}
	}
	if len(decisions) != n+2 || errs != 1 || stores != n {
		t.Errorf("%d decision spans (%d with an error), %d store spans; want %d (1), %d", len(decisions), errs, stores, n+2, n)
	}
}
