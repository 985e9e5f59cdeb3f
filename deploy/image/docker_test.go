package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The helpers below drive the Docker CLI: containers, networks and images
// of one test run carry the label runLabel=runID and names that start with
// sluice-test-<runID>, so that concurrent runs on one engine do not meet,
// and whatever a failed run leaves behind is found by its label.

const runLabel = "org.sluicehq.test"

// runID names this test run's containers and networks.
var runID = func() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}()

// TestMain runs the tests, then prunes what runs of these tests left on
// the engine more than a day ago (images) or an hour ago (stopped
// containers, networks): the layers of the last day stay as a cache.
func TestMain(m *testing.M) {
	code := m.Run()
	if engine.version != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for _, args := range [][]string{
			{"container", "prune", "-f", "--filter", "label=" + runLabel, "--filter", "until=1h"},
			{"network", "prune", "-f", "--filter", "label=" + runLabel, "--filter", "until=1h"},
			{"image", "prune", "-a", "-f", "--filter", "label=" + runLabel, "--filter", "until=24h"},
			{"image", "prune", "-f", "--filter", "until=24h"}, // build.sh's build stages: untagged, unlabelled
		} {
			if _, err := dockerCtx(ctx, args...); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
		cancel()
	}
	os.Exit(code)
}

// requireDocker fails the test under CI=true when no Docker Engine
// answers (CI's machines run one) and skips it otherwise.
func requireDocker(t testing.TB) {
	t.Helper()
	engine.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		engine.version, engine.err = dockerCtx(ctx, "version", "--format", "{{.Server.Version}}")
	})
	if engine.err != nil {
		missing(t, "no Docker Engine: %v", engine.err)
	}
}

var engine struct {
	once    sync.Once
	version string
	err     error
}

// missing fails the test under CI=true, where the engine and the tools
// these tests use are always there, and skips it otherwise.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (skipped outside CI)", args...)
}

// dockerCtx runs docker with args and returns its standard output,
// trimmed; an error carries its standard error.
func dockerCtx(ctx context.Context, args ...string) (string, error) {
	return runCtx(ctx, "docker", args...)
}

// runCtx runs name with args and returns its standard output, trimmed;
// an error carries its standard error.
func runCtx(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// docker runs docker with args, bounded by a minute, and fails the test
// on an error.
func docker(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := dockerCtx(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// built is an image built once per test run.
type built struct {
	once sync.Once
	tag  string
	err  error
}

var sluiceImage, redisImage built

// image returns the tag of b, building it with build on first use; a
// build that failed fails every test that asks for it.
func (b *built) image(t testing.TB, build func() (string, error)) string {
	t.Helper()
	requireDocker(t)
	b.once.Do(func() { b.tag, b.err = build() })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.tag
}

// imageSluice returns the sluice image, built once per test run by
// deploy/image/build.sh: the binary from this checkout with the
// machine's Go toolchain, nothing pulled.
func imageSluice(t testing.TB) string {
	return sluiceImage.image(t, func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		id, err := runCtx(ctx, "./build.sh", "-q", "--label", runLabel+"=image")
		if err != nil {
			return "", err
		}
		tag := "sluice-test:" + shortID(id)
		if _, err := dockerCtx(ctx, "tag", id, tag); err != nil {
			return "", err
		}
		size, err := dockerCtx(ctx, "image", "inspect", "--format", "{{.Size}}", id)
		if err != nil {
			return "", err
		}
		n, _ := strconv.ParseInt(size, 10, 64)
		fmt.Fprintf(os.Stderr, "built %s in %s: %.1f MB (%s bytes)\n", tag, time.Since(start).Round(time.Millisecond), float64(n)/1e6, size)
		return tag, nil
	})
}

// imageRedis returns an image of this machine's redis-server (Debian's
// package, which the test script installs): FROM scratch, the binary and
// the shared libraries ldd lists, nothing pulled. It runs unprotected
// (any client may connect), keeps no data on disk and listens on 6379.
func imageRedis(t testing.TB) string {
	return redisImage.image(t, func() (string, error) {
		bin, err := exec.LookPath("redis-server")
		if err != nil {
			return "", fmt.Errorf("redis-server, for the Redis image: %w", err)
		}
		real, err := filepath.EvalSymlinks(bin) // Debian's redis-server links to redis-check-rdb
		if err != nil {
			return "", err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := runCtx(ctx, "ldd", real)
		if err != nil {
			return "", err
		}
		dir, err := os.MkdirTemp("", "sluice-redis-image")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(dir)
		// The binary keeps its name: redis-server by another name is
		// redis-check-rdb.
		files := map[string]string{"/usr/bin/redis-server": real}
		for _, line := range strings.Split(out, "\n") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "/") {
					files[f] = f
				}
			}
		}
		for dst, src := range files {
			if err := copyFile(filepath.Join(dir, dst), src); err != nil {
				return "", err
			}
		}
		dockerfile := "FROM scratch\nCOPY . /\nENV PATH=/usr/bin LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu\n" +
			"EXPOSE 6379\n" + `CMD ["redis-server", "--protected-mode", "no", "--save", "", "--appendonly", "no"]` + "\n"
		if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
			return "", err
		}
		id, err := dockerCtx(ctx, "build", "-q", "--label", runLabel+"=redis", dir)
		if err != nil {
			return "", err
		}
		tag := "sluice-test-redis:" + shortID(id)
		_, err = dockerCtx(ctx, "tag", id, tag)
		return tag, err
	})
}

