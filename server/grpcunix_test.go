package server

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// socketDir returns a new directory with a short path for unix sockets
// (a socket's path is at most 107 bytes; t.TempDir's can be longer),
// removed when the test ends.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// staleSocket leaves at path the socket file of a listener that is gone,
// as a process that was killed leaves it.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
		t.Fatalf("no stale socket at %s: %v", path, err)
	}
}

// TestServeGRPCUnixSocket serves gRPC on a unix socket alone (as Envoy's
// GRPC_UDS asks) over a stale socket: it replaces the socket, serves the
// rate limit and health services on it to a real gRPC client, with the
// socket's permissions 0660 and no TCP gRPC listener, and removes the
// socket when it stops.
func TestServeGRPCUnixSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(socketDir(t), "rl.sock")
	staleSocket(t, sock)
	rules := writeTemp(t, "rules.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	c := testConfig(rules)
	c.GRPC.Addr, c.GRPC.Unix = NoAddr, sock
	s := startServer(t, c)
	rec := s.logs.Find("listening")
	if rec["grpc_unix"] != sock || rec["grpc_addr"] != "" {
		t.Errorf("listening on grpc_addr %q, grpc_unix %q; want only the socket %s", rec["grpc_addr"], rec["grpc_unix"], sock)
	}
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Fatalf("the socket: %v, %v; want a socket with permissions 0660", fi, err)
	}

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	h, err := healthpb.NewHealthClient(conn).Check(rctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of ratelimit over the socket = %v, %v; want SERVING", h, err)
	}
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "unix")}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := rls.ShouldRateLimit(rctx, req)
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("call %d over the socket = %v, %v; want %v (2 an hour)", i+1, resp, err, want)
		}
	}

	if err := s.stop(); err != nil {
		t.Fatalf("Run: %v\n%s", err, s.logs)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the socket is still there after serve stopped: %v", err)
	}
}

// TestListenUnixRefuses checks that listenUnix replaces only a stale
// socket: a socket another process serves on, and a file that is not a
// socket, are left alone and refused.
func TestListenUnixRefuses(t *testing.T) {
	t.Parallel()
	dir := socketDir(t)
	ctx := context.Background()

	live := filepath.Join(dir, "live.sock")
	other, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if ln, err := listenUnix(ctx, live, 0o600); err == nil || !strings.Contains(err.Error(), "another process") {
		if ln != nil {
			ln.Close()
		}
		t.Errorf("listenUnix on a live socket = %v, want a refusal naming another process", err)
	}
	if _, err := os.Lstat(live); err != nil {
		t.Errorf("the live socket was removed: %v", err)
	}

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ln, err := listenUnix(ctx, file, 0o600); err == nil || !strings.Contains(err.Error(), "not a socket") {
		if ln != nil {
			ln.Close()
		}
		t.Errorf("listenUnix on a regular file = %v, want a refusal", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Errorf("the regular file was touched: %q, %v", b, err)
	}

	fresh := filepath.Join(dir, "fresh.sock")
	ln, err := listenUnix(ctx, fresh, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(fresh); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode of a new socket: %v, %v; want 0600", fi, err)
	}
	ln.Close()
	if _, err := os.Lstat(fresh); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("closing the listener left the socket: %v", err)
	}
}
