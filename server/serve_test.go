package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// TestGRPCAsEnvoy calls the example rules' per-key daily limit (10,000 a
// day) the way Envoy does and follows its counter down to OVER_LIMIT.
func TestGRPCAsEnvoy(t *testing.T) {
	if nearMidnight(time.Minute) {
		t.Skip("the daily window resets within a minute")
	}
	s := startServer(t, testConfig(exampleRules))
	ctx := context.Background()
	key := func(v string) []*ratelimitv3.RateLimitDescriptor {
		return []*ratelimitv3.RateLimitDescriptor{descriptor("api_key", v)}
	}
	type step struct {
		name      string
		req       *rlsv3.RateLimitRequest
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}
	steps := []step{
		{"request hits_addend 9998", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: key("k1"), HitsAddend: 9998}, rlsv3.RateLimitResponse_OK, 2},
		{"unset hits_addend counts 1", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: key("k1")}, rlsv3.RateLimitResponse_OK, 1},
		{"descriptor hits_addend 0 only checks", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{hits(descriptor("api_key", "k1"), 0)}, HitsAddend: 7}, rlsv3.RateLimitResponse_OK, 1},
		{"2 hits with 1 left is over the limit", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: key("k1"), HitsAddend: 2}, rlsv3.RateLimitResponse_OVER_LIMIT, 1},
		{"descriptor hits_addend overrides the request's", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{hits(descriptor("api_key", "k1"), 1)}, HitsAddend: 5}, rlsv3.RateLimitResponse_OK, 0},
		{"then nothing passes", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: key("k1")}, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
	}
	for _, st := range steps {
		resp, err := s.rls.ShouldRateLimit(ctx, st.req)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if resp.OverallCode != st.code || len(resp.Statuses) != 1 || resp.Statuses[0].Code != st.code {
			t.Fatalf("%s: %v, want overall and status %v", st.name, resp, st.code)
		}
		ds := resp.Statuses[0]
		if ds.LimitRemaining != st.remaining {
			t.Errorf("%s: limit_remaining %d, want %d", st.name, ds.LimitRemaining, st.remaining)
		}
		want := &rlsv3.RateLimitResponse_RateLimit{Name: "per-key-daily", RequestsPerUnit: 10000, Unit: rlsv3.RateLimitResponse_RateLimit_DAY}
		if !proto.Equal(ds.CurrentLimit, want) {
			t.Errorf("%s: current_limit %v, want %v", st.name, ds.CurrentLimit, want)
		}
		reset := ds.DurationUntilReset.AsDuration()
		if reset <= 0 || reset > 24*time.Hour {
			t.Errorf("%s: duration_until_reset %v, want within the day", st.name, reset)
		}
		secs := strconv.FormatInt(int64((reset+time.Second-1)/time.Second), 10)
		wantHeaders := map[string]string{
			"RateLimit-Policy":      `"per-key-daily";q=10000;w=86400`,
			"X-RateLimit-Limit":     "10000",
			"X-RateLimit-Remaining": strconv.Itoa(int(st.remaining)),
		}
		for k, v := range wantHeaders {
			if got := header(resp, k); got != v {
				t.Errorf("%s: header %s %q, want %q", st.name, k, got, v)
			}
		}
		// The reset is rounded up to whole seconds; allow a second's drift
		// between the header and the duration computed a moment apart.
		if got := header(resp, "X-RateLimit-Reset"); got != secs && got != strconv.Itoa(mustAtoi(t, secs)+1) {
			t.Errorf("%s: X-RateLimit-Reset %q, want %s", st.name, got, secs)
		}
		if got := header(resp, "RateLimit"); !strings.HasPrefix(got, fmt.Sprintf(`"per-key-daily";r=%d;t=`, st.remaining)) {
			t.Errorf("%s: RateLimit %q", st.name, got)
		}
		retry := header(resp, "Retry-After")
		if (retry != "") != (st.code == rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Errorf("%s: Retry-After %q on %v", st.name, retry, st.code)
		}
		if retry != "" && mustAtoi(t, retry) < mustAtoi(t, secs)-1 {
			t.Errorf("%s: Retry-After %s before the window resets in %s s", st.name, retry, secs)
		}
	}

	t.Run("several descriptors", func(t *testing.T) {
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("api_key", "k2"), descriptor("api_key", "k2", "plan", "free"), descriptor("no_such_key", "x"),
		}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 3 {
			t.Fatalf("%v, want OK with 3 statuses", resp)
		}
		if got := resp.Statuses[1].CurrentLimit; got.GetName() != "free-plan" || got.GetRequestsPerUnit() != 10 || got.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("second status's limit %v, want free-plan 10/MINUTE", got)
		}
		if got := resp.Statuses[2]; got.Code != rlsv3.RateLimitResponse_OK || got.CurrentLimit != nil {
			t.Errorf("unmatched descriptor's status %v, want OK without a limit", got)
		}
	})

	t.Run("shadow mode answers OK and sends no headers for it", func(t *testing.T) {
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 500, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("user", "shadowed", "path", "/export"),
		}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].GetCurrentLimit().GetName() != "export-daily" {
			t.Errorf("%v, want OK under export-daily", resp)
		}
		if len(resp.ResponseHeadersToAdd) != 0 {
			t.Errorf("headers %v for a shadow limit, want none", resp.ResponseHeadersToAdd)
		}
	})

	t.Run("unknown domain is OK without limits", func(t *testing.T) {
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: key("k3")})
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("%v, want OK without a limit", resp)
		}
	})

	invalid := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: key("k1")}, "domain"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}, "descriptors"},
		{"limit in no unit", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: descriptor("api_key", "k1").Entries,
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}}, "descriptors[0].limit.unit: UNKNOWN"},
	}
	for _, tt := range invalid {
		t.Run("InvalidArgument/"+tt.name, func(t *testing.T) {
			_, err := s.rls.ShouldRateLimit(ctx, tt.req)
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.msg) {
				t.Errorf("error %v, want InvalidArgument mentioning %s", err, tt.msg)
			}
		})
	}

	t.Run("health", func(t *testing.T) {
		hc := healthpb.NewHealthClient(s.conn)
		for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("Check(%q) = %v, %v; want SERVING", svc, resp, err)
			}
		}
	})
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}

