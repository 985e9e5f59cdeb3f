package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testenv"
)

// TestServeEnvoyRedisUnixSocket runs serve on Envoy's environment with a
// Redis on a unix socket (REDIS_SOCKET_TYPE=unix, REDIS_URL a path, as
// Envoy's nutcracker sidecar setups have it): decisions are counted in
// that Redis, over its socket.
func TestServeEnvoyRedisUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(socketDir(t), "redis.sock")
	redis := testenv.StartRedis(t, "--unixsocket", sock, "--unixsocketperm", "700")
	rules := copyRules(t, exampleRules)
	s := startServer(t, env("REDIS_SOCKET_TYPE=unix", "REDIS_URL="+sock, "DEBUG_PORT=0", "DEBUG_HOST=127.0.0.1",
		"LOG_LEVEL=info"),
		"--rules", rules, "--fail", "closed")
	eventually(t, "the store connected", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"mode":"store"`)
	})
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"unix"},{"key":"path","value":"/login"}]}]}`
	if r := s.do(t, "POST", "/json", body); r.code != 200 || !strings.Contains(r.body, `"overallCode":"OK"`) {
		t.Fatalf("POST /json = %d %s, want OK from the Redis on the socket (--fail closed denies without it)", r.code, r.body)
	}
	if n := strings.TrimSpace(redis.CLI("dbsize")); n == "0" {
		t.Errorf("DBSIZE = %s: the decision left no key in the Redis on the socket", n)
	}
	if clients := redis.CLI("client", "list"); !strings.Contains(clients, "addr="+sock) {
		t.Errorf("no client of the Redis on its socket %s:\n%s", sock, clients)
	}
}

// TestServeEnvoyRedisSentinelAuth runs serve on Envoy's environment with
// a Sentinel-managed Redis whose sentinels require a password of their
// own (REDIS_SENTINEL_AUTH) and whose master another (REDIS_AUTH):
// decisions are counted on the master, and neither password is logged.
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
	s := startServer(t, env("REDIS_TYPE=SENTINEL", "REDIS_URL=rl,"+sentinel.Addr, "REDIS_AUTH=masterpw",
		"REDIS_SENTINEL_AUTH=sentinelpw", "DEBUG_PORT=0", "DEBUG_HOST=127.0.0.1", "LOG_LEVEL=info"),
		"--rules", copyRules(t, exampleRules), "--fail", "closed")
	eventually(t, "the store connected", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"mode":"store"`)
	})
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"sentinel"},{"key":"path","value":"/login"}]}]}`
	if r := s.do(t, "POST", "/json", body); r.code != 200 || !strings.Contains(r.body, `"overallCode":"OK"`) {
		t.Fatalf("POST /json = %d %s, want OK from the master (--fail closed denies without it)", r.code, r.body)
	}
	if n := strings.TrimSpace(master.CLI("-a", "masterpw", "--no-auth-warning", "dbsize")); n == "0" {
		t.Errorf("DBSIZE = %s: the decision left no key on the master", n)
	}
	if logs := s.logs.String(); strings.Contains(logs, "masterpw") || strings.Contains(logs, "sentinelpw") {
		t.Errorf("a password is in the logs:\n%s", logs)
	}
}
