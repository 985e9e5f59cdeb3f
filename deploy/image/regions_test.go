package image

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRegionsContainers runs two regions in containers, each on a Docker
// network of its own with its Redis and a sluice server; each server also
// joins the other region's network, its way to the peer's Redis (a WAN).
// Region eu's server starts while its way to us is disconnected (a
// partition at deploy time, `docker network disconnect`): it starts,
// decides and is ready, naming us unreachable. Connected, it reads us
// live, and a global limit of 10 an hour admits at most its bound across
// both. Disconnected again, eu stays ready and names us; reconnected, us
// is live again.
func TestRegionsContainers(t *testing.T) {
	t.Parallel()
	img, redisImg := imageSluice(t), imageRedis(t)
	eu, us := newNetwork(t, "regions-eu", false), newNetwork(t, "regions-us", false)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rules := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10, scope: global}\n"
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	runAll(t, spec{name: "regions-eu-redis", image: redisImg, network: eu, aliases: []string{"redis-eu"}},
		spec{name: "regions-us-redis", image: redisImg, network: us, aliases: []string{"redis-us"}})
	server := func(region, netw, peer string, connect []string) spec {
		return spec{name: "regions-" + region, image: img, network: netw, publish: []int{8080}, connect: connect,
			mounts: []string{dir + ":/srv/rules:ro"},
			args: []string{"serve", "--rules", "/srv/rules", "--store", "redis://redis-" + region + ":6379", "--region", region,
				"--peer-region", peer + "=redis://redis-" + peer + ":6379"}}
	}
	cs := runAll(t, server("eu", eu, "us", nil), server("us", us, "eu", []string{eu}))
	euSrv, usSrv := cs[0], cs[1]
	readyz := func(c *container) (int, string) {
		code, body, err := call("GET", c.url(8080)+"/readyz", "")
		if err != nil {
			return 0, err.Error()
		}
		return code, body
	}
	waitFor(t, "eu ready, naming us unreachable (started partitioned)", 60*time.Second, func() (bool, string) {
		code, body := readyz(euSrv)
		return code == 200 && strings.Contains(body, `"unreachable":["us"]`), body
	})
	decide := func(c *container, user string) bool {
		code, body, err := call("POST", c.url(8080)+"/json", `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"`+user+`"}]}]}`)
		if err != nil || (code != 200 && code != 429) {
			t.Fatalf("decide: %d %s %v", code, body, err)
		}
		return code == 200
	}
	decide(euSrv, "probe") // decides while partitioned

	docker(t, "network", "connect", us, euSrv.name)
	for _, c := range []*container{euSrv, usSrv} {
		waitFor(t, c.name+" reading its peer live", 60*time.Second, func() (bool, string) {
			code, body := readyz(c)
			return code == 200 && strings.Contains(body, `"state":"live"`), body
		})
	}
	admitted := 0
	for range 15 {
		for _, c := range []*container{euSrv, usSrv} {
			if decide(c, "alice") {
				admitted++
			}
		}
	}
	if b := 10 - 1 + 2*1; admitted > b { // L − 1 + R × max(⌊L/(R×k)⌋, 1)
		t.Errorf("the regions admitted %d of a global 10, more than the bound %d", admitted, b)
	}
	t.Logf("admitted %d of a global limit of 10 across two regions", admitted)

	docker(t, "network", "disconnect", us, euSrv.name)
	waitFor(t, "eu naming us unreachable after a disconnect", 60*time.Second, func() (bool, string) {
		code, body := readyz(euSrv)
		return code == 200 && strings.Contains(body, `"unreachable":["us"]`), body
	})
	docker(t, "network", "connect", us, euSrv.name)
	waitFor(t, "eu reading us live again", 60*time.Second, func() (bool, string) {
		code, body := readyz(euSrv)
		return code == 200 && strings.Contains(body, `"state":"live"`) && !strings.Contains(body, "unreachable"), body
	})
}