// TestHTTPAPI checks that the HTTP API answers as the gRPC API does, from
// the same counters, and its other routes.
func TestHTTPAPI(t *testing.T) {
	if nearMidnight(time.Minute) {
		t.Skip("the daily window resets within a minute")
	}
	s := startServer(t, testConfig(exampleRules))
	ctx := context.Background()

	r := s.do(t, "POST", "/v1/decide", `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"h1"}]}],"hitsAddend":9999}`)
	if r.code != 200 || r.header.Get("X-RateLimit-Remaining") != "1" || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("first decide: %d %v %s", r.code, r.header, r.body)
	}
	var viaHTTP rlsv3.RateLimitResponse
	if err := protojson.Unmarshal([]byte(r.body), &viaHTTP); err != nil {
		t.Fatalf("answer is not a RateLimitResponse: %v\n%s", err, r.body)
	}
	// The same counter, checked over gRPC without counting.
	viaGRPC, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{hits(descriptor("api_key", "h1"), 0)}})
	if err != nil {
		t.Fatal(err)
	}
	if viaHTTP.OverallCode != viaGRPC.OverallCode || viaHTTP.Statuses[0].LimitRemaining != 1 || viaGRPC.Statuses[0].LimitRemaining != 1 ||
		!proto.Equal(viaHTTP.Statuses[0].CurrentLimit, viaGRPC.Statuses[0].CurrentLimit) {
		t.Errorf("HTTP answered %v, gRPC %v; want the same verdict and limit, 1 remaining", &viaHTTP, viaGRPC)
	}

	over := `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"h1"}]}],"hitsAddend":2}`
	tests := []struct {
		name     string
		method   string
		path     string
		body     string
		code     int
		contains []string
		header   string // a header that must be present
	}{
		{"over the limit on /v1/decide is 200", "POST", "/v1/decide", over, 200, []string{`"overallCode":"OVER_LIMIT"`}, "Retry-After"},
		{"over the limit on /json is 429", "POST", "/json", over, 429, []string{`"overallCode":"OVER_LIMIT"`, `"code":"OVER_LIMIT"`}, "Retry-After"},
		{"within the limit on /json is 200", "POST", "/json", `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"h2"}]}]}`, 200, []string{`"overallCode":"OK"`, `"limitRemaining":9999`}, "RateLimit"},
		{"malformed JSON", "POST", "/v1/decide", `{"domain":"api",`, 400, []string{`"error":"decode RateLimitRequest`}, ""},
		{"unknown field", "POST", "/v1/decide", `{"domain":"api","descriptor":[]}`, 400, []string{`descriptor`}, ""},
		{"empty key", "POST", "/json", `{"domain":"api","descriptors":[{"entries":[{"key":""}]}]}`, 200, []string{`"overallCode":"OK"`}, ""},
		{"no domain", "POST", "/json", `{"descriptors":[{"entries":[{"key":"api_key"}]}]}`, 400, []string{`"error":"invalid request: no domain"`}, ""},
		{"body over 1 MiB", "POST", "/v1/decide", `{"domain":"` + strings.Repeat("a", 1<<20) + `"}`, 413, []string{`body larger than`}, ""},
		{"wrong method", "GET", "/v1/decide", "", 405, nil, "Allow"},
		{"healthz", "GET", "/healthz", "", 200, []string{`"ok"`}, ""},
		{"readyz", "GET", "/readyz", "", 200, []string{`"status":"ready"`, `"mode":"store"`}, ""},
		{"rules in force", "GET", "/v1/rules", "", 200, []string{`"name":"send-per-5min"`, `"unit_multiplier":5`, `"algorithm":"sliding_window"`, `"domain":"api"`}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := s.do(t, tt.method, tt.path, tt.body)
			if r.code != tt.code {
				t.Fatalf("status %d, want %d: %s", r.code, tt.code, r.body)
			}
			for _, c := range tt.contains {
				if !strings.Contains(r.body, c) {
					t.Errorf("body %.300s does not contain %s", r.body, c)
				}
			}
			if tt.header != "" && r.header.Get(tt.header) == "" {
				t.Errorf("no %s header in %v", tt.header, r.header)
			}
		})
	}

	t.Run("metrics", func(t *testing.T) {
		r := s.do(t, "GET", "/metrics", "")
		for _, c := range []string{
			`sluice_decisions_total{descriptor="api.api_key",domain="api",result="ok"} 3`,
			`sluice_decisions_total{descriptor="api.api_key",domain="api",result="over_limit"} 2`,
			`sluice_rules_reloads_total{result="success"} 1`,
			`sluice_invalid_requests_total 1`,
			`sluice_store_duration_seconds_count`,
			`go_goroutines`,
		} {
			if !strings.Contains(r.body, c) {
				t.Errorf("metrics do not contain %s", c)
			}
		}
	})
}

