// Package upgrade holds the rolling upgrade test of docs/versioning.md:
// the previous version of sluice and this one on one Redis, the servers
// replaced one at a time under load, every count and limit kept.
//
// The previous version is built from the repository's history (previous
// below); this one from the working tree. It needs git with that commit,
// Go's module cache or proxy, and redis-server: it fails under CI=true
// when redis-server is missing, and skips, CI or not, outside a git
// checkout or in one without the commit (a shallow clone), saying so.
package upgrade

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// previous is the version a rolling upgrade starts from: 5907ab3, the last
// commit before the first release's work (issue 35). At each release it
// becomes the previous release's tag.
const previous = "5907ab3"

// limit is each rule's requests a day: small, so that a key reaches it
// while old servers decide, and a day, so that no window ends and no
// bucket refills a request during the test (a token_bucket of 12 a day
// refills one every two hours).
const limit = 12

// rules has one descriptor per algorithm whose state lives in Redis.
var rules = fmt.Sprintf(`domain: upgrade
descriptors:
  - key: fixed_window
    rate_limit: {unit: day, requests_per_unit: %[1]d}
  - key: sliding_window
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: token_bucket, burst: %[1]d}
  - key: gcra
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: gcra, burst: %[1]d}
`, limit)

var algorithms = []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"}

func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (skipped outside CI)", args...)
}

// build builds ./cmd/sluice of the module in dir into out.
func build(ctx context.Context, dir, out string) error {
	// As deploy/image/rootfs.sh and scripts/release.sh build (static,
	// -trimpath), so that the three share the build cache's packages.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "./cmd/sluice")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly -buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build in %s: %w\n%s", dir, err, b)
	}
	return nil
}

// binaries builds the previous version (from git archive of previous) and
// this one.
func binaries(t *testing.T) (old, cur string) {
	t.Helper()
	if err := exec.Command("git", "-C", "../..", "cat-file", "-e", previous+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in the repository (%v): not a git checkout, or a shallow one", previous, err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C ../.. archive "$1" | tar -x -C "$2"`, "sh", previous, src)
	if b, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", previous, err, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	old, cur = filepath.Join(dir, "sluice-old"), filepath.Join(dir, "sluice-new")
	// One after the other: go build uses every core, and the second
	// finds most packages in the cache.
	if err := build(ctx, src, old); err != nil {
		t.Fatal(err)
	}
	if err := build(ctx, "../..", cur); err != nil {
		t.Fatal(err)
	}
	return old, cur
}

// startRedis starts a redis-server on a unix socket in dir, as the
// shipped manifests run it (noeviction), and returns its URL for sluice.
func startRedis(t *testing.T, dir string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missing(t, "no redis-server: %v", err)
	}
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
		"--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitFor(t, 10*time.Second, "redis-server's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	return "unix://" + sock
}

// server is one sluice serve process.
type server struct {
	name string
	url  string // http://127.0.0.1:PORT
	cmd  *exec.Cmd
	done chan error
	log  *strings.Builder
	mu   sync.Mutex
}

