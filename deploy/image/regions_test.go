package image

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The regions tests run regions as containers: each region a Docker
// network of its own with its Redis and its sluice server, the way
// between regions (the WAN) a toxiproxy container on every region's
// network, whose proxies lead to each region's Redis. A server reads its
// peer through the proxy on its own network, so a toxic on the proxy
// weathers that way (latency, a timeout, resets), and taking the proxy's
// container off a region's network (`docker network disconnect`) cuts the
// region off both ways. Toxiproxy runs as its own server binary, built
// here from the main module (imageHelpers), so that the WAN is a
// container the partitions can cut like any other, the region's
// containers reach it by name, and this module needs no toxiproxy of its
// own.

// regionsRules are the rules of the regions tests: user, a global limit
// of 10 an hour, whose bound is small and reached in a few rounds (a room
// of 1 a region a round); team, 1,000 an hour, for a first share large
// enough to see.
const regionsRules = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, scope: global}
  - key: team
    rate_limit: {unit: hour, requests_per_unit: 1000, scope: global}
`

// regionsBound is the bound of docs/regions.md on what R regions admit
// together in a window of a global limit of l with the share k (10):
// l − 1 + R × max(⌊l/(R×k)⌋, 1). It holds through every cut, and through
// an empty restart of a region's Redis.
func regionsBound(l, r int) int { return l - 1 + r*max(l/(r*10), 1) }

// helperImage is imageHelpers' image.
var helperImage built

// imageHelpers returns an image, FROM scratch, of two static binaries
// built from the main module, nothing pulled: /toxiproxy, toxiproxy's own
// server (github.com/Shopify/toxiproxy/v2/cmd/server, in the main
// module's go.sum for its weather tests), and /fakeredis
// (internal/fakeredis: testenv's fake Redis as a command, a hostile
// peer). Each container names its binary as entrypoint.
func imageHelpers(t testing.TB) string {
	return helperImage.image(t, func() (string, error) {
		start := time.Now()
		dir, err := os.MkdirTemp("", "sluice-helpers-image")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(dir)
		for bin, pkg := range map[string]string{
			"toxiproxy": "github.com/Shopify/toxiproxy/v2/cmd/server",
			"fakeredis": "./internal/fakeredis",
		} {
			if err := goBuild(filepath.Join(dir, bin), pkg); err != nil {
				return "", err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM scratch\nCOPY toxiproxy fakeredis /\n"), 0o644); err != nil {
			return "", err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		id, err := dockerCtx(ctx, "build", "-q", "--label", runLabel+"=helpers", dir)
		if err != nil {
			return "", err
		}
		tag := "sluice-test-helpers:" + shortID(id)
		if _, err := dockerCtx(ctx, "tag", id, tag); err != nil {
			return "", err
		}
		fmt.Fprintf(os.Stderr, "built %s in %s\n", tag, time.Since(start).Round(time.Millisecond))
		return tag, nil
	})
}

// goBuild builds pkg of the main module (its root two levels up) as a
// static linux binary at out.
func goBuild(out, pkg string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// wan is the toxiproxy container between regions, driven through its
// HTTP API.
type wan struct {
	c   *container
	api string
}

// post sends body to the API's path and fails the test unless it
// answers with a 2xx.
func (w *wan) post(t *testing.T, path, body string) {
	t.Helper()
	code, out, err := call("POST", w.api+path, body)
	if err != nil || code/100 != 2 {
		t.Fatalf("toxiproxy POST %s %s: %d %s %v", path, body, code, out, err)
	}
}

// toxic adds a toxic named name of kind to stream (upstream: the
// requests, downstream: the replies) of proxy, with its attributes
// (JSON).
func (w *wan) toxic(t *testing.T, proxy, name, kind, stream, attrs string) {
	t.Helper()
	w.post(t, "/proxies/"+proxy+"/toxics",
		fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, kind, stream, attrs))
}

// untoxic removes proxy's toxics by name.
func (w *wan) untoxic(t *testing.T, proxy string, names ...string) {
	t.Helper()
	for _, n := range names {
		if code, out, err := call("DELETE", w.api+"/proxies/"+proxy+"/toxics/"+n, ""); err != nil || code/100 != 2 {
			t.Fatalf("toxiproxy DELETE toxic %s of %s: %d %s %v", n, proxy, code, out, err)
		}
	}
}

// regionsReadyz is what /readyz answers with --region.
type regionsReadyz struct {
	code    int
	body    string
	Mode    string `json:"mode"`
	Regions struct {
		Region string `json:"region"`
		Cut    bool   `json:"cut"`
		Peers  []struct {
			Name   string  `json:"name"`
			State  string  `json:"state"`
			ReadMS float64 `json:"read_ms"`
			Error  string  `json:"error"`
		} `json:"peers"`
		Unreachable []string `json:"unreachable"`
	} `json:"regions"`
}

// regionsReady asks c's /readyz; a server that does not answer gives a
// code of 0.
func regionsReady(c *container) regionsReadyz {
	var r regionsReadyz
	code, body, err := call("GET", c.url(8080)+"/readyz", "")
	if err != nil {
		r.body = err.Error()
		return r
	}
	r.code, r.body = code, body
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		r.body += " (" + err.Error() + ")"
	}
	return r
}

// peer returns the state of the peer named name, "" if none.
func (r regionsReadyz) peer(name string) string {
	for _, p := range r.Regions.Peers {
		if p.Name == name {
			return p.State
		}
	}
	return ""
}

// waitPeer waits until c is ready, deciding from its store, and names
// peer in state (and, with cut, says its region is cut off).
func waitPeer(t *testing.T, c *container, peer, state string, cut bool) regionsReadyz {
	t.Helper()
	var r regionsReadyz
	waitFor(t, fmt.Sprintf("%s ready, peer %s %s, cut %v", c.name, peer, state, cut), time.Minute, func() (bool, string) {
		r = regionsReady(c)
		return r.code == 200 && r.Mode == "store" && r.peer(peer) == state && r.Regions.Cut == cut, r.body
	})
	return r
}

// decideAs asks c for one hit of key=value in the rules' domain: true if
// admitted (200), false if denied (429); anything else fails the test.
func decideAs(t *testing.T, c *container, key, value string) bool {
	t.Helper()
	code, body, err := call("POST", c.url(8080)+"/json",
		`{"domain":"api","descriptors":[{"entries":[{"key":"`+key+`","value":"`+value+`"}]}]}`)
	if err != nil || (code != 200 && code != 429) {
		t.Fatalf("decide %s=%s on %s: %d %s %v", key, value, c.name, code, body, err)
	}
	return code == 200
}

// demand asks every server in cs for a hit of user every 20 ms for d
// (a client of each region over its limit), and returns what each
// admitted.
func demand(t *testing.T, user string, d time.Duration, cs ...*container) []int {
	t.Helper()
	got := make([]int, len(cs))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		for i, c := range cs {
			if decideAs(t, c, "user", user) {
				got[i]++
			}
		}
	}
	return got
}

// probe asks every server in cs for a hit of user once, so that their
// rounds read it, and returns what each admitted.
func probe(t *testing.T, user string, cs ...*container) []int {
	t.Helper()
	got := make([]int, len(cs))
	for i, c := range cs {
		if decideAs(t, c, "user", user) {
			got[i]++
		}
	}
	return got
}

// inAnHour runs f with a user of its own, named after name, and again
// with another if its run did not lie within one window of an hour, the
// limits' (a window that turned mid-run lets more through: a run of 20 s
// at most, about 1 in 180).
func inAnHour(name string, f func(user string)) {
	for i := range 2 {
		start := time.Now().Truncate(time.Hour)
		f(name + "-" + strconv.Itoa(i))
		if time.Now().Truncate(time.Hour).Equal(start) {
			return
		}
	}
}

// TestRegionsContainers runs two regions, eu and us, as containers (see
// the top of this file), a server each, and weathers the way between
// them, in turn:
//   - a peer down at start: the WAN's container is not on us's network,
//     so each server starts with its peer unreachable (a partition at
//     deploy time); each is ready, decides, and names the peer; joined,
//     each reads the other live;
//   - a slow peer: 300 ms each way on both proxies; each names the other
//     lagging, not unreachable, and a global limit keeps its bound;
//   - cuts by toxics: a timeout toxic on eu's way to us (a one-way cut:
//     eu names us unreachable, us finds eu does not echo it, unechoed,
//     both cut off), then resets on us's way to eu too (both
//     unreachable); healed, both live; the bound holds across;
//   - a cut by network: the WAN's container taken off us's network; both
//     unreachable and ready, then live again when it joins; the bound
//     holds across;
//   - an empty restart: both regions use a key, the key idles 3 s (longer
//     than a key unasked stays read, 2.4 s), eu's Redis container
//     restarts (it keeps nothing on disk), then both regions ask again:
//     the bound holds, though eu's Redis forgot what eu admitted (each
//     server keeps what it read of eu until the window ends);
//   - an empty restart of a key the other region never read: eu alone
//     uses a key, it idles 3 s, eu's Redis restarts, then both regions
//     ask: us learns what eu admitted from what eu's server carried into
//     its new Redis (before that was built: 20 of 10, bound 11).
//
// The servers run with --fail closed: while a region's own Redis is down
// (the restart) the default fail mode, local, admits outside the global
// bound, as docs/regions.md says (Failures), and what is measured here
// is the regions layer. The subtests share the containers and run in
// order; each asks for a user of its own.
func TestRegionsContainers(t *testing.T) {
	t.Parallel()
	img, redisImg, helpers := imageSluice(t), imageRedis(t), imageHelpers(t)
	eu, us := newNetwork(t, "regions-eu", false), newNetwork(t, "regions-us", false)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(regionsRules), 0o644); err != nil {
		t.Fatal(err)
	}
	cs := runAll(t, spec{name: "regions-eu-redis", image: redisImg, network: eu, aliases: []string{"redis-eu"}},
		spec{name: "regions-us-redis", image: redisImg, network: us, aliases: []string{"redis-us"}},
		// Toxiproxy dials a proxy's upstream in its accept loop, with no
		// timeout: a dial whose SYN the cut by network swallows (the name
		// resolved a moment before) stops the proxy for the kernel's SYN
		// retries, over two minutes at Linux's default of 6, and every
		// client of it waits in the listen backlog, its reads timing out,
		// after the network is back (region us stayed unreachable a minute
		// after the reconnect, 1 CI run in 6). One retry gives up in 3 s.
		spec{name: "regions-wan", image: helpers, network: eu, publish: []int{8474}, entrypoint: "/toxiproxy",
			sysctls: []string{"net.ipv4.tcp_syn_retries=1"}, args: []string{"-host", "0.0.0.0", "-port", "8474"}})
	euRedis, w := cs[0], &wan{c: cs[2], api: cs[2].url(8474)}
	// The proxies: us's Redis for eu at wan:7001, eu's for us at wan:7002.
	waitFor(t, "toxiproxy's API", 30*time.Second, func() (bool, string) {
		code, body, err := call("GET", w.api+"/version", "")
		return err == nil && code == 200, fmt.Sprint(code, body, err)
	})
	w.post(t, "/proxies", `{"name":"us","listen":"0.0.0.0:7001","upstream":"redis-us:6379","enabled":true}`)
	w.post(t, "/proxies", `{"name":"eu","listen":"0.0.0.0:7002","upstream":"redis-eu:6379","enabled":true}`)

	server := func(region, netw, peer, port string) spec {
		return spec{name: "regions-" + region, image: img, network: netw, publish: []int{8080},
			mounts: []string{dir + ":/srv/rules:ro"},
			args: []string{"serve", "--rules", "/srv/rules", "--store", "redis://redis-" + region + ":6379", "--fail", "closed",
				"--region", region, "--peer-region", peer + "=redis://" + w.c.name + ":" + port}}
	}
	cs = runAll(t, server("eu", eu, "us", "7001"), server("us", us, "eu", "7002"))
	euSrv, usSrv := cs[0], cs[1]
	both := []*container{euSrv, usSrv}
	bound := regionsBound(10, 2)
	live := func(t *testing.T) {
		t.Helper()
		waitPeer(t, euSrv, "us", "live", false)
		waitPeer(t, usSrv, "eu", "live", false)
	}

	// step runs a subtest, unless one before it failed: each starts where
	// the one before it left the regions.
	step := func(name string, f func(t *testing.T)) {
		if !t.Failed() {
			t.Run(name, f)
		}
	}

	step("peer down at start", func(t *testing.T) {
		for _, c := range []struct {
			srv  *container
			peer string
		}{{euSrv, "us"}, {usSrv, "eu"}} {
			r := waitPeer(t, c.srv, c.peer, "unreachable", true)
			if !strings.Contains(r.body, `"unreachable":["`+c.peer+`"]`) {
				t.Errorf("%s's /readyz does not name %s unreachable: %s", c.srv.name, c.peer, r.body)
			}
			decideAs(t, c.srv, "user", "probe") // decides while partitioned
		}
		docker(t, "network", "connect", us, w.c.name)
		live(t)
	})

	step("slow peer", func(t *testing.T) {
		for _, p := range []string{"us", "eu"} {
			for _, s := range []string{"upstream", "downstream"} {
				w.toxic(t, p, "slow_"+s, "latency", s, `{"latency":300,"jitter":0}`)
			}
		}
		r := waitPeer(t, euSrv, "us", "lagging", false)
		waitPeer(t, usSrv, "eu", "lagging", false)
		t.Logf("eu: %s", r.body)
		inAnHour("slow", func(user string) {
			got := demand(t, user, 4*time.Second, both...)
			if got[0]+got[1] > bound {
				t.Errorf("a peer 300 ms away: the regions admitted %v of a global 10, more than the bound %d", got, bound)
			}
			t.Logf("a peer 300 ms away: admitted %v of a global 10 in 4 s (bound %d)", got, bound)
		})
		for _, p := range []string{"us", "eu"} {
			w.untoxic(t, p, "slow_upstream", "slow_downstream")
		}
		live(t)
	})

	step("cut by toxics", func(t *testing.T) {
		inAnHour("toxic", func(user string) {
			got := probe(t, user, both...)
			// eu's requests to us's Redis vanish, and each connection
			// closes a second after it opened
			w.toxic(t, "us", "cut", "timeout", "upstream", `{"timeout":1000}`)
			waitPeer(t, euSrv, "us", "unreachable", true)
			waitPeer(t, usSrv, "eu", "unechoed", true)
			add(got, demand(t, user, 2*time.Second, both...))
			// us's connections to eu's Redis are reset
			w.toxic(t, "eu", "cut", "reset_peer", "upstream", `{"timeout":0}`)
			waitPeer(t, usSrv, "eu", "unreachable", true)
			add(got, demand(t, user, 2*time.Second, both...))
			cut := slices.Clone(got)
			w.untoxic(t, "us", "cut")
			w.untoxic(t, "eu", "cut")
			live(t)
			add(got, demand(t, user, 2*time.Second, both...))
			if got[0]+got[1] > bound {
				t.Errorf("cut by toxics: the regions admitted %v of a global 10 (%v while cut), more than the bound %d", got, cut, bound)
			}
			t.Logf("cut by toxics: admitted %v of a global 10, %v of it while cut (bound %d)", got, cut, bound)
		})
	})

	step("cut by network", func(t *testing.T) {
		inAnHour("network", func(user string) {
			got := probe(t, user, both...)
			docker(t, "network", "disconnect", us, w.c.name)
			waitPeer(t, euSrv, "us", "unreachable", true)
			waitPeer(t, usSrv, "eu", "unreachable", true)
			add(got, demand(t, user, 3*time.Second, both...))
			cut := slices.Clone(got)
			docker(t, "network", "connect", us, w.c.name)
			live(t)
			add(got, demand(t, user, 2*time.Second, both...))
			if got[0]+got[1] > bound {
				t.Errorf("cut by network: the regions admitted %v of a global 10 (%v while cut), more than the bound %d", got, cut, bound)
			}
			t.Logf("cut by network: admitted %v of a global 10, %v of it while cut (bound %d)", got, cut, bound)
		})
	})

	step("empty restart", func(t *testing.T) {
		inAnHour("restart", func(user string) {
			before := demand(t, user, 2*time.Second, both...)
			time.Sleep(3 * time.Second) // the key idles: no round reads it any more
			docker(t, "restart", euRedis.name)
			live(t)
			after := demand(t, user, 3*time.Second, both...)
			if total := before[0] + before[1] + after[0] + after[1]; total > bound {
				t.Errorf("the regions admitted %v before eu's Redis restarted empty, then %v: %d of a global 10, more than the bound %d",
					before, after, total, bound)
			}
			t.Logf("empty restart: admitted %v before, then %v (bound %d)", before, after, bound)
		})
	})

	step("empty restart unread", func(t *testing.T) {
		inAnHour("unread", func(user string) {
			before := demand(t, user, 2*time.Second, euSrv)
			time.Sleep(3 * time.Second) // the key idles: no round reads it any more
			docker(t, "restart", euRedis.name)
			live(t)
			after := demand(t, user, 3*time.Second, both...)
			if total := before[0] + after[0] + after[1]; total > bound {
				t.Errorf("eu admitted %v alone before its Redis restarted empty, then the regions %v: %d of a global 10, more than the bound %d",
					before[0], after, total, bound)
			}
			t.Logf("empty restart unread: eu admitted %d alone before, then the regions %v (bound %d)", before[0], after, bound)
		})
	})
}

// add adds b to a, element by element.
func add(a, b []int) {
	for i := range a {
		a[i] += b[i]
	}
}

// TestRegionsHostilePeerContainer runs a region's server whose two peers
// are hostile "Redis" servers (internal/fakeredis, each in a container on
// the region's network): header answers every read with a RESP header of
// 2^31−1 elements, which once killed the server out of memory; board
// answers with a board of 1,000 records of 60 KB (60 MB a read), which
// once made it hold 90 MB more. The server, held to 256 MiB by the engine
// (swap included), stays up and ready, names both peers refused after 20
// refused reads of each, and decides a global key: at most a key's first
// share of a round (⌊L/(R×k)⌋, 33 of 1,000 with three regions) in the
// window it started in, since a peer it never read is charged the whole
// limit (docs/regions.md, Cut off).
func TestRegionsHostilePeerContainer(t *testing.T) {
	t.Parallel()
	img, redisImg, helpers := imageSluice(t), imageRedis(t), imageHelpers(t)
	netw := newNetwork(t, "regions-hostile", false)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(regionsRules), 0o644); err != nil {
		t.Fatal(err)
	}
	peers := []string{"header", "board"}
	specs := []spec{{name: "hostile-redis", image: redisImg, network: netw, aliases: []string{"redis"}}}
	args := []string{"serve", "--rules", "/srv/rules", "--store", "redis://redis:6379", "--region", "eu"}
	for _, p := range peers {
		specs = append(specs, spec{name: "hostile-" + p, image: helpers, network: netw, aliases: []string{p},
			entrypoint: "/fakeredis", args: []string{"--answer", p}})
		args = append(args, "--peer-region", p+"=redis://"+p+":6379")
	}
	runAll(t, specs...)
	c := run(t, spec{name: "hostile-server", image: img, network: netw, publish: []int{8080}, memory: "256m",
		mounts: []string{dir + ":/srv/rules:ro"}, args: args})

	for _, p := range peers {
		waitPeer(t, c, p, "refused", true)
		errs := regexp.MustCompile(`(?m)^sluice_region_peer_errors_total\{peer="` + p + `"\} (\d+)`)
		waitFor(t, "20 refused reads of "+p, time.Minute, func() (bool, string) {
			_, body, err := call("GET", c.url(8080)+"/metrics", "")
			if err != nil {
				return false, err.Error()
			}
			m := errs.FindStringSubmatch(body)
			if m == nil {
				return false, "no sluice_region_peer_errors_total of " + p
			}
			n, _ := strconv.Atoi(m[1])
			return n >= 20, m[0]
		})
	}
	inAnHour("hostile", func(team string) {
		admitted := 0
		for range 60 {
			if decideAs(t, c, "team", team) {
				admitted++
			}
		}
		if first := 1000 / (3 * 10); admitted < 1 || admitted > first {
			t.Errorf("beside hostile peers: admitted %d of 60 of a global 1,000, want 1 to %d (a key's first share)", admitted, first)
		}
		t.Logf("beside hostile peers: admitted %d of 60 of a global 1,000", admitted)
	})
	r := regionsReady(c)
	for _, p := range r.Regions.Peers {
		if p.State != "refused" || p.Error == "" {
			t.Errorf("peer %s: %s %q, want refused with its error", p.Name, p.State, p.Error)
		}
	}
	t.Logf("/readyz: %s", r.body)
	if st := c.inspect(t, "{{.State.Status}} {{.State.OOMKilled}} {{.RestartCount}}"); st != "running false 0" {
		t.Errorf("the server beside hostile peers: %s, want running, not killed out of memory, never restarted", st)
	}
	t.Logf("its memory: %s", docker(t, "stats", "--no-stream", "--format", "{{.MemUsage}}", c.name))
}
