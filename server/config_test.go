package server

import (
	"testing"
)

// TestNewErrors checks the settings New refuses, before it listens. (An
// unreachable Redis is no error: the server starts in its fail mode, see
// TestServeStartsWithoutRedis.)
func TestNewErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		set  func(c *Config)
		msg  string
	}{
		{"bad redis URL", func(c *Config) { c.Store.URL = "redis://127.0.0.1:1/0?db=2" }, "--store: redis store URL redis://127.0.0.1:1/0?db=2: query parameters are not supported"},
		{"unknown store", func(c *Config) { c.Store.URL = "etcd://x" }, "unknown store"},
		{"a sentinel's password without a sentinel", func(c *Config) { c.Store.URL, c.Store.SentinelAuth = "redis://:pw@127.0.0.1:1", "x" },
			"--store-sentinel-auth: --store redis://:xxxxx@127.0.0.1:1 names no sentinel"},
		{"a sentinel's password for memory", func(c *Config) { c.Store.SentinelAuth = "x" }, "--store-sentinel-auth: --store is memory"},
		{"no gRPC listener", func(c *Config) { c.GRPC.Addr = NoAddr }, "--grpc-addr and --grpc-unix are both empty"},
		{"a per-second sentinel's password without a per-second Redis", func(c *Config) {
			c.Store.URL, c.Store.PerSecondSentinelAuth = "redis://127.0.0.1:1", "x"
		}, "--store-per-second-sentinel-auth: there is no --store-per-second"},
		{"a per-second sentinel's password without a sentinel", func(c *Config) {
			c.Store.URL, c.Store.PerSecond, c.Store.PerSecondSentinelAuth = "redis://127.0.0.1:1", "redis://127.0.0.1:2", "x"
		}, "--store-per-second-sentinel-auth: --store-per-second redis://127.0.0.1:2 names no sentinel"},
		{"a per-second Redis beside memory", func(c *Config) { c.Store.PerSecond = "redis://127.0.0.1:1" }, "--store-per-second: --store is memory"},
		{"a per-second store that is no Redis", func(c *Config) { c.Store.URL, c.Store.PerSecond = "redis://127.0.0.1:1", "memory" },
			"--store-per-second \"memory\": want a Redis URL"},
		{"a bad per-second Redis URL", func(c *Config) { c.Store.URL, c.Store.PerSecond = "redis://127.0.0.1:1", "redis://:pw@h:1?x" },
			"--store-per-second: redis store URL redis://:xxxxx@h:1?x"},
		{"broken rules", func(c *Config) { c.Rules.Source = "testdata/does-not-exist.yaml" }, "load rules"},
		{"address in use", func(c *Config) { c.GRPC.Addr, c.HTTP.Addr = "127.0.0.1:1", "256.0.0.1:0" }, "listen"},
		{"no rules", func(c *Config) { c.Rules.Source = "" }, "--rules (or $SLUICE_RULES) is required"},
		{"negative entries", func(c *Config) { c.Store.MaxEntries = -5 }, "memory store"},
		{"too little memory for the store", func(c *Config) { c.Store.MaxMemory = 1 << 10 }, "memory store"},
		{"too many top keys", func(c *Config) { c.Observe.TopKeys = 1 << 20 }, "--top-keys"},
		{"too wide a sketch", func(c *Config) { c.Observe.TopWidth = 1 << 30 }, "--top-width"},
		{"a negative lease", func(c *Config) { c.Store.LeaseLifetime = -1 }, "--lease-lifetime"},
		{"a negative concurrency lease", func(c *Config) { c.ConcurrencyLease = -1 }, "--concurrency-lease"},
		{"a negative expiry jitter", func(c *Config) { c.Store.URL, c.Store.ExpiryJitter = "redis://127.0.0.1:1", -1 }, "--store-expiry-jitter"},
		{"a proxy without an upstream", func(c *Config) { c.Proxy = &ProxyConfig{} }, "--upstream"},
		{"a proxy to no HTTP URL", func(c *Config) { c.Proxy = &ProxyConfig{Upstream: "ftp://x"} }, "want an http:// or https:// URL"},
		{"an identity file forward-auth cannot use", func(c *Config) { c.Identity = "testdata/no-forward-auth.yaml" },
			"--identity testdata/no-forward-auth.yaml: forwardauth: the identity file names no forward_auth_headers"},
		{"Envoy's near-limit ratio above 1", func(c *Config) { c.Envoy = EnvoyConfig{Metrics: true, NearLimitRatio: 2} }, "--near-limit-ratio"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := testConfig(exampleRules)
			tt.set(&c)
			wantError(t, c, tt.msg)
		})
	}
}
