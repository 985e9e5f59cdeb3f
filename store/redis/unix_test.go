package redis

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// TestUnixSocket decides through a redis-server's unix socket, with a
// password, and checks with the server that the store's connection is
// the socket's.
func TestUnixSocket(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "sluice") // a socket's path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "redis.sock")
	srv := testenv.StartRedis(t, "--unixsocket", sock, "--unixsocketperm", "700")
	if got := srv.Do("CONFIG", "SET", "requirepass", "s3cr/t"); got != "+OK" {
		t.Fatalf("CONFIG SET requirepass = %q", got)
	}

	cfg := DefaultConfig()
	if _, err := Open(context.Background(), "unix://"+sock, cfg); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("Open without the password = %v, want NOAUTH", err)
	}
	s := open(t, "unix://:"+url.PathEscape("s3cr/t")+"@"+sock, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := sluice.Limit{Rate: 2, Period: time.Hour}
	for i, want := range []bool{true, true, false} {
		d, err := sluice.Take(ctx, s, "unix-client", l, 1)
		if err != nil || d.Allowed != want {
			t.Fatalf("Take %d over the socket = %+v, %v; want allowed %v (2 an hour)", i+1, d, err, want)
		}
	}
	clients := srv.CLI("-a", "s3cr/t", "--no-auth-warning", "client", "list")
	if !strings.Contains(clients, "addr="+sock) {
		t.Errorf("no client of the server on its socket %s:\n%s", sock, clients)
	}
	if got := strings.TrimSpace(srv.CLI("-a", "s3cr/t", "--no-auth-warning", "exists", cfg.KeyPrefix+"unix-client")); got != "1" {
		t.Errorf("EXISTS %sunix-client = %q, want 1: the store wrote elsewhere", cfg.KeyPrefix, got)
	}
}

// FuzzParseURL parses arbitrary store URLs: each is refused with an error
// that does not show its password, or makes options that name a server.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"redis://u:p@h:1/2", "rediss://h", "redis+cluster://a:1,b:2", "redis+sentinel://s:1/m/3",
		"unix:///run/r.sock", "unix://:pw@/run/a@b.sock", "unix://", "unix://h/x", "redis://:x@", "unix://a:b@c@/d",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		opt, cluster, err := parseURL(raw, DefaultConfig())
		if err != nil {
			if opt.Password != "" || len(opt.InitAddress) > 0 {
				t.Fatalf("parseURL(%q) = %v and options", raw, err)
			}
			return
		}
		if len(opt.InitAddress) == 0 {
			t.Fatalf("parseURL(%q) names no server", raw)
		}
		if opt.Password != "" {
			// The user name as written, then the password hidden.
			scheme, rest, _ := strings.Cut(raw, "://")
			user, _, _ := strings.Cut(rest, ":")
			if want := scheme + "://" + user + ":xxxxx@"; !strings.HasPrefix(Redact(raw), want) {
				t.Fatalf("Redact(%q) = %q, want it to start with %q", raw, Redact(raw), want)
			}
		}
		if opt.DialCtxFn != nil {
			if cluster || len(opt.InitAddress) != 1 || !strings.HasPrefix(opt.InitAddress[0], "/") || !opt.ForceSingleClient {
				t.Fatalf("parseURL(%q): a unix socket's options %v %v", raw, opt.InitAddress, cluster)
			}
		}
	})
}