// copyFile copies src's content (through symbolic links) to dst, making
// dst's directories.
func copyFile(dst, src string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// shortID returns the first 12 hex digits of an image ID.
func shortID(id string) string {
	id = strings.TrimPrefix(strings.TrimSpace(id), "sha256:")
	return id[:min(12, len(id))]
}

// newNetwork makes a bridge network for the test, internal (no way out
// of it, nor published ports) when asked, and removes it at the end.
func newNetwork(t testing.TB, name string, internal bool) string {
	t.Helper()
	requireDocker(t)
	full := "sluice-test-" + runID + "-" + name
	args := []string{"network", "create", "--label", runLabel + "=" + runID}
	if internal {
		args = append(args, "--internal")
	}
	docker(t, append(args, full)...)
	t.Cleanup(func() { docker(t, "network", "rm", full) })
	return full
}

// spec says how to run a container.
type spec struct {
	name       string   // unique in the test run
	image      string   // a tag or ID
	network    string   // the network it starts on ("": the engine's default bridge)
	aliases    []string // its names on network, besides its own
	publish    []int    // container ports published on 127.0.0.1, each at a free port fixed for the container's life
	env        []string // KEY=VALUE
	mounts     []string // docker run -v values
	connect    []string // networks it joins once started, besides network
	memory     string   // the most memory it may use, swap included (docker run --memory): "256m"; "": no limit
	sysctls    []string // docker run --sysctl values: its network namespace's kernel settings, "net.ipv4.tcp_syn_retries=1"
	entrypoint string   // replaces the image's ENTRYPOINT, and drops its CMD as Kubernetes' command does
	args       []string // after the image name: the command, or the arguments to the entrypoint
}

// container is a started container.
type container struct {
	name  string
	ports map[int]string // container port: host address
}

// run starts s and removes the container at the end of the test, with
// its logs in the test's output if the test failed.
func run(t testing.TB, s spec) *container { return runAll(t, s)[0] }

// runAll starts the containers of specs at once, as run does: the engine
// takes seconds for each.
func runAll(t testing.TB, specs ...spec) []*container {
	t.Helper()
	cs := make([]*container, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, s := range specs {
		c := &container{name: "sluice-test-" + runID + "-" + s.name, ports: map[int]string{}}
		cs[i] = c
		args := []string{"run", "-d", "--name", c.name, "--label", runLabel + "=" + runID}
		if s.network != "" {
			args = append(args, "--network", s.network)
		}
		for _, a := range s.aliases {
			args = append(args, "--network-alias", a)
		}
		for _, p := range s.publish {
			c.ports[p] = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
			args = append(args, "-p", c.ports[p]+":"+strconv.Itoa(p))
		}
		if s.memory != "" {
			args = append(args, "--memory", s.memory, "--memory-swap", s.memory)
		}
		for _, e := range s.env {
			args = append(args, "-e", e)
		}
		for _, k := range s.sysctls {
			args = append(args, "--sysctl", k)
		}
		for _, m := range s.mounts {
			args = append(args, "-v", m)
		}
		if s.entrypoint != "" {
			args = append(args, "--entrypoint", s.entrypoint)
		}
		args = append(append(args, s.image), s.args...)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("logs of %s:\n%s", s.name, c.logs(t))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if out, err := dockerCtx(ctx, "rm", "-f", "-v", c.name); err != nil && !strings.Contains(err.Error(), "No such container") {
				t.Errorf("%v: %s", err, out)
			}
		})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, errs[i] = dockerCtx(ctx, args...); errs[i] != nil {
				return
			}
			for _, n := range s.connect {
				if _, errs[i] = dockerCtx(ctx, "network", "connect", n, c.name); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return cs
}

// freePort returns a TCP port free on 127.0.0.1 a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// logs returns the container's output so far, standard error included.
func (c *container) logs(t testing.TB) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", "logs", c.name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("docker logs %s: %v\n%s", c.name, err, out)
	}
	return string(out)
}

// inspect returns the container's field at a Go template's path, as
// docker inspect --format prints it.
func (c *container) inspect(t testing.TB, format string) string {
	t.Helper()
	return docker(t, "inspect", "--format", format, c.name)
}

// url returns the base URL of the container's HTTP port.
func (c *container) url(port int) string { return "http://" + c.ports[port] }

// httpClient is the tests' HTTP client: no call waits longer than 10 s.
var httpClient = &http.Client{Timeout: 10 * time.Second}

// call sends a request with body (none if empty) and returns the status
// code and the body, or an error.
func call(method, url, body string) (int, string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// readiness is what /readyz answers.
type readiness struct {
	code   int
	Status string `json:"status"`
	Mode   string `json:"mode"`
	Rules  string `json:"rules"`
}

// ready asks base's /readyz; an error is a server that does not answer.
func ready(base string) (readiness, error) {
	code, body, err := call("GET", base+"/readyz", "")
	if err != nil {
		return readiness{}, err
	}
	r := readiness{code: code}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return r, fmt.Errorf("/readyz = %d %q: %w", code, body, err)
	}
	return r, nil
}

// waitFor polls cond every 50 ms until it holds, and fails the test after
// timeout, naming what it waited for and cond's last word.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReady waits until c's /readyz answers 200 with the store's mode
// ("store", or the fail mode's while the store is unreachable).
func waitReady(t testing.TB, c *container, mode string, timeout time.Duration) {
	t.Helper()
	waitFor(t, c.name+" ready in mode "+mode, timeout, func() (bool, string) {
		r, err := ready(c.url(8080))
		if err != nil {
			if st := c.inspect(t, "{{.State.Status}}"); st != "running" {
				t.Fatalf("%s is %s: %v", c.name, st, err)
			}
			return false, err.Error()
		}
		return r.code == 200 && r.Mode == mode, fmt.Sprintf("%d %+v", r.code, r)
	})
}
