package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/internal/testenv"
)

// TestServeRedisFull runs serve on a Redis as the shipped manifests run it
// (noeviction) and puts Redis past its maxmemory: decisions go on by the
// fail mode (local, the default) and /metrics counts each refused call as
// sluice_store_errors_total{reason="oom"}, the series docs/deploy.md's
// alert reads; before, they were counted as reason="error".
func TestServeRedisFull(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	s := startServer(t, nil, "--rules", exampleRules, "--store", "redis://"+r.Addr)
	login := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"},{"key":"path","value":"/login"}]}]}`
	if res := s.do(t, "POST", "/json", login); res.code != 200 {
		t.Fatalf("a login before the cap: %d %s", res.code, res.body)
	}
	r.Do("CONFIG", "SET", "maxmemory", "1")
	// Memory back before the server stops (cleanups run last first): its
	// shutdown writes back the hits decided locally, which a full Redis
	// refuses, and serve then ends with that error.
	t.Cleanup(func() { r.Do("CONFIG", "SET", "maxmemory", "0") })
	for range 3 {
		if res := s.do(t, "POST", "/json", login); res.code != 200 {
			t.Fatalf("a login at the cap: %d %s, want 200 decided by --fail local", res.code, res.body)
		}
	}
	metrics := s.do(t, "GET", "/metrics", "").body
	m := regexp.MustCompile(`(?m)^sluice_store_errors_total\{reason="oom"\} (\d+)$`).FindStringSubmatch(metrics)
	if m == nil {
		t.Fatalf("/metrics has no sluice_store_errors_total{reason=\"oom\"}")
	}
	if n, _ := strconv.Atoi(m[1]); n < 1 {
		t.Errorf("sluice_store_errors_total{reason=\"oom\"} = %d after three logins at the cap, want at least 1", n)
	}
	if !regexp.MustCompile(`(?m)^sluice_fail_mode_decisions_total\{mode="local"\} [1-9]`).MatchString(metrics) {
		t.Error("no decision counted in sluice_fail_mode_decisions_total{mode=\"local\"}")
	}
}
