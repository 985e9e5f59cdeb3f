package server

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

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/testenv"
)

// exampleRules is the sample rules file the README's quickstart uses.
const exampleRules = "../examples/rules.yaml"

// testConfig returns the Config of a test server with the rules at path:
// every listener on a free loopback port, and no jitter on Retry-After.
func testConfig(rules string) Config {
	c := DefaultConfig()
	c.Rules.Source = rules
	c.GRPC.Addr, c.HTTP.Addr = "127.0.0.1:0", "127.0.0.1:0"
	c.RetryJitter = -1
	return c
}

// testServer is a Server running in the test on loopback ports.
type testServer struct {
	srv      *Server
	grpcAddr string
	httpURL  string
	logs     *testenv.Logs
	cancel   context.CancelFunc
	done     chan error // receives Run's result
	conn     *grpc.ClientConn
	rls      rlsv3.RateLimitServiceClient
	http     *http.Client
}

// newServer makes the Server of c, logging JSON into the returned logs.
func newServer(c Config) (*Server, *testenv.Logs, error) {
	logs := &testenv.Logs{}
	c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	srv, err := New(c)
	return srv, logs, err
}

// startServer runs the Server of c (testConfig's, say) and connects a gRPC
// client to its gRPC address, if any, and an HTTP client. The server is
// shut down, and must stop cleanly, when the test ends.
func startServer(t *testing.T, c Config) *testServer {
	t.Helper()
	srv, logs, err := newServer(c)
	if err != nil {
		t.Fatalf("New: %v\nlogs:\n%s", err, logs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &testServer{srv: srv, logs: logs, cancel: cancel, done: make(chan error, 1),
		grpcAddr: srv.GRPCAddr(), httpURL: "http://" + srv.HTTPAddr()}
	go func() { s.done <- srv.Run(ctx) }()
	eventually(t, "Run serving", func() bool {
		select {
		case err := <-s.done:
			t.Fatalf("Run ended before serving: %v\nlogs:\n%s", err, logs)
		default:
		}
		return logs.Find("listening") != nil || logs.Find("proxying") != nil
	})
	s.http = &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	if s.grpcAddr != "" {
		conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		s.conn, s.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	}
	t.Cleanup(func() {
		s.http.CloseIdleConnections()
		if s.conn != nil {
			s.conn.Close()
		}
		if err := s.stop(); err != nil {
			t.Errorf("Run: %v\nlogs:\n%s", err, s.logs)
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

// stop cancels the server's context and returns Run's result.
func (s *testServer) stop() error {
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err // a second stop sees the same result
		return err
	case <-time.After(15 * time.Second):
		return errors.New("Run did not return within 15s")
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
func writeFile(t testing.TB, path, content string) {
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
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
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

// nearMidnight reports whether a UTC day boundary is less than margin
// away, when the daily windows the tests count in could reset under them.
func nearMidnight(margin time.Duration) bool {
	now := time.Now().UTC()
	next := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	return next.Sub(now) < margin
}

// wantConfigError checks that New refuses c with a *ConfigError, whose
// text holds each of msgs.
func wantConfigError(t *testing.T, c Config, msgs ...string) {
	t.Helper()
	srv, logs, err := newServer(c)
	if err == nil {
		srv.Close()
		t.Fatalf("New accepted the Config; logs:\n%s", logs)
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Errorf("New = %v (%T), want a *ConfigError", err, err)
	}
	for _, m := range msgs {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("New = %v, want it to say %q", err, m)
		}
	}
}

// wantError checks that New refuses c with an error whose text holds msg.
func wantError(t *testing.T, c Config, msg string) {
	t.Helper()
	srv, logs, err := newServer(c)
	if err == nil {
		srv.Close()
		t.Fatalf("New accepted the Config; logs:\n%s", logs)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("New = %v, want it to say %q", err, msg)
	}
}
