package server

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testenv"
)

// countKeys returns the keys in r that decisions left: every key but the
// set in which each server on a Redis beats once a second (store/redis's
// Fleet, `{sluice-fleet}`: docs/stores.md). args are redis-cli's own
// (a password).
func countKeys(r *testenv.RedisServer, args ...string) []string {
	var keys []string
	for _, k := range strings.Fields(r.CLI(append(args, "--scan")...)) {
		if !strings.HasSuffix(k, "{sluice-fleet}") {
			keys = append(keys, k)
		}
	}
	return keys
}

// onStore returns the Config of a test server with the rules at path on
// the store at url, FailClosed, and a store timeout of 5s (a store call,
// not the load, decides).
func onStore(rules, url string) Config {
	c := testConfig(rules)
	c.Store.URL, c.Fail, c.StoreTimeout = url, decide.FailClosed, 5*time.Second
	return c
}

// TestServeEnvoyRedisUnixSocket runs a server on a Redis on a unix socket
// (unix://path, which Envoy's REDIS_SOCKET_TYPE=unix and REDIS_URL a path
// map to, as its nutcracker sidecar setups have it): decisions are
// counted in that Redis, over its socket.
func TestServeEnvoyRedisUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(socketDir(t), "redis.sock")
	redis := testenv.StartRedis(t, "--unixsocket", sock, "--unixsocketperm", "700")
	rules := copyRules(t, exampleRules)
	s := startServer(t, onStore(rules, "unix://"+sock))
	eventually(t, "the store connected", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"mode":"store"`)
	})
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"unix"},{"key":"path","value":"/login"}]}]}`
	if r := s.do(t, "POST", "/json", body); r.code != 200 || !strings.Contains(r.body, `"overallCode":"OK"`) {
		t.Fatalf("POST /json = %d %s, want OK from the Redis on the socket (--fail closed denies without it)", r.code, r.body)
	}
	if keys := countKeys(redis); len(keys) == 0 {
		t.Errorf("the decision left no key in the Redis on the socket")
	}
	if clients := redis.CLI("client", "list"); !strings.Contains(clients, "addr="+sock) {
		t.Errorf("no client of the Redis on its socket %s:\n%s", sock, clients)
	}
}

// TestServeEnvoyRedisSentinelAuth runs a server on a Sentinel-managed
// Redis whose sentinels require a password of their own
// (StoreConfig.SentinelAuth, Envoy's REDIS_SENTINEL_AUTH) and whose master
// another (the URL's, Envoy's REDIS_AUTH): decisions are counted on the
// master, and neither password is logged.
func TestServeEnvoyRedisSentinelAuth(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a master and a sentinel")
	}
	master := testenv.StartRedis(t)
	if got := master.Do("CONFIG", "SET", "requirepass", "masterpw"); got != "+OK" {
		t.Fatalf("CONFIG SET requirepass = %q", got)
	}
	sentinel := testenv.StartRedisSentinelAuth(t, master, "rl", "sentinelpw")
	if got := sentinel.Do("SENTINEL", "SET", "rl", "auth-pass", "masterpw"); got != "+OK" {
		t.Fatalf("SENTINEL SET auth-pass = %q", got)
	}
	c := onStore(copyRules(t, exampleRules), "redis+sentinel://:masterpw@"+sentinel.Addr+"/rl")
	c.Store.SentinelAuth = "sentinelpw"
	s := startServer(t, c)
	eventually(t, "the store connected", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"mode":"store"`)
	})
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"sentinel"},{"key":"path","value":"/login"}]}]}`
	if r := s.do(t, "POST", "/json", body); r.code != 200 || !strings.Contains(r.body, `"overallCode":"OK"`) {
		t.Fatalf("POST /json = %d %s, want OK from the master (--fail closed denies without it)", r.code, r.body)
	}
	if keys := countKeys(master, "-a", "masterpw", "--no-auth-warning"); len(keys) == 0 {
		t.Errorf("the decision left no key on the master")
	}
	if logs := s.logs.String(); strings.Contains(logs, "masterpw") || strings.Contains(logs, "sentinelpw") {
		t.Errorf("a password is in the logs:\n%s", logs)
	}
}

