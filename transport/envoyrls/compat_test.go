package envoyrls

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/memory"
)

// compatRules are the rules of TestEnvoyCompat.
const compatRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: partner
    rate_limit: {unlimited: true}
  - key: path
    value: /shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: "t*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// realServer returns a client of a Server on a real decide.Service with
// rules yaml and a memory store, both on a fake clock at the start of a
// day.
func realServer(t *testing.T, yaml string) (rlsv3.RateLimitServiceClient, *clocktest.Clock) {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktest.New(time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC))
	mcfg := memory.DefaultConfig()
	mcfg.Now = clk.Now
	store, err := memory.New(mcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	svc, err := decide.New(decide.Config{
		Rules:  func() *rules.Set { return set },
		Store:  store,
		Now:    clk.Now,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return rlsv3.NewRateLimitServiceClient(serve(t, New(svc, Config{}))), clk
}

// withLimit returns d with Envoy's limit override of rpu a unit.
func withLimit(d *ratelimitv3.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

// TestEnvoyCompat checks, through the gRPC server on a real decision
// service, what Envoy's ratelimit answers that sluice answers the same:
// a descriptor's own limit, the remaining count of an unlimited descriptor,
// and requests decide once refused.
func TestEnvoyCompat(t *testing.T) {
	t.Parallel()
	client, _ := realServer(t, compatRules)
	ctx := context.Background()
	call := func(t *testing.T, domain string, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	codes := func(resp *rlsv3.RateLimitResponse) string {
		var b strings.Builder
		b.WriteString(resp.OverallCode.String())
		for _, st := range resp.Statuses {
			b.WriteString(" " + st.Code.String())
		}
		return b.String()
	}

	t.Run("override takes the rules' place", func(t *testing.T) {
		for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
			resp := call(t, "api", withLimit(desc("user", "alice"), 2, typev3.RateLimitUnit_MINUTE))
			if resp.OverallCode != want {
				t.Fatalf("call %d: %s, want %s", i, codes(resp), want)
			}
			cl := resp.Statuses[0].CurrentLimit
			if cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
				t.Errorf("call %d: current_limit %v, want 2 a minute", i, cl)
			}
		}
		// Same unit, so the rules' 5 a minute counts in the same counter,
		// as Envoy's key (domain, entries, window) is the same: 2 taken.
		resp := call(t, "api", desc("user", "alice"))
		if st := resp.Statuses[0]; resp.OverallCode != ok || st.LimitRemaining != 2 || st.CurrentLimit.GetRequestsPerUnit() != 5 {
			t.Errorf("without the override: %s, remaining %d of %d; want OK, 2 of 5", codes(resp), st.LimitRemaining, st.CurrentLimit.GetRequestsPerUnit())
		}
		// Another unit is another window: a counter of its own.
		resp = call(t, "api", withLimit(desc("user", "alice"), 10, typev3.RateLimitUnit_HOUR))
		if st := resp.Statuses[0]; resp.OverallCode != ok || st.LimitRemaining != 9 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("hourly override: %s, %v remaining %d; want OK, 10 an hour, 9", codes(resp), st.CurrentLimit, st.LimitRemaining)
		}
	})
	t.Run("override of a descriptor no rule matches", func(t *testing.T) {
		for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
			resp := call(t, "api", withLimit(desc("region", "eu", "zone", "a"), 1, typev3.RateLimitUnit_SECOND))
			if resp.OverallCode != want || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
				t.Fatalf("call %d: %s %v, want %s with 1 a second", i, codes(resp), resp.Statuses[0].CurrentLimit, want)
			}
		}
		// Each value counts on its own.
		if resp := call(t, "api", withLimit(desc("region", "eu", "zone", "b"), 1, typev3.RateLimitUnit_SECOND)); resp.OverallCode != ok {
			t.Errorf("another value: %s, want OK", codes(resp))
		}
	})
	t.Run("override of a descriptor without entries", func(t *testing.T) {
		d := withLimit(&ratelimitv3.RateLimitDescriptor{}, 1, typev3.RateLimitUnit_MINUTE)
		if resp := call(t, "api", d); resp.OverallCode != ok {
			t.Fatalf("first: %s, want OK", codes(resp))
		}
		if resp := call(t, "api", d); resp.OverallCode != over {
			t.Fatalf("second: %s, want OVER_LIMIT", codes(resp))
		}
	})
	t.Run("override in an unknown domain", func(t *testing.T) {
		for range 3 {
			resp := call(t, "nowhere", withLimit(desc("user", "alice"), 1, typev3.RateLimitUnit_MINUTE))
			if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
				t.Fatalf("%s %v, want OK without a limit", codes(resp), resp.Statuses[0].CurrentLimit)
			}
		}
	})
	t.Run("override of 0 blocks", func(t *testing.T) {
		resp := call(t, "api", withLimit(desc("user", "carol"), 0, typev3.RateLimitUnit_MINUTE))
		if resp.OverallCode != over {
			t.Fatalf("%s, want OVER_LIMIT", codes(resp))
		}
	})
	t.Run("override ignores shadow mode", func(t *testing.T) {
		// Envoy's ratelimit builds the override's limit without shadow
		// mode, whatever the rule says.
		d := withLimit(desc("path", "/shadow"), 1, typev3.RateLimitUnit_MINUTE)
		if resp := call(t, "api", d); resp.OverallCode != ok {
			t.Fatalf("first: %s, want OK", codes(resp))
		}
		if resp := call(t, "api", d); resp.OverallCode != over {
			t.Fatalf("second: %s, want OVER_LIMIT", codes(resp))
		}
	})
	t.Run("override counts each value of a shared threshold", func(t *testing.T) {
		for _, v := range []string{"t1", "t2", "t3", "t4"} {
			if resp := call(t, "api", withLimit(desc("tenant", v), 1, typev3.RateLimitUnit_MINUTE)); resp.OverallCode != ok {
				t.Fatalf("tenant %s: %s, want OK (a counter per value)", v, codes(resp))
			}
		}
	})
	t.Run("unlimited", func(t *testing.T) {
		resp := call(t, "api", desc("partner", "p1"), desc("user", "dave"))
		st := resp.Statuses[0]
		if st.Code != ok || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil || st.DurationUntilReset != nil {
			t.Errorf("many: unlimited status %v, want OK, limit_remaining 4294967295, no limit or reset", st)
		}
		resp = call(t, "api", desc("partner", "p1"))
		st = resp.Statuses[0]
		if st.Code != ok || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
			t.Errorf("one: unlimited status %v, want OK, limit_remaining 4294967295, no limit", st)
		}
		// A descriptor no rule matches has nothing remaining, as in Envoy.
		if st := call(t, "api", desc("other", "x")).Statuses[0]; st.LimitRemaining != 0 {
			t.Errorf("unmatched: limit_remaining %d, want 0", st.LimitRemaining)
		}
	})
	t.Run("descriptor without entries", func(t *testing.T) {
		resp := call(t, "api", &ratelimitv3.RateLimitDescriptor{}, desc("user", "erin"))
		if got := codes(resp); got != "OK OK OK" {
			t.Errorf("%s, want OK OK OK", got)
		}
	})
	t.Run("empty key", func(t *testing.T) {
		resp := call(t, "api", desc("", "x"), desc("user", "", "", "y"))
		if got := codes(resp); got != "OK OK OK" {
			t.Errorf("%s, want OK OK OK", got)
		}
	})
	t.Run("negative hits", func(t *testing.T) {
		d := desc("user", "frank")
		d.IsNegativeHits = true
		d.HitsAddend = wrapperspb.UInt64(3)
		resp := call(t, "api", d)
		if st := resp.Statuses[0]; resp.OverallCode != ok || st.LimitRemaining != 5 {
			t.Errorf("%s remaining %d, want OK with 5 remaining (checked, not counted)", codes(resp), st.LimitRemaining)
		}
	})
}

// TestEnvoyCompatRefused checks what is still refused, with
// InvalidArgument: what Envoy's ratelimit cannot answer either, and the
// caps on a request.
func TestEnvoyCompatRefused(t *testing.T) {
	t.Parallel()
	client, _ := realServer(t, compatRules)
	many := make([]*ratelimitv3.RateLimitDescriptor, 65)
	for i := range many {
		many[i] = desc("user", "u")
	}
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "a")}}, "no domain"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}, "no descriptors"},
		{"unknown unit", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			withLimit(desc("user", "a"), 1, typev3.RateLimitUnit_UNKNOWN)}}, "descriptors[0].limit.unit: UNKNOWN"},
		{"undefined unit", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			withLimit(desc("user", "a"), 1, 99)}}, "descriptors[0].limit.unit"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many}, "65 descriptors"},
		{"long value", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("user", strings.Repeat("v", 4097))}}, "value of 4097 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err %v, want InvalidArgument containing %q", err, tc.msg)
			}
		})
	}
}