// TestHotReload edits the rules under a running server: a good edit takes
// effect, a broken one is logged and counted while the old rules keep
// answering, and no call fails meanwhile.
// TestUnknownDomainLogged: a request for a domain no rules define, which
// passes unlimited, is logged at WARN with the domain, once per domain.
func TestUnknownDomainLogged(t *testing.T) {
	s := startServer(t, testConfig(exampleRules))
	for _, d := range []string{"apl", "apl", "api"} {
		r := s.do(t, "POST", "/v1/decide", `{"domain":"`+d+`","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`)
		if r.code != 200 {
			t.Fatalf("%s: %d %s", d, r.code, r.body)
		}
	}
	const msg = "unknown domain: no rules define it, so its requests pass unlimited (logged once)"
	n := strings.Count(s.logs.String(), msg)
	rec := s.logs.Find(msg)
	if n != 1 || rec == nil || rec["domain"] != "apl" || rec["level"] != "WARN" {
		t.Errorf("%d lines %q, first %v; want one at WARN for domain apl", n, msg, rec)
	}
}

func TestHotReload(t *testing.T) {
	if nearMidnight(time.Minute) {
		t.Skip("the daily window resets within a minute")
	}
	const rulesAt = `domain: api
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: day, requests_per_unit: %d}
`
	path := copyRules(t, exampleRules)
	writeFile(t, path, fmt.Sprintf(rulesAt, 100))
	s := startServer(t, testConfig(path))
	ctx := context.Background()
	limitNow := func() uint32 {
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{hits(descriptor("api_key", "r1"), 0)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limitNow(); got != 100 {
		t.Fatalf("limit %d before the edit, want 100", got)
	}

	// Callers keep calling through both reloads; none may fail.
	var calls, failures atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("api_key", "busy")}})
			calls.Add(1)
			if err != nil {
				failures.Add(1)
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
		if calls.Load() == 0 || failures.Load() != 0 {
			t.Errorf("%d of %d calls during the reloads failed", failures.Load(), calls.Load())
		}
	}()

	writeFile(t, path, fmt.Sprintf(rulesAt, 5))
	eventually(t, "the edited limit answers", func() bool { return limitNow() == 5 })
	if s.logs.Find("rules reloaded") == nil {
		t.Errorf("no reload logged:\n%s", s.logs)
	}

	writeFile(t, path, "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	eventually(t, "the failed reload is counted", func() bool {
		return strings.Contains(s.do(t, "GET", "/metrics", "").body, `sluice_rules_reloads_total{result="failure"} 1`)
	})
	if got := limitNow(); got != 5 {
		t.Errorf("limit %d after a broken edit, want the 5 in force", got)
	}
	rec := s.logs.Find("rules reload failed; the rules in force stay")
	if rec == nil || !strings.Contains(fmt.Sprint(rec["err"]), "rules.yaml:4: ") {
		t.Errorf("broken edit logged as %v, want an error at rules.yaml:4", rec)
	}
	if r := s.do(t, "GET", "/readyz", ""); r.code != 200 {
		t.Errorf("readyz %d after a broken edit, want 200", r.code)
	}
}