// TestServeEnvoyPerSecondRedis runs a server with a per-second Redis
// (StoreConfig.PerSecond, Envoy's REDIS_PERSECOND): a limit of unit second is counted
// only there, one of unit hour only in REDIS_URL's Redis.
func TestServeEnvoyPerSecondRedis(t *testing.T) {
	t.Parallel()
	mainRedis, perSecond := testenv.StartRedis(t), testenv.StartRedis(t)
	rules := writeTemp(t, "rules.yaml", "domain: api\ndescriptors:\n"+
		"  - key: burst\n    rate_limit: {unit: second, requests_per_unit: 100}\n"+
		"  - key: daily\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"+
		"  - key: pulse\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	c := onStore(rules, "redis://"+mainRedis.Addr)
	c.Store.PerSecond = "redis://" + perSecond.Addr
	s := startServer(t, c)
	eventually(t, "both stores connected", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"mode":"store"`)
	})
	// The per-second Redis holds counts only: the fleet set is on REDIS_URL's.
	dbsize := func(r *testenv.RedisServer) string { return strings.TrimSpace(r.CLI("dbsize")) }
	counted := func(r *testenv.RedisServer) string { return strconv.Itoa(len(countKeys(r))) }
	post := func(key string) {
		t.Helper()
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"` + key + `","value":"x"}]}]}`
		if r := s.do(t, "POST", "/json", body); r.code != 200 || !strings.Contains(r.body, `"overallCode":"OK"`) {
			t.Fatalf("POST /json %s = %d %s, want OK (--fail closed denies without the store)", key, r.code, r.body)
		}
	}
	post("burst")
	if m, p := counted(mainRedis), dbsize(perSecond); m != "0" || p != "1" {
		t.Fatalf("after a per-second hit: %s keys in REDIS_URL's Redis, %s in the per-second one; want 0 and 1", m, p)
	}
	post("daily")
	if m, p := counted(mainRedis), dbsize(perSecond); m != "1" || p != "1" {
		t.Fatalf("after an hourly hit: %s keys in REDIS_URL's Redis, %s in the per-second one; want 1 and 1", m, p)
	}

	// A request over both Redis servers that the per-second limit denies
	// takes nothing of the hourly one. (A second may turn between the two
	// calls and let both pass: then again, with other values.)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: descs})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i := 0; ; i++ {
		v := strconv.Itoa(i)
		if r := call(descriptor("pulse", v)); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a fresh per-second key: %v", r)
		}
		r := call(descriptor("pulse", v), descriptor("daily", v))
		if r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			if i == 20 {
				t.Fatal("the per-second limit never denied its second hit")
			}
			continue // the second turned
		}
		if st := r.GetStatuses(); len(st) != 2 || st[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("pulse twice in a second, with daily: %v, want pulse OVER_LIMIT", r)
		}
		if r := call(descriptor("daily", v)); r.GetStatuses()[0].GetLimitRemaining() != 99 {
			t.Errorf("daily %s after the denied request: %d left, want 99 (the denied request took nothing)", v, r.GetStatuses()[0].GetLimitRemaining())
		}
		break
	}
}

// TestServeEnvoyPerSecondSentinelAuth runs a server with the per-second
// Redis behind sentinels that require a password of their own
// (StoreConfig.PerSecondSentinelAuth, Envoy's
// REDIS_PERSECOND_SENTINEL_AUTH): a per-second limit is counted
// on that master, an hourly one on REDIS_URL's Redis.
func TestServeEnvoyPerSecondSentinelAuth(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts three Redis servers")
	}
	mainRedis, master := testenv.StartRedis(t), testenv.StartRedis(t)
	sentinel := testenv.StartRedisSentinelAuth(t, master, "ps", "sentinelpw")
	rules := writeTemp(t, "rules.yaml", "domain: api\ndescriptors:\n"+
		"  - key: burst\n    rate_limit: {unit: second, requests_per_unit: 100}\n"+
		"  - key: daily\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	c := onStore(rules, "redis://"+mainRedis.Addr)
	c.Store.PerSecond, c.Store.PerSecondSentinelAuth = "redis+sentinel://"+sentinel.Addr+"/ps", "sentinelpw"
	s := startServer(t, c)
	eventually(t, "both stores connected", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"mode":"store"`)
	})
	for _, key := range []string{"burst", "daily"} {
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"` + key + `","value":"x"}]}]}`
		if r := s.do(t, "POST", "/json", body); r.code != 200 || !strings.Contains(r.body, `"overallCode":"OK"`) {
			t.Fatalf("POST /json %s = %d %s, want OK (--fail closed denies without the store)", key, r.code, r.body)
		}
	}
	if m, p := len(countKeys(mainRedis)), strings.TrimSpace(master.CLI("dbsize")); m != 1 || p != "1" {
		t.Errorf("%d keys in REDIS_URL's Redis, %s on the per-second master; want 1 and 1", m, p)
	}
	if logs := s.logs.String(); strings.Contains(logs, "sentinelpw") {
		t.Errorf("the sentinels' password is in the logs:\n%s", logs)
	}
}
