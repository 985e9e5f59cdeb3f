package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestBlockLimit: a requests_per_unit: 0 limit (Envoy's way to block)
// denies every request with no Retry-After, since no wait lets one pass
// (it said Retry-After: 60 for a minute's), and Envoy's
// duration_until_reset, the window's end, as Envoy's ratelimit answers;
// serve warns of it at start, as `sluice check` does (issue 35).
func TestBlockLimit(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("domain: api\ndescriptors:\n  - key: user\n    value: mallory\n    rate_limit: {unit: minute, requests_per_unit: 0}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, testConfig(path))
	if rec := s.logs.FindFunc("rules warning", func(rec map[string]any) bool {
		w, _ := rec["warning"].(string)
		return rec["level"] == "WARN" && strings.Contains(w, "rules.yaml:5") && strings.Contains(w, "requests_per_unit: 0 denies every request of api.user_mallory")
	}); rec == nil {
		t.Errorf("no warning at start of the limit that denies every request; logs:\n%s", s.logs)
	}

	for _, path := range []string{"/json", "/v1/decide"} {
		r := s.do(t, "POST", path, `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"mallory"}]}]}`)
		if path == "/json" && r.code != http.StatusTooManyRequests {
			t.Errorf("POST %s for mallory: %d, want 429", path, r.code)
		}
		if got := r.header.Get("Retry-After"); got != "" {
			t.Errorf("POST %s for mallory: Retry-After %q, want none: no wait lets the request pass", path, got)
		}
		if strings.Contains(r.body, `"Retry-After"`) {
			t.Errorf("POST %s for mallory: the headers to add name Retry-After: %s", path, r.body)
		}
		if got := r.header.Get("X-RateLimit-Limit"); path == "/json" && got != "0" {
			t.Errorf("POST %s for mallory: X-RateLimit-Limit %q, want 0", path, got)
		}
	}
	// Another user's denial still says when to come back.
	for range 5 {
		s.do(t, "POST", "/json", `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`)
	}
	if r := s.do(t, "POST", "/json", `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`); r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Errorf("alice's sixth: %d, Retry-After %q; want 429 with one", r.code, r.header.Get("Retry-After"))
	}

	resp, err := s.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "mallory")}})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset().AsDuration() <= 0 || st.GetDurationUntilReset().AsDuration() > 60e9 {
		t.Errorf("gRPC for mallory: %v, duration_until_reset %v; want OVER_LIMIT and the window's end (0, 60s]", resp.GetOverallCode(), st.GetDurationUntilReset().AsDuration())
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), "Retry-After") {
			t.Errorf("gRPC for mallory: Retry-After %q among the headers to add, want none", h.GetValue())
		}
	}
}
