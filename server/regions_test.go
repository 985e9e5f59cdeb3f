package server

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/store/stack"
)

// TestRegions runs two servers, in regions eu and us, each on its own
// Redis and listing the other: a limit of scope global admits its limit
// once across both; /v1/keys shows its use by region; /metrics has the
// peers' lag, errors and last reading, and neither region's Redis
// unsettled (store/regions' TestEmptyRestartBeforeCarry sets it); /readyz shows the regions and,
// once one peer's Redis is gone, names it while staying ready.
func TestRegions(t *testing.T) {
	t.Parallel()
	rules := writeTemp(t, "rules.yaml", `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 6, scope: global}
`)
	eu, us := testenv.StartRedis(t), testenv.StartRedis(t)
	start := func(region, home, peer, peerAddr string) *testServer {
		c := testConfig(rules)
		c.Store.URL, c.Store.Region = "redis://"+home, region
		c.Store.Peers = []stack.Peer{{Name: peer, URL: "redis://" + peerAddr}}
		s := startServer(t, c)
		s.waitStore(t)
		return s
	}
	servers := []*testServer{start("eu", eu.Addr, "us", us.Addr), start("us", us.Addr, "eu", eu.Addr)}
	for _, s := range servers {
		eventually(t, "the peer read live", func() bool {
			return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"state":"live"`)
		})
	}
	decide := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"u1"}]}]}`
	admitted := 0
	for range 20 {
		for _, s := range servers {
			if strings.Contains(s.do(t, "POST", "/v1/decide", decide).body, `"overallCode":"OK"`) {
				admitted++
			}
		}
	}
	if admitted > 6-1+2*1 {
		t.Errorf("the regions admitted %d together, more than the bound %d", admitted, 6-1+2)
	}
	eventually(t, "/v1/keys to show the use by region", func() bool {
		b := servers[0].do(t, "GET", "/v1/keys/api/user/u1", "").body
		return strings.Contains(b, `"regions":[{"region":"eu","count":`) && strings.Contains(b, `{"region":"us","count":`)
	})
	m := servers[0].do(t, "GET", "/metrics", "").body
	for _, name := range []string{`sluice_region_peer_lag_seconds{peer="us"}`, `sluice_region_peer_errors_total{peer="us"}`,
		`sluice_region_peer_last_sync_timestamp_seconds{peer="us"}`, `sluice_region_peer_state{peer="us",state="live"} 1`, "sluice_regions 2",
		`sluice_region_unsettled{region="eu"} 0`, `sluice_region_unsettled{region="us"} 0`} {
		if !strings.Contains(m, name) {
			t.Errorf("/metrics has no %s", name)
		}
	}
	us.Kill()
	eventually(t, "/readyz to name the peer it cannot read", func() bool {
		r := servers[0].do(t, "GET", "/readyz", "")
		return r.code == 200 && strings.Contains(r.body, `"unreachable":["us"]`) && strings.Contains(r.body, `"cut":true`)
	})
}

// TestRegionsPeerDownAtStart starts a server whose peer region's Redis
// cannot be reached (nothing listens on its port): it starts, decides,
// is ready and names the peer in /readyz. Before, it crashed in
// milliseconds. A rule the regions layer cannot count, a global
// token_bucket whose count's window Redis cannot hold exactly, is refused
// when the rules load, naming its file and line.
func TestRegionsPeerDownAtStart(t *testing.T) {
	t.Parallel()
	rules := writeTemp(t, "rules.yaml", `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 6, scope: global}
`)
	home := testenv.StartRedis(t)
	c := testConfig(rules)
	c.Store.URL, c.Store.Region = "redis://"+home.Addr, "eu"
	c.Store.Peers = []stack.Peer{{Name: "us", URL: "redis://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))}}
	s := startServer(t, c)
	s.waitStore(t)
	eventually(t, "/readyz ready, naming the peer", func() bool {
		r := s.do(t, "GET", "/readyz", "")
		return r.code == 200 && strings.Contains(r.body, `"unreachable":["us"]`)
	})
	r := s.do(t, "POST", "/v1/decide", `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"u1"}]}]}`)
	if r.code != 200 || !strings.Contains(r.body, `"overallCode"`) {
		t.Errorf("decide: %d %s", r.code, r.body)
	}

	bad := writeTemp(t, "bad.yaml", `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 1000000, scope: global}
`)
	c.Rules.Source = bad
	srv, _, err := newServer(c)
	if err == nil {
		srv.Close()
		t.Fatal("a global token_bucket whose count Redis cannot keep was loaded")
	}
	// refused by the rules (the count cannot be read exactly) before the
	// stack's veto (Redis cannot keep its window) would: either names it
	if !strings.Contains(err.Error(), "bad.yaml:4") || !strings.Contains(err.Error(), "count") {
		t.Errorf("refused with %v: want bad.yaml:4 and its count across regions", err)
	}
}
