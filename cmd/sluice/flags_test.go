package main

import (
	"context"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/transport/respond"
)

// settingsOf returns the settings of the command cmd ("serve" or "proxy")
// that args, the environment of getenv and a config file make.
func settingsOf(t *testing.T, cmd string, getenv func(string) string, args ...string) (*settings, error) {
	t.Helper()
	var s *settings
	var c *ff.Command
	if cmd == "proxy" {
		s = newSettings(forProxy)
		c = proxyCommandOf(s, io.Discard)
	} else {
		s = newSettings(forServe)
		c = serveCommandOf(s, io.Discard)
	}
	addConfigFlag([]*ff.Command{c})
	if err := c.Flags.Parse(args); err != nil {
		return nil, err
	}
	_, err := configure(cmd, c.Flags, getenv)
	return s, err
}

// TestSettings maps flags, SLUICE_ variables, Envoy's variables and a
// config file onto server.Config: each case states how its Config differs
// from DefaultConfig.
func TestSettings(t *testing.T) {
	t.Parallel()
	file := writeTemp(t, "sluice.yaml", "rules: from-file.yaml\nops-addr: [\"127.0.0.1:1\", \"127.0.0.1:2\"]\nstore-timeout: 75ms\nfail: local\n")
	tests := []struct {
		name string
		cmd  string
		args []string
		env  []string
		want func(c *server.Config)
	}{
		{name: "defaults", want: func(*server.Config) {}},
		{name: "flags", args: []string{"--rules", "r.yaml", "--grpc-addr", ":1", "--http-addr", ":2", "--store", "redis://s:6379",
			"--fail", "closed", "--sync", "lease", "--response-headers", "ratelimit,retry-after", "--max-memory", "64MiB",
			"--tls-listeners", "grpc,admin", "--grpc-unix", "/s.sock", "--grpc-unix-mode", "600", "--envoy-metrics", "--top-keys", "3"},
			want: func(c *server.Config) {
				c.Rules.Source, c.GRPC.Addr, c.HTTP.Addr, c.Store.URL = "r.yaml", ":1", ":2", "redis://s:6379"
				c.Fail, c.FailExplicit, c.Store.Sync, c.Store.MaxMemory = decide.FailClosed, true, sluice.Lease, 64<<20
				c.ResponseHeaders = respond.HeaderRateLimit | respond.HeaderRetryAfter
				c.TLS.Listeners, c.GRPC.Unix, c.GRPC.UnixMode = []string{"grpc", "admin"}, "/s.sock", 0o600
				c.Envoy.Metrics, c.Observe.TopKeys = true, 3
			}},
		{name: "a flag's 0 or empty that turns something off", args: []string{"--near-cache", "0", "--retry-jitter", "0s", "--deny-log-rate", "0",
			"--trace-sample-ratio", "0", "--shutdown-timeout", "0s", "--grpc-addr", "", "--grpc-reflection=false", "--response-headers", "none"},
			want: func(c *server.Config) {
				c.Store.NearCache, c.RetryJitter, c.Observe.DenyLogRate, c.Tracing.SampleRatio, c.ShutdownTimeout = -1, -1, -1, -1, -1
				c.GRPC.Addr, c.GRPC.NoReflection, c.ResponseHeaders = server.NoAddr, true, respond.NoHeaders
			}},
		{name: "the environment, under the flags", args: []string{"--store", "memory://flag"},
			env: []string{"SLUICE_STORE=memory://env", "SLUICE_OPS_ADDR=127.0.0.1:1,127.0.0.1:2", "SLUICE_FAIL=local", "SLUICE_PPROF=true"},
			want: func(c *server.Config) {
				c.Store.URL, c.OpsAddrs, c.Fail, c.HTTP.Pprof = "memory://flag", []string{"127.0.0.1:1", "127.0.0.1:2"}, decide.FailLocal, true
				c.FailExplicit = true
			}},
		{name: "a config file, under the environment", args: []string{"--config", file}, env: []string{"SLUICE_STORE_TIMEOUT=1s"},
			want: func(c *server.Config) {
				c.Rules.Source, c.OpsAddrs, c.StoreTimeout = "from-file.yaml", []string{"127.0.0.1:1", "127.0.0.1:2"}, time.Second
				c.FailExplicit = true // fail: local, the default, given
			}},
		{name: "Envoy's environment", env: []string{"REDIS_URL=r:6379", "PORT=9000", "USE_STATSD=false", "GRPC_UDS=/rl.sock", "SHADOW_MODE=true"},
			want: func(c *server.Config) {
				c.Rules.Source, c.Rules.EnvoyLayout = "/srv/runtime_data/current/config", true
				c.HTTP.Addr, c.GRPC.Addr, c.GRPC.Unix, c.OpsAddrs, c.OpsPprof = "0.0.0.0:9000", server.NoAddr, "/rl.sock", []string{"0.0.0.0:6070"}, true
				c.GRPC.MaxConnectionAge, c.GRPC.MaxConnectionAgeGrace = 24*time.Hour, time.Hour
				c.Store.URL, c.Store.ExpiryJitter, c.Store.EnvoyKeys, c.Shadow = "redis://r:6379", 5*time.Minute, true, true
				c.Envoy.Metrics, c.ResponseHeaders = true, respond.NoHeaders
			}},
		{name: "the proxy", cmd: "proxy", args: []string{"--upstream", "http://u:1", "--listen", ":3", "--domain", "edge",
			"--max-delay", "2s", "--max-waiting", "5", "--shed", "--identity", "id.yaml"},
			env: []string{"REDIS_URL=ignored:6379"}, // the proxy reads no Envoy environment
			want: func(c *server.Config) {
				c.Proxy = &server.ProxyConfig{Upstream: "http://u:1", Listen: ":3", Domain: "edge", MaxDelay: 2 * time.Second, MaxWaiting: 5, Shed: true}
				c.Identity = "id.yaml"
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := tt.cmd
			if cmd == "" {
				cmd = "serve"
			}
			s, err := settingsOf(t, cmd, env(tt.env...), tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			want := server.DefaultConfig()
			if cmd == "proxy" {
				p := server.DefaultProxyConfig()
				want.Proxy = &p
			}
			tt.want(&want)
			if !reflect.DeepEqual(s.cfg, want) {
				t.Errorf("Config\n%+v\nwant\n%+v", s.cfg, want)
			}
		})
	}
}

// TestSettingsRefused checks the flag values refused before the server
// is made (exit status 2): a 0 that would mean the default, permissions
// that are not, an empty store.
func TestSettingsRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--grpc-unix", "/x.sock", "--grpc-unix-mode", "0800"},
		{"--grpc-unix", "/x.sock", "--grpc-unix-mode", "1777"},
		{"--store", ""},
		{"--statsd-flush-interval", "0s"},
		{"--sync-interval", "0s"},
		{"--async-nodes", "0"},
		{"--max-lease", "-1"},
		{"--top-keys", "0"},
		{"--top-width", "0"},
		{"--concurrency-lease", "0s"},
		{"--fail", "sideways"},
		{"--sync", "later"},
		{"--response-headers", "x-foo"},
		{"--log-level", "loud"},
		{"--log-format", "xml"},
		{"--otlp-protocol", "pigeon"},
		{"--tls-listeners", "grpc,nope"},
	} {
		all := append([]string{"serve", "--rules", exampleRules, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...)
		err := run(context.Background(), all, env(), io.Discard, io.Discard)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), strings.TrimPrefix(args[len(args)-2], "--")) {
			t.Errorf("%q = %v, want a usage error naming %s", args, err, args[len(args)-2])
		}
	}
}

// TestServeRefusals checks that a setting the server refuses is a usage
// error (exit status 2) naming it.
func TestServeRefusals(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--grpc-addr", ""},
		{"--store-sentinel-auth", "x"},
		{"--envoy-redis-keys"},
	} {
		all := append([]string{"serve", "--rules", exampleRules, "--http-addr", "127.0.0.1:0"}, args...)
		err := run(context.Background(), all, env(), io.Discard, io.Discard)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%q = %v, want a usage error naming %s", args, err, args[0])
		}
	}
}
