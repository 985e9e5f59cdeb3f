package server

import (
	"context"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/testenv"
)

// TestServeStallDefaults runs sluice serve with every flag at its default
// (--fail local, the adaptive --store-timeout) on a Redis of its own, and
// stalls that Redis's host (SIGSTOP) while two clients of a limit of 100
// a day ask: one under its limit is never denied, one over it gets what
// Redis had left and no more than the bound (100 + 100/20 + 1 on one
// server), the calls left going on are counted by Redis once it resumes,
// and decisions go back to it, which counts every hit once.
func TestServeStallDefaults(t *testing.T) {
	t.Parallel()
	// A window that turns during the test starts its counts again: an
	// hour's would in about 1 run of 2,000 (1-2 s of 3,600).
	if nearMidnight(time.Minute) {
		t.Skip("the daily window resets within a minute")
	}
	r := testenv.StartRedis(t)
	rules := copyRules(t, exampleRules)
	writeFile(t, rules, "domain: stall\ndescriptors:\n  - key: client\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	c := testConfig(rules)
	c.Store.URL = "redis://" + r.Addr
	s := startServer(t, c)
	s.waitStore(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", s.logs)
		}
	})
	ask := func(client string, n int) (admitted int) {
		t.Helper()
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
				Domain: "stall", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("client", client)},
			})
			cancel()
			if err != nil {
				t.Fatalf("%s: %v", client, err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
		return admitted
	}
	if got := ask("under", 10) + ask("over", 60); got != 70 {
		t.Fatalf("%d of 70 admitted by a healthy Redis", got)
	}
	r.Pause()
	under, over := ask("under", 20), ask("over", 100)
	r.Resume()
	if under != 20 {
		t.Errorf("under its limit, Redis stalled: %d of 20 admitted, want all", under)
	}
	if bound := 100 + 100/20 + 1; 60+over > bound || 60+over < 100 {
		t.Errorf("over its limit, Redis stalled: %d admitted in all, want the limit of 100, at most %d", 60+over, bound)
	}
	eventually(t, "decisions from Redis again", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"mode":"store"`) && ask("probe", 1) == 1
	})
	eventually(t, "the over client denied by Redis", func() bool { return ask("over", 1) == 0 })
	// Its 30 hits counted once each: 70 more pass, the next does not.
	if got, next := ask("under", 70), ask("under", 1); got != 70 || next != 0 {
		t.Errorf("under, Redis back: %d of 70 admitted, then %d of 1; want 70, then none: each hit counted once", got, next)
	}
	if n := r.Do("DBSIZE"); n == "0" {
		t.Errorf("Redis holds no key")
	}
	// The hits admitted while Redis stalled that no call carried to it
	// were written back, each once.
	if n := metricValue(t, s, "sluice_servers"); n != 1 {
		t.Errorf("sluice_servers %d, want 1: the one server on this Redis", n)
	}
	if wb := metricValue(t, s, "sluice_written_back_hits_total"); wb < 1 || wb > under+over {
		t.Errorf("sluice_written_back_hits_total %d, want 1 to the %d hits admitted while Redis stalled", wb, under+over)
	}
	// The denials that waited for Redis are counted (metricValue fails the
	// test when a series is missing).
	held := metricValue(t, s, `sluice_held_denials_total{outcome="store"}`) + metricValue(t, s, `sluice_held_denials_total{outcome="local"}`)
	t.Logf("stalled: under %d of 20, over %d of 100 (60 before); %d denials waited for Redis", under, over, held)
}

// TestServeStopStoreDown: a server whose Redis went away, with hits it
// admitted locally that Redis never counted, stops without an error (sluice
// serve exited 1 on SIGTERM): it says at WARN how many it could not write
// back.
func TestServeStopStoreDown(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	rules := copyRules(t, exampleRules)
	writeFile(t, rules, "domain: down\ndescriptors:\n  - key: client\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	c := testConfig(rules)
	c.Store.URL = "redis://" + r.Addr
	s := startServer(t, c)
	s.waitStore(t)
	r.Kill()
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "down", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("client", "c")},
		})
		cancel()
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("with Redis down: %v, %v; want admitted locally", resp.GetOverallCode(), err)
		}
	}
	if err := s.stop(); err != nil {
		t.Fatalf("Run = %v with Redis down, want nil\nlogs:\n%s", err, s.logs)
	}
	if logs := s.logs.String(); !strings.Contains(logs, "could not be written back") || !strings.Contains(logs, `"hits":5`) {
		t.Errorf("logs lack the WARN of the 5 hits not written back:\n%s", logs)
	}
}
