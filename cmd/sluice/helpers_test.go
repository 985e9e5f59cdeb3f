package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// exampleRules is the sample rules file the README's quickstart uses.
const exampleRules = "../../examples/rules.yaml"

// logBuffer collects a server's JSON log lines; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// find returns the first log record whose msg is msg, or nil.
func (l *logBuffer) find(msg string) map[string]any {
	return l.findFunc(msg, func(map[string]any) bool { return true })
}

// findFunc returns the first log record whose msg is msg and for which ok
// holds, or nil.
func (l *logBuffer) findFunc(msg string, ok func(rec map[string]any) bool) map[string]any {
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg && ok(rec) {
			return rec
		}
	}
	return nil
}

// testServer is `sluice serve` running in-process on loopback ports.
type testServer struct {
	grpcAddr string
	httpURL  string
	logs     *logBuffer
	cancel   context.CancelFunc
	done     chan error // receives run's result
	conn     *grpc.ClientConn
	rls      rlsv3.RateLimitServiceClient
	http     *http.Client
}

// env returns a getenv over the given KEY=VALUE pairs.
func env(kv ...string) func(string) string {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}

// startServer runs `sluice serve` with args after ports 0 and JSON logs,
// waits until it listens, and connects a gRPC and an HTTP client. The
// server is shut down, and must stop cleanly, when the test ends.
func startServer(t *testing.T, getenv func(string) string, args ...string) *testServer {
	t.Helper()
	if getenv == nil {
		getenv = env()
	}
	all := append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json", "--retry-jitter", "0s"}, args...)
	ctx, cancel := context.WithCancel(context.Background())
	s := &testServer{logs: &logBuffer{}, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- run(ctx, all, getenv, io.Discard, s.logs) }()
	deadline := time.Now().Add(10 * time.Second)
	var rec map[string]any
	for rec == nil {
		select {
		case err := <-s.done:
			cancel()
			t.Fatalf("serve ended before listening: %v\nlogs:\n%s", err, s.logs)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("serve did not listen within 10s; logs:\n%s", s.logs)
		}
		rec = s.logs.find("listening")
	}
	s.grpcAddr, _ = rec["grpc_addr"].(string)
	httpAddr, _ := rec["http_addr"].(string)
	s.httpURL = "http://" + httpAddr
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s.conn, s.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	s.http = &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(func() {
		s.http.CloseIdleConnections()
		conn.Close()
		if err := s.stop(); err != nil {
			t.Errorf("serve: %v\nlogs:\n%s", err, s.logs)
		}
	})
	return s
}

// waitStore waits until s decides from its store (/readyz says mode
// store): a Redis store connects in the background, and the fail mode
// decides until it has. The first attempt is bounded by the store's 1s
// dial timeout, which a loaded machine can overrun.
func (s *testServer) waitStore(t *testing.T) {
	t.Helper()
	eventually(t, "decisions from the store", func() bool {
		return strings.Contains(s.do(t, "GET", "/readyz", "").body, `"mode":"store"`)
	})
}

// stop cancels the server's context and returns run's result.
func (s *testServer) stop() error {
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err // a second stop sees the same result
		return err
	case <-time.After(15 * time.Second):
		return errors.New("serve did not stop within 15s")
	}
}

// httpResult is an HTTP answer, read whole.
type httpResult struct {
	code   int
	header http.Header
	body   string
}

func (s *testServer) do(t *testing.T, method, path, body string) httpResult {
	t.Helper()
	req, err := http.NewRequest(method, s.httpURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return httpResult{resp.StatusCode, resp.Header, string(b)}
}

// descriptor builds a descriptor from key/value pairs.
func descriptor(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits sets a descriptor's own hits_addend.
func hits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// header returns the value of the response header key, or "".
func header(resp *rlsv3.RateLimitResponse, key string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), key) {
			return h.GetValue()
		}
	}
	return ""
}

// copyRules copies src to a file in a fresh temporary directory and
// returns its path.
func copyRules(t *testing.T, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, string(b))
	return path
}

// readFile returns path's contents.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writeFile replaces path's contents the way editors do: write a new file
// and rename it over the old one.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond every 20ms for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nearMidnight reports whether a UTC day boundary is less than margin
// away, when the daily windows the tests count in could reset under them.
func nearMidnight(margin time.Duration) bool {
	now := time.Now().UTC()
	next := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	return next.Sub(now) < margin
}
