package weather

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testenv"
)

// binary is the sluice binary TestMain built, or -weather.sluice.
var binary string

var prebuilt = flag.String("weather.sluice", "", "a sluice binary to measure instead of building ./cmd/sluice (another commit's, say)")

// TestMain builds the sluice binary once, as a user would
// (go build ./cmd/sluice), for every test of the package.
func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	flag.Parse()
	if *prebuilt != "" {
		binary = *prebuilt
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "weather-suite-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "sluice")
	gobin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "weather: go not found to build the sluice binary:", err)
		return 1
	}
	build := exec.Command(gobin, "build", "-o", binary, "github.com/sluicehq/sluice/cmd/sluice")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "weather: go build ./cmd/sluice: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// rulesYAML is the rules every server of the suite loads: for each sync
// mode, a per-second limit that the clients under their limit share out
// (each its own counter), and an hourly one for the client far over it.
const rulesYAML = `domain: weather
descriptors:
  - key: under_exact
    rate_limit: {unit: second, requests_per_unit: %[1]d, sync: exact}
  - key: under_lease
    rate_limit: {unit: second, requests_per_unit: %[1]d, sync: lease}
  - key: under_async
    rate_limit: {unit: second, requests_per_unit: %[1]d, sync: async}
  - key: over_exact
    rate_limit: {unit: hour, requests_per_unit: %[2]d, sync: exact}
  - key: over_lease
    rate_limit: {unit: hour, requests_per_unit: %[2]d, sync: lease}
  - key: over_async
    rate_limit: {unit: hour, requests_per_unit: %[2]d, sync: async}
`

// world is one topology: a redis-server without persistence, a toxiproxy
// proxy in front of it, through which every server reaches it, and the
// sluice servers. Everything listens on loopback ports of its own and
// stops when the test ends.
type world struct {
	t       *testing.T
	redis   *testenv.RedisServer
	proxy   *toxiproxy.Proxy
	servers []*server
}

// server is one `sluice serve` process and a gRPC connection to it.
type server struct {
	cmd      *exec.Cmd
	done     chan error // the result of cmd.Wait
	logs     *testenv.Logs
	httpAddr string
	conn     *grpc.ClientConn
}

// newWorld starts Redis, the proxy and n servers, and waits until every
// server is ready (its store reached).
func newWorld(t *testing.T, n int, p plan) *world {
	t.Helper()
	// DEBUG is refused by default since Redis 7; local connections may use it.
	w := &world{t: t, redis: testenv.StartRedis(t, "--enable-debug-command", "local")}
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	w.proxy = toxiproxy.NewProxy(tp, "redis", "127.0.0.1:0", w.redis.Addr)
	if err := w.proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.proxy.Stop)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, fmt.Appendf(nil, rulesYAML, p.underLimit, p.overLimit), 0o600); err != nil {
		t.Fatal(err)
	}
	for range n {
		w.servers = append(w.servers, w.startServer(rules))
	}
	for i, s := range w.servers {
		testenv.WaitFor(t, fmt.Sprintf("server %d ready", i), func() bool { return s.ready() })
	}
	// A deployment's servers have counted each other (their beats in
	// Redis's fleet set) long before any weather: so here before the load.
	if n > 1 {
		w.waitFleet(n)
	}
	return w
}

// startServer starts `sluice serve` on the proxy, every flag at its
// default but the listeners' addresses (free ports) and the log format
// (JSON, to read the addresses from), and waits until it listens.
func (w *world) startServer(rules string) *server {
	t := w.t
	t.Helper()
	s := &server{logs: &testenv.Logs{}, done: make(chan error, 1)}
	s.cmd = exec.Command(binary, "serve", "--rules", rules, "--store", "redis://"+w.proxy.Listen+"/0",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json")
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start sluice serve: %v", err)
	}
	go func() { s.done <- s.cmd.Wait() }() // owned by the cleanup, which waits for it
	t.Cleanup(func() {
		if s.conn != nil {
			s.conn.Close()
		}
		_ = s.cmd.Process.Signal(syscall.SIGCONT) // a stalled server stops too
		_ = s.cmd.Process.Signal(os.Interrupt)
		select {
		case <-s.done:
		case <-time.After(15 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
		if t.Failed() {
			t.Logf("sluice serve (pid %d) output, last lines:\n%s", s.cmd.Process.Pid, lastLines(notDenials(s.logs.String()), 20))
		}
	})
	var rec map[string]any
	testenv.WaitFor(t, "sluice serve listens", func() bool {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("sluice serve exited: %v\n%s", err, s.logs)
		default:
		}
		rec = s.logs.Find("listening")
		return rec != nil
	})
	grpcAddr, _ := rec["grpc_addr"].(string)
	s.httpAddr, _ = rec["http_addr"].(string)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	s.conn = conn
	return s
}

// ready reports whether the server's /readyz answers 200.
func (s *server) ready() bool {
	resp, err := http.Get("http://" + s.httpAddr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitFleet waits until n servers beat in the store's fleet set (a sorted
// set, each server's score the end of its last beat), then until each has
// beaten again: each has then read n.
func (w *world) waitFleet(n int) {
	var key string
	testenv.WaitFor(w.t, fmt.Sprintf("%d servers in the fleet set", n), func() bool {
		key = strings.TrimSpace(w.redis.CLI("--scan", "--pattern", "*sluice-fleet*"))
		return key != "" && !strings.Contains(key, "\n") && strings.TrimSpace(w.redis.CLI("zcard", key)) == strconv.Itoa(n)
	})
	beats := func() map[string]string {
		f := strings.Fields(w.redis.CLI("zrange", key, "0", "-1", "withscores"))
		m := map[string]string{}
		for i := 0; i+1 < len(f); i += 2 {
			m[f[i]] = f[i+1]
		}
		return m
	}
	first := beats()
	testenv.WaitFor(w.t, "every server beats again", func() bool {
		now := beats()
		for id, score := range first {
			if now[id] == score {
				return false
			}
		}
		return true
	})
}

// failDecisions returns /readyz's fail_decisions: the decisions the store
// did not make since the server started, by mode.
func (s *server) failDecisions() map[string]int {
	resp, err := http.Get("http://" + s.httpAddr + "/readyz")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		FailDecisions map[string]int `json:"fail_decisions"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body) != nil {
		return nil
	}
	return body.FailDecisions
}

func (s *server) signal(sig syscall.Signal) { _ = s.cmd.Process.Signal(sig) }

// toxic adds a toxic of kind to both directions of the proxy, or, for a
// kind that acts on one, downstream (Redis's answers).
func (w *world) toxic(kind, attrs string, both bool) {
	streams := []string{"downstream"}
	if both {
		streams = append(streams, "upstream")
	}
	for _, stream := range streams {
		js := fmt.Sprintf(`{"name": %q, "type": %q, "stream": %q, "attributes": %s}`, kind+"_"+stream, kind, stream, attrs)
		if _, err := w.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			w.t.Errorf("toxic %s: %v", kind, err)
		}
	}
}

// clearToxics removes every toxic of the proxy.
func (w *world) clearToxics() { w.proxy.Toxics.ResetToxics(context.Background()) }

// notDenials returns the log lines of s but the denial log's.
func notDenials(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.Contains(line, `"msg":"denied"`) {
			b.WriteString(line)
		}
	}
	return b.String()
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
