package server

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/testenv"
)

// TestServeEnvoyRedisKeys checks a server with StoreConfig.EnvoyKeys on a real
// Redis: a counter Envoy's ratelimit wrote (its INCRBY and EXPIRE, under
// CACHE_KEY_PREFIX) is the one sluice counts in over gRPC, and sluice's
// hits are in Envoy's key.
func TestServeEnvoyRedisKeys(t *testing.T) {
	t.Parallel()
	if nearMidnight(time.Minute) {
		t.Skip("a day window may reset under the test")
	}
	addr := testenv.RedisAddr(t)
	domain := fmt.Sprintf("envoykeys%d", time.Now().UnixNano())
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: "+domain+"\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n")
	cfg := testConfig(path)
	cfg.Store.URL, cfg.StoreTimeout = "redis://"+addr, 10*time.Second // only a bound on a hang
	cfg.Store.EnvoyKeys, cfg.Store.EnvoyKeyPrefix = true, "pfx_"
	s := startServer(t, cfg)
	s.waitStore(t)

	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const day = 86400
	key := "pfx_" + domain + "_user_alice_" + strconv.FormatInt(time.Now().Unix()/day*day, 10)
	res := c.DoMulti(ctx, c.B().Incrby().Key(key).Increment(2).Build(), c.B().Expire().Key(key).Seconds(day).Build())
	if err := res[1].Error(); err != nil {
		t.Fatal(err)
	}
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "alice")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := ask(); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("after Envoy's 2 of 3: %v remaining %d, want OK, 0", resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}
	if resp := ask(); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th: %v, want OVER_LIMIT", resp.OverallCode)
	}
	n, err := c.Do(ctx, c.B().Get().Key(key).Build()).AsInt64()
	if err != nil || n != 4 {
		t.Errorf("Envoy's key holds %d (%v), want 4", n, err)
	}
	ttl, err := c.Do(ctx, c.B().Ttl().Key(key).Build()).AsInt64()
	if err != nil || ttl <= 0 || ttl > day {
		t.Errorf("TTL %d (%v), want within (0, %d]", ttl, err, day)
	}
}

func TestServeEnvoyRedisKeysMemory(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n")
	c := testConfig(path)
	c.Store.EnvoyKeys = true
	wantConfigError(t, c, "--envoy-redis-keys")
}

// TestJSONRequestLimit checks Envoy's /json endpoint with a descriptor's
// own limit, in protobuf's JSON: it takes the rules' place there as over
// gRPC, and an unlimited descriptor reports 4294967295 remaining.
func TestJSONRequestLimit(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: partner\n    rate_limit: {unlimited: true}\n")
	s := startServer(t, testConfig(path))
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}],"limit":{"requests_per_unit":1,"unit":"MINUTE"}}]}`
	if r := s.do(t, "POST", "/json", body); r.code != 200 || !strings.Contains(r.body, `"requestsPerUnit":1`) {
		t.Fatalf("first: %d %s, want 200 with the request's limit of 1", r.code, r.body)
	}
	if r := s.do(t, "POST", "/json", body); r.code != 429 || !strings.Contains(r.body, `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("second: %d %s, want 429 OVER_LIMIT", r.code, r.body)
	}
	r := s.do(t, "POST", "/json", `{"domain":"api","descriptors":[{"entries":[{"key":"partner","value":"p"}]},{}]}`)
	if r.code != 200 || !strings.Contains(r.body, `"limitRemaining":4294967295`) {
		t.Errorf("unlimited and empty: %d %s, want 200 with limitRemaining 4294967295", r.code, r.body)
	}
}

// TestServeEnvoyKeysRemainingInDenied: with Envoy's keys, a descriptor that
// passes inside a request another descriptor denies is counted in Redis,
// as Envoy's ratelimit counts it, and its limit_remaining says what Redis
// counted (it said one more: the hit given back, as sluice's own keys give
// it back) (issue 24.5).
func TestServeEnvoyKeysRemainingInDenied(t *testing.T) {
	t.Parallel()
	if nearMidnight(time.Minute) {
		t.Skip("a day window may reset under the test")
	}
	addr := testenv.RedisAddr(t)
	domain := fmt.Sprintf("envoyremaining%d", time.Now().UnixNano())
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: "+domain+"\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n"+
		"  - key: path\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
	cfg := testConfig(path)
	cfg.Store.URL, cfg.StoreTimeout = "redis://"+addr, 10*time.Second
	cfg.Store.EnvoyKeys = true
	s := startServer(t, cfg)
	s.waitStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "alice"), descriptor("path", "/login")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := ask(); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 99 {
		t.Fatalf("first: %v, user's remaining %d, want OK, 99", resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}
	resp := ask() // path's 1 a day denies; user's hit is counted, as Envoy's
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: %v, want OVER_LIMIT", resp.OverallCode)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := domain + "_user_alice_" + strconv.FormatInt(time.Now().Unix()/86400*86400, 10)
	n, err := c.Do(ctx, c.B().Get().Key(key).Build()).AsInt64()
	if err != nil || n != 2 {
		t.Fatalf("Envoy's key of user holds %d (%v), want 2", n, err)
	}
	if got := resp.Statuses[0].LimitRemaining; got != 98 {
		t.Errorf("user's limit_remaining in the denied request: %d, want 98, what Redis counted", got)
	}
}

// TestServeEnvoyKeysWeather: with Envoy's keys and the defaults (--fail
// local), a Redis that goes away and comes back empty gets, under Envoy's
// key, where Envoy's ratelimit servers sharing it read, both the count it
// lost (put back, merged by maximum) and the hits the server admitted
// without it (written back): before, both went under sluice's own key,
// which nothing reads, and the limit started again from nothing.
func TestServeEnvoyKeysWeather(t *testing.T) {
	t.Parallel()
	if nearMidnight(time.Minute) {
		t.Skip("a day window may reset under the test")
	}
	r := testenv.StartRedis(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "domain: wx\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	cfg := testConfig(path)
	cfg.Store.URL, cfg.Store.EnvoyKeys = "redis://"+r.Addr, true
	s := startServer(t, cfg)
	s.waitStore(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", s.logs)
		}
	})
	ask := func(n int) (admitted int) {
		t.Helper()
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "wx",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "alice")}})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
		return admitted
	}
	const day = 86400
	key := "wx_user_alice_" + strconv.FormatInt(time.Now().Unix()/day*day, 10)
	if got := ask(10); got != 10 { // a count of 10, which the ledger learns (over a twentieth of 100)
		t.Fatalf("%d of 10 admitted by Redis", got)
	}
	r.Kill()
	if got := ask(5); got != 5 {
		t.Fatalf("%d of 5 admitted without Redis, want all", got)
	}
	r.Restart()
	eventually(t, "Envoy's key holds the 10 put back and the 5 written back", func() bool {
		return strings.TrimSpace(r.CLI("GET", key)) == "15"
	})
	if n := metricValue(t, s, "sluice_written_back_hits_total"); n != 5 {
		t.Errorf("sluice_written_back_hits_total %d, want 5", n)
	}
}