// TestShutdownFinishesInFlight cancels the server (as SIGTERM does) while
// an HTTP call is half sent, and checks that the call still gets its
// answer, new connections are refused, and serve returns cleanly.
func TestShutdownFinishesInFlight(t *testing.T) {
	s := startServer(t, testConfig(exampleRules))
	addr := strings.TrimPrefix(s.httpURL, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.1"}]}]}`
	half := len(body) / 2
	// With Expect: 100-continue the server says 100 Continue once its
	// handler reads the body: then the call is in flight.
	fmt.Fprintf(conn, "POST /v1/decide HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:half])
	br := bufio.NewReader(conn)
	if cont, err := http.ReadResponse(br, nil); err != nil || cont.StatusCode != http.StatusContinue {
		t.Fatalf("before the body: %v, %v; want 100 Continue", cont, err)
	}

	s.cancel()
	eventually(t, "the listener closes", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-s.done:
		s.done <- err
		t.Fatalf("serve returned %v with a call in flight", err)
	default:
	}

	if _, err := conn.Write([]byte(body[half:])); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("in-flight call: %v", err)
	}
	defer resp.Body.Close()
	var out rlsv3.RateLimitResponse
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("in-flight call's body: %v", err)
	}
	if resp.StatusCode != 200 || protojson.Unmarshal(b, &out) != nil || out.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("in-flight call answered %d %s, want 200 OK", resp.StatusCode, b)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	for _, msg := range []string{"shutting down", "stopped"} {
		if s.logs.Find(msg) == nil {
			t.Errorf("no %q in the logs:\n%s", msg, s.logs)
		}
	}
}

// TestShadow checks Config.Shadow: over-limit requests are allowed and
// counted as shadow over-limit.
func TestShadow(t *testing.T) {
	t.Parallel()
	rules := writeTemp(t, "rules.yaml", "domain: api\ndescriptors:\n  - key: user\n    descriptors:\n      - key: path\n        value: /login\n        rate_limit: {unit: hour, requests_per_unit: 5}\n")
	c := testConfig(rules)
	c.Shadow, c.Envoy.Metrics = true, true
	s := startServer(t, c)
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"shadow-test"},{"key":"path","value":"/login"}]}]}`
	for i := 1; i <= 7; i++ { // 5 an hour
		if r := s.do(t, "POST", "/json", body); r.code != 200 {
			t.Fatalf("request %d: %d %s, want 200 in shadow mode", i, r.code, r.body)
		}
	}
	m := s.do(t, "GET", "/metrics", "")
	for _, want := range []string{
		`ratelimit_service_rate_limit_shadow_mode{domain="api",key1="user",key2="path_/login"} 2`,
		`sluice_decisions_total{descriptor="api.user.path_/login",domain="api",result="shadow_over_limit"} 2`,
	} {
		if !strings.Contains(m.body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