// start starts bin serve on free loopback ports with the rules and the
// store, and waits until /readyz answers 200 (its Redis answered).
func start(t *testing.T, name, bin, rulesPath, store string) *server {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--rules", rulesPath, "--store", store, "--fail", "closed",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-format", "json", "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	s := &server{name: name, cmd: cmd, done: make(chan error, 1), log: &strings.Builder{}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.mu.Lock()
			s.log.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			var rec struct {
				Msg      string `json:"msg"`
				HTTPAddr string `json:"http_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				addr <- rec.HTTPAddr
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			s.mu.Lock()
			t.Logf("%s's log:\n%s", name, s.log.String())
			s.mu.Unlock()
		}
	})
	select {
	case a := <-addr:
		s.url = "http://" + a
	case err := <-s.done:
		t.Fatalf("%s ended before listening: %v\n%s", name, err, s.log)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no listening line in 30s", name)
	}
	waitFor(t, 30*time.Second, name+" ready", func() bool {
		resp, err := http.Get(s.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return s
}

// stop sends SIGTERM, as Kubernetes does, and waits for a clean exit.
func (s *server) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("%s exited with %v after SIGTERM", s.name, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit within 30s of SIGTERM", s.name)
	}
}

// fleet is the servers the load goes to, changed while it runs.
type fleet struct {
	mu      sync.Mutex
	servers []*server
	next    int
}

func (f *fleet) pick() *server {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	return f.servers[f.next%len(f.servers)]
}

func (f *fleet) replace(old, cur *server) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, s := range f.servers {
		if s == old {
			f.servers[i] = cur
		}
	}
}

// tally counts the answers per key and per phase of the upgrade.
type tally struct {
	mu       sync.Mutex
	sent     map[string]int         // calls answered, per key
	admitted map[string]int         // per key
	byPhase  map[int]map[string]int // admitted per key, by the servers replaced when it was sent
	denied   int
	retried  atomic.Int64
}

// key is a descriptor key (an algorithm's rule) and a user; late keys are
// asked for only once the first new server is in the fleet, so that their
// counts are written by old and new servers in turn.
type key struct {
	alg, user string
	late      bool
}

func (k key) String() string { return k.alg + "/" + k.user }

// TestRollingUpgrade starts three servers of the previous version on one
// Redis and sends one request per key every 20ms from eight callers over
// the fleet; after five rounds it replaces an old server by a new one (the
// new one started and ready, then the old one taken out of the load and
// sent SIGTERM, draining), and again after five more, until all three are
// new, the load going on throughout. Each key (an algorithm, a user) has a
// limit of 12 a day: the early keys are counted first by the old servers
// alone, then by the fleet; the late keys from the first mixed fleet on,
// so that old and new servers write their counts in turn. Every key is
// admitted exactly 12 times over the whole upgrade (a count lost, or not
// read by the other version, would admit more) and asked more often than
// that, and every call is answered 200 or 429.
func TestRollingUpgrade(t *testing.T) {
	old, cur := binaries(t)
	dir := t.TempDir()
	store := startRedis(t, dir)
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)

	f := &fleet{}
	for i := range 3 {
		f.servers = append(f.servers, start(t, fmt.Sprintf("old%d", i+1), old, rulesPath, store))
	}
	var keys []key
	for _, alg := range algorithms {
		for u := range 3 {
			keys = append(keys, key{alg, fmt.Sprintf("early%d", u), false}, key{alg, fmt.Sprintf("late%d", u), true})
		}
	}
	tl := &tally{sent: map[string]int{}, admitted: map[string]int{}, byPhase: map[int]map[string]int{}}
	var phase, rounds atomic.Int64 // servers replaced so far; rounds of load done
	client := &http.Client{Timeout: 10 * time.Second}
	stop := make(chan struct{})
	loadDone := make(chan error, 1)
	go func() { loadDone <- load(f, client, keys, tl, &phase, &rounds, stop) }()
	loadErr := func() error {
		select {
		case err := <-loadDone:
			return fmt.Errorf("the load ended: %v", err)
		default:
			return nil
		}
	}
	waitRounds := func(n int64) {
		t.Helper()
		target := rounds.Load() + n
		waitFor(t, time.Minute, fmt.Sprintf("%d rounds of load", n), func() bool { return rounds.Load() >= target })
	}

	waitRounds(5)
	for i, o := range append([]*server(nil), f.servers...) {
		n := start(t, fmt.Sprintf("new%d", i+1), cur, rulesPath, store)
		f.replace(o, n)
		phase.Add(1)
		o.stop(t)
		if err := loadErr(); err != nil {
			t.Fatal(err)
		}
		waitRounds(5)
	}
	// Every key asked past its limit, the new servers alone included.
	waitFor(t, time.Minute, "every key asked past its limit", func() bool {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		for _, k := range keys {
			if tl.sent[k.String()] < limit+3 {
				return false
			}
		}
		return true
	})
	close(stop)
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	if !time.Now().UTC().Truncate(24 * time.Hour).Equal(day) {
		t.Skip("a day ended during the test: the day's windows started afresh, as they should; run it again")
	}

	for _, k := range keys {
		id := k.String()
		if got := tl.admitted[id]; got != limit {
			t.Errorf("%s: admitted %d of %d calls over the upgrade, want exactly the limit %d (by servers replaced 0, 1, 2, 3: %d %d %d %d)",
				id, got, tl.sent[id], limit, tl.byPhase[0][id], tl.byPhase[1][id], tl.byPhase[2][id], tl.byPhase[3][id])
		}
	}
	if sum(tl.byPhase[0]) == 0 {
		t.Error("the old servers alone admitted nothing: the test did not exercise their counts")
	}
	t.Logf("%d keys × limit %d; admitted with 0, 1, 2, 3 servers replaced: %d %d %d %d; denied %d; %d rounds; calls sent again after a connection error %d",
		len(keys), limit, sum(tl.byPhase[0]), sum(tl.byPhase[1]), sum(tl.byPhase[2]), sum(tl.byPhase[3]), tl.denied, rounds.Load(), tl.retried.Load())
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// load sends a round of one request per key (the late ones once a server
// was replaced) every 20ms, eight at a time, until stop, counting the
// rounds done. A call that fails to connect (a server going away) is sent
// again to the next server; anything but 200 or 429 ends it.
func load(f *fleet, client *http.Client, keys []key, tl *tally, phase, rounds *atomic.Int64, stop <-chan struct{}) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-tick.C:
		}
		jobs := make(chan key)
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range jobs {
					if err := decide(f, client, k, tl, phase); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		late := phase.Load() > 0
		for _, k := range keys {
			if !k.late || late {
				jobs <- k
			}
		}
		close(jobs)
		wg.Wait()
		select {
		case err := <-errs:
			return err
		default:
		}
		rounds.Add(1)
	}
}

// decide asks the fleet for one decision on key k and tallies it.
func decide(f *fleet, client *http.Client, k key, tl *tally, phase *atomic.Int64) error {
	body := fmt.Sprintf(`{"domain":"upgrade","descriptors":[{"entries":[{"key":%q,"value":%q}]}]}`, k.alg, k.user)
	for try := 0; try < 20; try++ {
		p := int(phase.Load())
		s := f.pick()
		resp, err := client.Post(s.url+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			// Refused or reset by a server on its way out: not counted
			// there, so sent again to another.
			tl.retried.Add(1)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		id := k.String()
		tl.mu.Lock()
		tl.sent[id]++
		switch resp.StatusCode {
		case http.StatusOK:
			tl.admitted[id]++
			if tl.byPhase[p] == nil {
				tl.byPhase[p] = map[string]int{}
			}
			tl.byPhase[p][id]++
		case http.StatusTooManyRequests:
			tl.denied++
		default:
			tl.sent[id]--
			tl.mu.Unlock()
			return fmt.Errorf("%s: %s answered %d %s", id, s.name, resp.StatusCode, b)
		}
		tl.mu.Unlock()
		return nil
	}
	return fmt.Errorf("%s: no server answered in 20 tries", k)
}

// waitFor waits until cond holds, checking every 20ms, and fails the test
// if it does not within limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		<-tick.C
	}
}
