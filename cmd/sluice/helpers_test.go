package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/server"
)

// exampleRules is the sample rules file the README's quickstart uses.
const exampleRules = "../../examples/rules.yaml"

// testServer is sluice serving in the test, on loopback ports.
type testServer struct {
	httpURL   string
	adminAddr string
	logs      *testenv.Logs
	cancel    context.CancelFunc
	done      chan error // receives the result of run or Run
	http      *http.Client
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
// and waits until it listens: what the command line, the environment and a
// config file make of a server. The server is shut down, and must stop
// cleanly, when the test ends.
func startServer(t *testing.T, getenv func(string) string, args ...string) *testServer {
	t.Helper()
	if getenv == nil {
		getenv = env()
	}
	all := append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json", "--retry-jitter", "0s"}, args...)
	ctx, cancel := context.WithCancel(context.Background())
	s := &testServer{logs: &testenv.Logs{}, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- run(ctx, all, getenv, io.Discard, s.logs) }()
	var rec map[string]any
	eventually(t, "serve listens", func() bool {
		select {
		case err := <-s.done:
			cancel()
			t.Fatalf("serve ended before listening: %v\nlogs:\n%s", err, s.logs)
		default:
		}
		rec = s.logs.Find("listening")
		return rec != nil
	})
	httpAddr, _ := rec["http_addr"].(string)
	s.httpURL = "http://" + httpAddr
	s.cleanup(t)
	return s
}

// startConfig runs the server of c (its Rules and Admin set) on loopback
// ports, logging JSON.
func startConfig(t *testing.T, c server.Config) *testServer {
	t.Helper()
	s := &testServer{logs: &testenv.Logs{}, done: make(chan error, 1)}
	c.GRPC.Addr, c.HTTP.Addr, c.RetryJitter = "127.0.0.1:0", "127.0.0.1:0", -1
	c.Logger = slog.New(slog.NewJSONHandler(s.logs, nil))
	srv, err := server.New(c)
	if err != nil {
		t.Fatalf("New: %v\nlogs:\n%s", err, s.logs)
	}
	var ctx context.Context
	ctx, s.cancel = context.WithCancel(context.Background())
	s.httpURL, s.adminAddr = "http://"+srv.HTTPAddr(), srv.AdminAddr()
	go func() { s.done <- srv.Run(ctx) }()
	s.cleanup(t)
	return s
}

// cleanup stops s when the test ends.
func (s *testServer) cleanup(t *testing.T) {
	s.http = &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(func() {
		s.http.CloseIdleConnections()
		if err := s.stop(); err != nil {
			t.Errorf("serve: %v\nlogs:\n%s", err, s.logs)
		}
	})
}

// stop cancels the server's context and returns its result.
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

// writeTemp writes content to a file called name in a fresh temporary
// directory and returns its path.
func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	writeFile(t, path, content)
	return path
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
