package server

import (
	"context"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testenv"
)

// xdsNode is the node id the tests' servers send, as Envoy Gateway names its
// rate limit Deployment.
const xdsNode = "envoy-gateway-system/envoy-ratelimit"

// xdsConfig is testConfig for rules from the management server x.
func xdsConfig(x *testenv.XDS) Config {
	c := testConfig("xds://" + x.Addr)
	c.Rules.XDS.Node = xdsNode
	c.Rules.XDS.RetryInitial, c.Rules.XDS.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	return c
}

// askUser asks s for one hit of user=alice in domain, returning the
// response.
func (s *testServer) askUser(t testing.TB, domain string) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "alice")}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestServeXDSRules runs a server on rules from a management server built
// as Envoy Gateway's: not ready until the first rules, then deciding by
// them; a push that leaves a limit unchanged keeps its counts; /v1/rules
// and /rlconfig say where the rules came from.
func TestServeXDSRules(t *testing.T) {
	if nearMidnight(time.Minute) {
		t.Skip("too close to a UTC day boundary for the daily limits counted here")
	}
	x := testenv.NewXDS(t, "")
	c := xdsConfig(x)
	c.OpsAddrs = []string{"127.0.0.1:0"} // Envoy's debug port, with /rlconfig
	s := startServer(t, c)

	if r := s.do(t, "GET", "/readyz", ""); r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "no rules from the xDS server") {
		t.Fatalf("/readyz before the first rules: %d %s", r.code, r.body)
	}
	eventually(t, "/readyz naming the node the server has no rules for", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, "connected; no rules for node "+xdsNode)
	})
	x.Push(xdsNode, "1", testenv.RateLimitConfig("api", "user", 10, rlconf.RateLimitUnit_DAY))
	eventually(t, "ready once the rules came", func() bool { return s.do(t, "GET", "/readyz", "").code == http.StatusOK })
	for i := range 3 {
		if got := s.askUser(t, "api").Statuses[0].LimitRemaining; got != uint32(9-i) {
			t.Fatalf("hit %d: remaining %d, want %d", i+1, got, 9-i)
		}
	}

	// A new domain beside api, whose limit is unchanged: its counts stay.
	x.Push(xdsNode, "2", testenv.RateLimitConfig("api", "user", 10, rlconf.RateLimitUnit_DAY),
		testenv.RateLimitConfig("ai", "user", 1000, rlconf.RateLimitUnit_MINUTE))
	eventually(t, "the new domain deciding", func() bool {
		st := s.askUser(t, "ai").Statuses
		return len(st) == 1 && st[0].GetCurrentLimit().GetRequestsPerUnit() == 1000
	})
	if got := s.askUser(t, "api").Statuses[0].LimitRemaining; got != 6 {
		t.Fatalf("after a push that left api's limit alone: remaining %d, want 6 (counts kept)", got)
	}
	if r := s.do(t, "GET", "/v1/rules", ""); !strings.Contains(r.body, `"origin":{"source":"xds://`+x.Addr+`","version":"2"}`) {
		t.Errorf("/v1/rules says nothing of the xDS server: %s", r.body)
	}
	resp, err := s.http.Get("http://" + s.srv.OpsAddrs()[0] + "/rlconfig")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(body), "# rules from xds://"+x.Addr+", version 2 acknowledged") {
		t.Errorf("/rlconfig: %v %s", err, body)
	}

	// A refused push keeps the rules and their counts.
	x.Push(xdsNode, "3", testenv.RateLimitConfig("api", "user", 10, rlconf.RateLimitUnit_UNKNOWN))
	eventually(t, "the refusal logged", func() bool { return s.logs.Find("xDS rules refused; the rules in force stay") != nil })
	if got := s.askUser(t, "api").Statuses[0].LimitRemaining; got != 5 {
		t.Fatalf("after a refused push: remaining %d, want 5", got)
	}
	if rec := s.logs.Find("xDS rules refused; the rules in force stay"); !strings.Contains(rec["err"].(string), `resource "api"`) {
		t.Errorf("the refusal's log names no resource: %v", rec)
	}
}

// TestServeXDSStartWithoutRules checks Envoy's
// FORCE_START_WITHOUT_INITIAL_CONFIG=true: ready at once, every request
// unlimited until rules come.
func TestServeXDSStartWithoutRules(t *testing.T) {
	x := testenv.NewXDS(t, "")
	c := xdsConfig(x)
	c.Rules.XDS.StartWithoutRules = true
	s := startServer(t, c)
	if r := s.do(t, "GET", "/readyz", ""); r.code != http.StatusOK {
		t.Fatalf("/readyz without rules: %d %s", r.code, r.body)
	}
	if resp := s.askUser(t, "api"); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("without rules: %v, want OK", resp.OverallCode)
	}
}

// TestServeXDSRefuses checks the settings of rules from xDS that New
// refuses.
func TestServeXDSRefuses(t *testing.T) {
	c := testConfig("xds://")
	wantConfigError(t, c, "want xds://HOST:PORT")
	c = testConfig("xds://h:1")
	c.Rules.XDS.CA = "/ca.crt"
	wantConfigError(t, c, "--rules-xds-tls")
	c = testConfig("xds://h:1")
	c.Admin.Tokens = "/tokens"
	wantConfigError(t, c, "--admin-tokens: rules from an xDS server change there")
}

// BenchmarkXDSPushToDecision measures the time from a snapshot's push to
// the first decision by its limit, over b.N pushes that each change the
// limit, and reports its p50 and p99 (go test -run X -bench
// XDSPushToDecision -benchtime 100x ./server/).
func BenchmarkXDSPushToDecision(b *testing.B) {
	x := testenv.NewXDS(b, "")
	s := startServerB(b, xdsConfig(x))
	x.Push(xdsNode, "0", testenv.RateLimitConfig("api", "user", 1000, rlconf.RateLimitUnit_DAY))
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		want := uint32(1000 + i)
		start := time.Now()
		x.Push(xdsNode, strconv.Itoa(i), testenv.RateLimitConfig("api", "user", want, rlconf.RateLimitUnit_DAY))
		for {
			st := s.askUser(b, "api").Statuses
			if len(st) == 1 && st[0].GetCurrentLimit().GetRequestsPerUnit() == want {
				break
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// startServerB runs the Server of c for a benchmark, with a gRPC client.
func startServerB(b *testing.B, c Config) *testServer {
	b.Helper()
	srv, logs, err := newServer(c)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &testServer{srv: srv, logs: logs, cancel: cancel, done: make(chan error, 1), grpcAddr: srv.GRPCAddr()}
	go func() { s.done <- srv.Run(ctx) }()
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	s.conn, s.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	b.Cleanup(func() {
		conn.Close() //nolint:errcheck // the test is over
		if err := s.stop(); err != nil {
			b.Error(err)
		}
	})
	return s
}
