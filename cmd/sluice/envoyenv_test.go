package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/transport/envoyrls"
)

// TestEnvoySettings maps Envoy ratelimit's environments onto flags.
func TestEnvoySettings(t *testing.T) {
	t.Parallel()
	// defaults are the settings of an Envoy environment that sets only a
	// trigger; each case states what differs.
	defaults := map[string]string{
		"http-addr":                     "0.0.0.0:8080",
		"grpc-addr":                     "0.0.0.0:8081",
		"ops-addr":                      "0.0.0.0:6070",
		"ops-pprof":                     "true",
		"log-level":                     "warn",
		"log-format":                    "text",
		"rules":                         "/srv/runtime_data/current/config",
		"rules-envoy-layout":            "true",
		"rules-ignore-dot-files":        "false",
		"rules-merge-domains":           "false",
		"shadow":                        "false",
		"response-headers":              "none",
		"envoy-metrics":                 "true",
		"near-limit-ratio":              "0.8",
		"grpc-max-connection-age":       "24h",
		"grpc-max-connection-age-grace": "1h",
		"statsd-addr":                   "localhost:8125", // USE_STATSD is on by default
		"statsd-flush-interval":         "10s",
		"store":                         "unix:///var/run/nutcracker/ratelimit.sock", // Envoy's REDIS_URL
		"envoy-redis-keys":              "true",
		"store-expiry-jitter":           "5m0s",
		"store-hard-timeout":            "10s", // Envoy's REDIS_TIMEOUT
	}
	statsdOff := map[string]string{"statsd-addr": "", "statsd-flush-interval": ""} // "": unset
	tests := []struct {
		name    string
		env     []string
		env2    []string          // more of env
		want    map[string]string // over defaults
		ignored []string
		err     string
	}{
		{name: "no Envoy variable", env: []string{"HOST=example", "PORT=9", "LOG_LEVEL=debug", "CACHE_KEY_PREFIX=x_"}, want: nil},
		{name: "a trigger alone", env: []string{"RUNTIME_ROOT=/srv/runtime_data/current"}, want: map[string]string{}},
		{
			name: "Envoy's example deployment",
			env: []string{"USE_STATSD=false", "LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379",
				"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true"},
			want: map[string]string{"log-level": "debug", "store": "redis://redis:6379", "rules": "/data/ratelimit/config",
				"rules-ignore-dot-files": "true", "statsd-addr": "", "statsd-flush-interval": ""},
		},
		{
			name: "listeners and logs",
			env: []string{"REDIS_URL=r:1", "HOST=127.0.0.1", "PORT=9000", "GRPC_HOST=::", "GRPC_PORT=9001", "DEBUG_PORT=9002",
				"LOG_LEVEL=WARNING", "LOG_FORMAT=JSON", "RUNTIME_APPDIRECTORY=rules"},
			env2: []string{"GRPC_MAX_CONNECTION_AGE=10m", "GRPC_MAX_CONNECTION_AGE_GRACE=30s"},
			want: map[string]string{"http-addr": "127.0.0.1:9000", "grpc-addr": "[::]:9001", "ops-addr": "0.0.0.0:9002",
				"grpc-max-connection-age": "10m", "grpc-max-connection-age-grace": "30s",
				"log-format": "envoy", "store": "redis://r:1", "rules": "/srv/runtime_data/current/rules"},
		},
		{
			name:    "gRPC on a unix socket instead of TCP",
			env:     []string{"REDIS_URL=r:1", "GRPC_UDS=/var/run/ratelimit/rl.sock", "GRPC_HOST=127.0.0.1", "GRPC_PORT=9001"},
			want:    map[string]string{"store": "redis://r:1", "grpc-addr": "", "grpc-unix": "/var/run/ratelimit/rl.sock"},
			ignored: []string{"GRPC_HOST", "GRPC_PORT"},
		},
		{
			name: "Prometheus",
			env:  []string{"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:9191", "PROMETHEUS_PATH=/stats"},
			want: map[string]string{"ops-addr": "0.0.0.0:6070,:9191"}, ignored: []string{"PROMETHEUS_PATH"},
		},
		{
			name: "Prometheus off",
			env:  []string{"USE_PROMETHEUS=false", "PROMETHEUS_ADDR=:9191"},
			want: map[string]string{}, ignored: []string{"PROMETHEUS_ADDR"},
		},
		{
			name: "a password and TLS",
			env: []string{"REDIS_URL=redis.internal:6380", "REDIS_AUTH=p@ss:word/1", "REDIS_TLS=true", "REDIS_TLS_CACERT=/ca.pem",
				"REDIS_TLS_CLIENT_CERT=/c.pem", "REDIS_TLS_CLIENT_KEY=/k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true"},
			want: map[string]string{"store": "rediss://p%40ss:word%2F1@redis.internal:6380", "store-ca": "/ca.pem",
				"store-cert": "/c.pem", "store-key": "/k.pem", "store-skip-hostname-verification": "true"},
		},
		{
			name: "Redis TLS files without TLS",
			env:  []string{"REDIS_URL=r:6379", "REDIS_TLS_CACERT=/ca.pem"},
			want: map[string]string{"store": "redis://r:6379"}, ignored: []string{"REDIS_TLS_CACERT"},
		},
		{
			name: "a password alone",
			env:  []string{"REDIS_URL=r:6379", "REDIS_AUTH=secret"},
			want: map[string]string{"store": "redis://:secret@r:6379"},
		},
		{
			name: "a cluster",
			env:  []string{"REDIS_TYPE=CLUSTER", "REDIS_URL=a:7000, b:7001", "REDIS_POOL_SIZE=20", "REDIS_PIPELINE_WINDOW=150us"},
			want: map[string]string{"store": "redis+cluster://a:7000,b:7001"}, ignored: []string{"REDIS_PIPELINE_WINDOW", "REDIS_POOL_SIZE"},
		},
		{
			name: "a sentinel",
			env:  []string{"REDIS_TYPE=sentinel", "REDIS_URL=mymaster,s1:26379,s2:26379", "REDIS_SENTINEL_AUTH=x"},
			want: map[string]string{"store": "redis+sentinel://s1:26379,s2:26379/mymaster", "store-sentinel-auth": "x"},
		},
		{
			name: "a sentinel's password without a sentinel",
			env:  []string{"REDIS_URL=r:1", "REDIS_SENTINEL_AUTH=x"},
			want: map[string]string{"store": "redis://r:1"}, ignored: []string{"REDIS_SENTINEL_AUTH"},
		},
		{
			name: "decisions, headers, metrics, near cache",
			env: []string{"BACKEND_TYPE=redis", "SHADOW_MODE=true", "LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_LIMIT_HEADER=X-Limit",
				"NEAR_LIMIT_RATIO=0.9", "LOCAL_CACHE_SIZE_IN_BYTES=1048576", "MERGE_DOMAIN_CONFIG=true", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false"},
			want: map[string]string{"shadow": "true", "response-headers": "all", "near-limit-ratio": "0.9", "near-cache": "1048576",
				"rules-merge-domains": "true"},
			ignored: []string{"LIMIT_LIMIT_HEADER"}, // STOP_...=false is Envoy's default, and sluice's with Envoy's keys
		},
		{
			name: "keys kept from counting while another is over",
			env:  []string{"REDIS_URL=r:1", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"},
			want: map[string]string{"store": "redis://r:1", "envoy-stop-increment": "true"},
		},
		{
			name: "gRPC TLS",
			env: []string{"REDIS_URL=r:1", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c.pem", "GRPC_SERVER_TLS_KEY=/k.pem",
				"GRPC_CLIENT_TLS_CACERT=/ca.pem", "GRPC_CLIENT_TLS_SAN=envoy"},
			want: map[string]string{"store": "redis://r:1", "tls-cert": "/c.pem", "tls-key": "/k.pem", "tls-client-ca": "/ca.pem",
				"tls-client-san": "envoy", "tls-listeners": "grpc"},
		},
		{
			name: "TLS files without TLS",
			env:  []string{"REDIS_URL=r:1", "GRPC_SERVER_TLS_CERT=/c.pem"},
			want: map[string]string{"store": "redis://r:1"}, ignored: []string{"GRPC_SERVER_TLS_CERT"},
		},
		{
			name: "what has no meaning here",
			env: []string{"REDIS_URL=r:1", "USE_STATSD=true", "STATSD_HOST=statsd", "TRACING_SAMPLING_RATE=0.5", "QUOTA_MODE=true",
				"RUNTIME_WATCH_ROOT=true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"},
			want:    map[string]string{"store": "redis://r:1", "statsd-addr": "statsd:8125"},
			ignored: []string{"QUOTA_MODE", "TRACING_SAMPLING_RATE"},
		},
		{
			name: "a per-second Redis",
			env: []string{"REDIS_URL=r:1", "REDIS_PERSECOND=true", "REDIS_PERSECOND_URL=ps:6380", "REDIS_PERSECOND_SOCKET_TYPE=tcp",
				"REDIS_PERSECOND_AUTH=pw", "REDIS_PERSECOND_TLS=true", "REDIS_PERSECOND_POOL_SIZE=5"},
			want:    map[string]string{"store": "redis://r:1", "store-per-second": "rediss://:pw@ps:6380"},
			ignored: []string{"REDIS_PERSECOND_POOL_SIZE"},
		},
		{
			name: "a per-second Redis at Envoy's default socket",
			env:  []string{"REDIS_URL=r:1", "REDIS_PERSECOND=true"},
			want: map[string]string{"store": "redis://r:1", "store-per-second": "unix:///var/run/nutcracker/ratelimitpersecond.sock"},
		},
		{
			name: "a per-second Sentinel",
			env: []string{"REDIS_URL=r:1", "REDIS_PERSECOND=true", "REDIS_PERSECOND_TYPE=SENTINEL",
				"REDIS_PERSECOND_URL=ps,s1:26379", "REDIS_PERSECOND_SENTINEL_AUTH=x"},
			want: map[string]string{"store": "redis://r:1", "store-per-second": "redis+sentinel://s1:26379/ps",
				"store-per-second-sentinel-auth": "x"},
		},
		{
			name: "Redis timeouts",
			env:  []string{"REDIS_URL=r:1", "REDIS_TIMEOUT=300ms"},
			want: map[string]string{"store": "redis://r:1", "store-hard-timeout": "300ms"},
		},
		{
			name: "the per-second Redis's timeout, the longer",
			env:  []string{"REDIS_URL=r:1", "REDIS_TIMEOUT=1s", "REDIS_PERSECOND=true", "REDIS_PERSECOND_URL=ps:6380", "REDIS_PERSECOND_TIMEOUT=2s"},
			want: map[string]string{"store": "redis://r:1", "store-per-second": "redis://ps:6380", "store-hard-timeout": "2s"},
		},
		{
			name: "the per-second Redis's timeout without REDIS_PERSECOND",
			env:  []string{"REDIS_URL=r:1", "REDIS_PERSECOND_TIMEOUT=2s"},
			want: map[string]string{"store": "redis://r:1"}, ignored: []string{"REDIS_PERSECOND_TIMEOUT"},
		},
		{
			name: "per-second settings without REDIS_PERSECOND",
			env:  []string{"REDIS_URL=r:1", "REDIS_PERSECOND_URL=ps:6380", "REDIS_PERSECOND_AUTH=pw"},
			want: map[string]string{"store": "redis://r:1"}, ignored: []string{"REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_URL"},
		},
		{
			name: "statsd",
			env: []string{"RUNTIME_ROOT=/r", "USE_STATSD=true", "STATSD_HOST=statsd-exporter", "STATSD_PORT=9125",
				"STATS_FLUSH_INTERVAL=1s", "STATSD_PROTOCOL=tcp", "EXTRA_TAGS=a:b"},
			want:    map[string]string{"rules": "/r/config", "statsd-addr": "statsd-exporter:9125", "statsd-flush-interval": "1s"},
			ignored: []string{"EXTRA_TAGS", "STATSD_PROTOCOL"},
		},
		{
			name:    "statsd off",
			env:     []string{"RUNTIME_ROOT=/r", "USE_STATSD=false", "STATSD_HOST=statsd-exporter", "STATS_FLUSH_INTERVAL=1s"},
			want:    merge(statsdOff, map[string]string{"rules": "/r/config"}),
			ignored: []string{"STATSD_HOST", "STATS_FLUSH_INTERVAL"},
		},
		{
			name:    "stats disabled",
			env:     []string{"RUNTIME_ROOT=/r", "DISABLE_STATS=true", "STATSD_PORT=1"},
			want:    merge(statsdOff, map[string]string{"rules": "/r/config"}),
			ignored: []string{"STATSD_PORT"},
		},
		{
			name:    "DogStatsD",
			env:     []string{"RUNTIME_ROOT=/r", "USE_DOG_STATSD=true", "STATSD_PORT=1"},
			want:    merge(statsdOff, map[string]string{"rules": "/r/config"}),
			ignored: []string{"STATSD_PORT", "USE_DOG_STATSD"},
		},
		{
			name: "expiry jitter",
			env:  []string{"REDIS_URL=r:1", "EXPIRATION_JITTER_MAX_SECONDS=10"},
			want: map[string]string{"store": "redis://r:1", "store-expiry-jitter": "10s"},
		},
		{
			name: "no expiry jitter",
			env:  []string{"REDIS_URL=r:1", "EXPIRATION_JITTER_MAX_SECONDS=0"},
			want: map[string]string{"store": "redis://r:1", "store-expiry-jitter": "0s"},
		},
		{
			name: "expiry jitter on Envoy's default Redis",
			env:  []string{"RUNTIME_ROOT=/r", "EXPIRATION_JITTER_MAX_SECONDS=10"},
			want: map[string]string{"rules": "/r/config", "store-expiry-jitter": "10s"},
		},
		{
			name: "the key prefix, for --envoy-redis-keys",
			env:  []string{"REDIS_URL=r:1", "CACHE_KEY_PREFIX=x_"},
			want: map[string]string{"store": "redis://r:1", "envoy-key-prefix": "x_"},
		},
		{
			name: "tracing with the SDK's endpoint",
			env: []string{"REDIS_URL=r:1", "TRACING_ENABLED=true", "TRACING_EXPORTER_PROTOCOL=grpc",
				"OTEL_EXPORTER_OTLP_ENDPOINT=http://otel:4317", "TRACING_SAMPLING_RATE=0.25", "TRACING_SERVICE_NAMESPACE=edge"},
			want: map[string]string{"store": "redis://r:1", "otlp-endpoint": "http://otel:4317", "otlp-protocol": "grpc",
				"trace-sample-ratio": "0.25", "trace-service-name": "RateLimit"},
			ignored: []string{"TRACING_SERVICE_NAMESPACE"},
		},
		{
			name: "tracing with Envoy's defaults",
			env:  []string{"REDIS_URL=r:1", "TRACING_ENABLED=true"},
			want: map[string]string{"store": "redis://r:1", "otlp-endpoint": "http://localhost:4318", "otlp-protocol": "http",
				"trace-sample-ratio": "1", "trace-service-name": "RateLimit"},
		},
		{
			name: "a unix socket",
			env:  []string{"REDIS_SOCKET_TYPE=unix", "REDIS_URL=/var/run/nutcracker/ratelimit.sock", "REDIS_AUTH=u:p/w"},
			want: map[string]string{"store": "unix://u:p%2Fw@/var/run/nutcracker/ratelimit.sock"},
		},
		{name: "a socket path by default", env: []string{"REDIS_URL=/var/run/redis.sock"}, want: map[string]string{"store": "unix:///var/run/redis.sock"}},
		{
			name: "a cluster's nodes over TCP whatever the socket type, as Envoy's",
			env:  []string{"REDIS_SOCKET_TYPE=unix", "REDIS_TYPE=cluster", "REDIS_URL=a:1,b:2"},
			want: map[string]string{"store": "redis+cluster://a:1,b:2"},
		},
		{name: "a unix socket with TLS", env: []string{"REDIS_SOCKET_TYPE=unix", "REDIS_URL=/r.sock", "REDIS_TLS=true"}, err: "REDIS_TLS"},
		{name: "a bad socket type", env: []string{"REDIS_SOCKET_TYPE=udp", "REDIS_URL=r:1"}, err: "REDIS_SOCKET_TYPE"},
		{name: "memcache", env: []string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=m:11211"}, err: "BACKEND_TYPE"},
		{name: "a bad CONFIG_TYPE", env: []string{"CONFIG_TYPE=GRPC_XDS_DELTA"}, err: "CONFIG_TYPE"},
		{
			name: "rules from xDS with Envoy's defaults",
			env:  []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "REDIS_URL=r:1", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/c.crt"},
			want: map[string]string{"store": "redis://r:1", "rules": "xds://localhost:18000", "rules-envoy-layout": "", "rules-ignore-dot-files": "",
				"rules-xds-node": "default", "rules-xds-retry": "3s", "rules-xds-retry-max": "60s", "rules-xds-retry-jitter": "0.5",
				"rules-xds-start-without-rules": "false"},
			ignored: []string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT"}, // without CONFIG_GRPC_XDS_SERVER_USE_TLS
		},
		{
			name: "Envoy Gateway's rate limit Deployment",
			env: []string{"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
				"LOG_LEVEL=info", "USE_STATSD=false", "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway.envoy-gateway-system.svc:18001",
				"CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit", "FORCE_START_WITHOUT_INITIAL_CONFIG=true", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379"},
			env2: []string{"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt",
				"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt",
				"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/certs/tls.crt", "GRPC_SERVER_TLS_KEY=/certs/tls.key", "GRPC_CLIENT_TLS_CACERT=/certs/ca.crt",
				"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=10s", "XDS_CLIENT_BACKOFF_JITTER=false", "CONFIG_GRPC_XDS_NODE_METADATA=cluster:eg"},
			want: map[string]string{"log-level": "info", "store": "redis://redis:6379", "statsd-addr": "", "statsd-flush-interval": "",
				"rules": "xds://envoy-gateway.envoy-gateway-system.svc:18001", "rules-envoy-layout": "", "rules-ignore-dot-files": "",
				"rules-xds-node": "envoy-ratelimit", "rules-xds-node-metadata": "cluster:eg", "rules-xds-retry": "10s", "rules-xds-retry-max": "60s",
				"rules-xds-retry-jitter": "0", "rules-xds-start-without-rules": "true",
				"rules-xds-tls": "true", "rules-xds-cert": "/certs/tls.crt", "rules-xds-key": "/certs/tls.key", "rules-xds-ca": "/certs/ca.crt",
				"tls-cert": "/certs/tls.crt", "tls-key": "/certs/tls.key", "tls-client-ca": "/certs/ca.crt", "tls-listeners": "grpc"},
			ignored: []string{"RUNTIME_IGNOREDOTFILES", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY"},
		},
		{name: "a bad boolean", env: []string{"REDIS_URL=r:1", "SHADOW_MODE=yes"}, err: "SHADOW_MODE"},
		{name: "a bad USE_STATSD", env: []string{"REDIS_URL=r:1", "USE_STATSD=sometimes"}, err: "USE_STATSD"},
		{name: "a bad log level", env: []string{"REDIS_URL=r:1", "LOG_LEVEL=loud"}, err: "LOG_LEVEL"},
		{name: "a bad Redis type", env: []string{"REDIS_URL=r:1", "REDIS_TYPE=ring"}, err: "REDIS_TYPE"},
		{name: "a bad per-second Redis type", env: []string{"REDIS_URL=r:1", "REDIS_PERSECOND=1", "REDIS_PERSECOND_TYPE=ring"}, err: "REDIS_PERSECOND_TYPE"},
		{name: "no Redis timeout", env: []string{"REDIS_URL=r:1", "REDIS_TIMEOUT=0"}, err: "REDIS_TIMEOUT"},
		{name: "a bad per-second Redis timeout", env: []string{"REDIS_URL=r:1", "REDIS_PERSECOND=true", "REDIS_PERSECOND_TIMEOUT=soon"}, err: "REDIS_PERSECOND_TIMEOUT"},
		{name: "a bad expiry jitter", env: []string{"REDIS_URL=r:1", "EXPIRATION_JITTER_MAX_SECONDS=-1"}, err: "EXPIRATION_JITTER_MAX_SECONDS"},
		{name: "a bad REDIS_PERSECOND", env: []string{"REDIS_URL=r:1", "REDIS_PERSECOND=on"}, err: "REDIS_PERSECOND"},
		{name: "two hosts, single", env: []string{"REDIS_URL=a:1,b:2"}, err: "REDIS_URL"},
		{name: "a sentinel without sentinels", env: []string{"REDIS_TYPE=sentinel", "REDIS_URL=mymaster"}, err: "REDIS_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, err := envoySettings(env(append(tt.env, tt.env2...)...))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || exitCode(err) != 2 {
					t.Fatalf("envoySettings = %v, want a usage error naming %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == nil {
				if e != nil {
					t.Fatalf("envoySettings = %+v, want nil (no Envoy environment)", e)
				}
				return
			}
			want := map[string]string{}
			for k, v := range defaults {
				want[k] = v
			}
			for k, v := range tt.want {
				want[k] = v
			}
			got := map[string]string{}
			fs := serveFlags(t)
			for _, s := range e.settings {
				if _, ok := fs.GetFlag(s.flag); !ok {
					t.Errorf("--%s: serve has no such flag", s.flag)
				}
				if _, dup := got[s.flag]; dup {
					t.Errorf("--%s set twice", s.flag)
				}
				got[s.flag] = s.value
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("--%s = %q, want %q", k, got[k], v)
				}
			}
			for k, v := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("--%s = %q, want it unset", k, v)
				}
			}
			if !slices.Equal(e.ignored, tt.ignored) {
				t.Errorf("ignored %q, want %q", e.ignored, tt.ignored)
			}
		})
	}
}

// TestEnvoySettingsApply checks precedence: flags and SLUICE_ variables
// win over Envoy's, which win over the config file; every value applies
// to a flag serve has.
func TestEnvoySettingsApply(t *testing.T) {
	t.Parallel()
	file := writeTemp(t, "sluice.yaml", "grpc-addr: \":1\"\nstore-timeout: 75ms\nhttp-addr: \":2\"\n")
	fs := serveFlags(t, "--config", file, "--log-level", "error")
	e, err := configure("serve", fs, env("REDIS_URL=r:6379", "SLUICE_GRPC_ADDR=:3", "PORT=9000", "LOG_LEVEL=debug"))
	if err != nil {
		t.Fatal(err)
	}
	if e == nil {
		t.Fatal("no Envoy environment seen")
	}
	for name, want := range map[string]string{
		"grpc-addr":     ":3",           // SLUICE_ over Envoy's and the file
		"http-addr":     "0.0.0.0:9000", // Envoy's over the file
		"log-level":     "error",        // the flag over Envoy's
		"store-timeout": "75ms",         // the file where Envoy says nothing
		"store":         "redis://r:6379",
	} {
		if got := flagValue(t, fs, name); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
	if len(e.ignored) != 0 {
		t.Errorf("ignored %q: every setting should have a flag", e.ignored)
	}
	// The proxy does not read Envoy's environment.
	if e, err := configure("proxy", serveFlags(t), env("REDIS_URL=r:6379")); err != nil || e != nil {
		t.Errorf("configure(proxy) = %v, %v; want no Envoy environment", e, err)
	}
}

// TestServeEnvoyEnvironment runs serve on nothing but an Envoy ratelimit
// environment, with its rules directory layout: it listens where Envoy's
// variables say, answers Envoy's /healthcheck and a decision, sends no
// rate limit headers (as Envoy by default), warns once about what it
// ignores, and serves Envoy's /rlconfig and /stats on the debug port.
func TestServeEnvoyEnvironment(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	rulesData, err := os.ReadFile(exampleRules)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.conf"), rulesData, 0o644); err != nil { // any extension
		t.Fatal(err)
	}
	getenv := env("RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
		"LOG_LEVEL=info", "LOG_FORMAT=json", "USE_STATSD=false", "STATSD_HOST=statsd-exporter", "EXTRA_TAGS=a:b",
		"SLUICE_STORE=memory") // no Redis: Envoy's keys are not counted
	logs := &testenv.Logs{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, getenv, io.Discard, logs) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v\n%s", err, logs)
		}
	}()
	var rec map[string]any
	eventually(t, "serve listens", func() bool { rec = logs.Find("listening"); return rec != nil })
	warn := logs.Find("Envoy ratelimit's variables without effect in sluice")
	if warn == nil || warn["level"] != "warning" || warn["@timestamp"] == nil || warn["msg"] != nil {
		t.Fatalf("no warning about ignored variables in Envoy's JSON (level warning, @timestamp, @message); logs:\n%s", logs)
	}
	if got, _ := warn["variables"].([]any); len(got) != 2 || got[0] != "EXTRA_TAGS" || got[1] != "STATSD_HOST" {
		t.Errorf("ignored variables %v, want [EXTRA_TAGS STATSD_HOST] (statsd is off)", warn["variables"])
	}
	httpAddr, _ := rec["http_addr"].(string)
	opsAddr, _ := rec["ops_addr"].(string)
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	for _, u := range []string{"http://" + httpAddr + "/healthcheck", "http://" + opsAddr + "/healthcheck"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "OK" {
			t.Errorf("GET %s = %d %q, want 200 OK", u, resp.StatusCode, b)
		}
	}
	resp, err := c.Post("http://"+httpAddr+"/json", "application/json", strings.NewReader(
		`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"},{"key":"path","value":"/login"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"requestsPerUnit":5`) {
		t.Errorf("POST /json = %d %s, want OK under the login limit read from the runtime directory", resp.StatusCode, b)
	}
	if h := resp.Header.Get("X-RateLimit-Limit") + resp.Header.Get("RateLimit"); h != "" {
		t.Errorf("rate limit headers %q sent; Envoy sends none without LIMIT_RESPONSE_HEADERS_ENABLED", h)
	}
	resp, err = c.Get("http://" + opsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `ratelimit_service_rate_limit_total_hits{domain="api",key1="user",key2="path_/login"} 1`) {
		t.Errorf("/metrics lacks Envoy's total_hits of the login rule:\n%s", b)
	}
	// Envoy's debug port: the rules in force and the stats, as Envoy's.
	for path, wants := range map[string][]string{
		"/rlconfig": {"api.user.path_/login: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false\n",
			"api.user.path_/export: unit=DAY requests_per_unit=150, shadow_mode: true, quota_mode: false\n",
			"api.user.path_/healthz: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n",
			"api.user: unit=SECOND requests_per_unit=30, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 100\n"},
		"/stats": {"ratelimit.service.rate_limit.api.user.path_/login.total_hits: 1\n",
			"ratelimit.service.rate_limit.api.user.path_/login.within_limit: 1\n", "ratelimit.service.config_load_success: 1\n"},
		"/": {"/debug/pprof/: root of various pprof endpoints. hit for help.\n/debug/pprof/profile: CPU profiling endpoint\n" +
			"/debug/pprof/trace: trace endpoint\n/rlconfig: print out the currently loaded configuration for debugging\n/stats: print out stats\n"},
		"/debug/pprof/": {"goroutine"},
	} {
		resp, err := c.Get("http://" + opsAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range wants {
			if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
				t.Errorf("GET %s on the debug port: %d, lacks %q:\n%s", path, resp.StatusCode, want, b)
			}
		}
	}
}

// TestEnvoyStoreDefaults: in Envoy's environment the store is Envoy's
// Redis, its default socket included, with Envoy's keys; a memory store
// a flag or SLUICE_STORE chose counts no Envoy keys, and then
// CACHE_KEY_PREFIX is named as without effect (issue 24.5).
func TestEnvoyStoreDefaults(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "redis.sock")
	for _, tc := range []struct {
		name    string
		args    []string
		env     []string
		want    map[string]string
		ignored []string
		err     string
	}{
		{name: "no REDIS_URL, no socket at Envoy's default", env: []string{"RUNTIME_ROOT=/r"},
			err: "REDIS_URL is unset, and nothing is at Envoy's default, the socket /var/run/nutcracker/ratelimit.sock"},
		{name: "a socket that is not there", env: []string{"REDIS_URL=" + sock}, err: "Redis socket " + sock + ": nothing is there"},
		{name: "no REDIS_URL over TCP", env: []string{"REDIS_SOCKET_TYPE=tcp"}, err: "REDIS_URL is unset, and nothing is at Envoy's default"},
		{name: "no per-second URL", env: []string{"REDIS_URL=r:1", "REDIS_PERSECOND=true"},
			err: "REDIS_PERSECOND_URL is unset, and nothing is at Envoy's default, the socket /var/run/nutcracker/ratelimitpersecond.sock"},
		{name: "a memory store instead", env: []string{"RUNTIME_ROOT=/r", "SLUICE_STORE=memory", "CACHE_KEY_PREFIX=x_"},
			want: map[string]string{"store": "memory", "envoy-redis-keys": "false", "store-expiry-jitter": "0s"}, ignored: []string{"CACHE_KEY_PREFIX"}},
		{name: "Envoy's Redis and keys", env: []string{"REDIS_URL=r:6379", "CACHE_KEY_PREFIX=x_"},
			want: map[string]string{"store": "redis://r:6379", "envoy-redis-keys": "true", "envoy-key-prefix": "x_", "store-expiry-jitter": "5m0s"}},
		{name: "Envoy's keys opted out", args: []string{"--envoy-redis-keys=false"}, env: []string{"REDIS_URL=r:6379", "CACHE_KEY_PREFIX=x_"},
			want: map[string]string{"store": "redis://r:6379", "envoy-redis-keys": "false"}, ignored: []string{"CACHE_KEY_PREFIX"}},
		{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT without Envoy's keys", args: []string{"--envoy-redis-keys=false"},
			env:     []string{"REDIS_URL=r:6379", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"},
			want:    map[string]string{"store": "redis://r:6379", "envoy-redis-keys": "false", "envoy-stop-increment": "true"},
			ignored: []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"}},
		{name: "opted out by SLUICE_", env: []string{"REDIS_URL=r:6379", "SLUICE_ENVOY_REDIS_KEYS=false"},
			want: map[string]string{"envoy-redis-keys": "false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := serveFlags(t, tc.args...)
			e, err := configure("serve", fs, env(tc.env...))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || exitCode(err) != 2 {
					t.Fatalf("configure = %v, want a usage error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range tc.want {
				if got := flagValue(t, fs, name); got != want {
					t.Errorf("--%s = %q, want %q", name, got, want)
				}
			}
			if !slices.Equal(e.ignored, tc.ignored) {
				t.Errorf("ignored %q, want %q", e.ignored, tc.ignored)
			}
		})
	}
}

// TestServeEnvoyKeysByDefault runs serve on Envoy ratelimit's variables
// and a real Redis: it counts in Envoy's key, as an Envoy pod beside it
// does, so the two share one count (14 of 14 calls passed a 10-a-minute
// limit split over an Envoy and a sluice pod when sluice used its own
// keys); SLUICE_ENVOY_REDIS_KEYS=false makes it count in its own.
func TestServeEnvoyKeysByDefault(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	if time.Now().Add(time.Minute).YearDay() != time.Now().YearDay() {
		t.Skip("the day's window may turn under the test")
	}
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	domain := "envoydefault" + strconv.FormatInt(time.Now().UnixNano(), 36)
	writeFile(t, filepath.Join(cfgDir, "config.yaml"), "domain: "+domain+"\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 10}\n")
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := domain + "_user_alice_" + strconv.FormatInt(time.Now().Unix()/86400*86400, 10)
	count := func() string {
		v, err := c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			return "none"
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// An Envoy pod counted 4 of alice's calls.
	if err := c.Do(ctx, c.B().Set().Key(key).Value("4").Ex(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, more, want string
		remaining        string
	}{
		{"Envoy's keys", "", "5", `"limitRemaining":5`},
		{"sluice's own", "SLUICE_ENVOY_REDIS_KEYS=false", "5", `"limitRemaining":9`},
	} {
		getenv := env("RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+addr,
			"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
			"LOG_FORMAT=json", "LOG_LEVEL=info", "USE_STATSD=false", tc.more,
			// A first call that overruns the 50ms default on a loaded machine
			// is counted by Redis and answered as slow, and the retry below
			// would count alice twice.
			"SLUICE_STORE_TIMEOUT=10s")
		logs := &testenv.Logs{}
		sctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- run(sctx, []string{"serve"}, getenv, io.Discard, logs) }()
		var rec map[string]any
		eventually(t, tc.name+": serve listens", func() bool { rec = logs.Find("listening"); return rec != nil })
		httpAddr, _ := rec["http_addr"].(string)
		var body string
		eventually(t, tc.name+": a decision from Redis", func() bool {
			resp, err := http.Post("http://"+httpAddr+"/json", "application/json",
				strings.NewReader(`{"domain":"`+domain+`","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`))
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			return resp.StatusCode == 200 && strings.Contains(body, `"overallCode":"OK"`) && !strings.Contains(body, "FAIL") &&
				!strings.Contains(body, envoyrls.ModeKey) // decided by the store, not by --fail
		})
		stop()
		if err := <-done; err != nil {
			t.Fatalf("%s: serve: %v\n%s", tc.name, err, logs)
		}
		if got := count(); got != tc.want || !strings.Contains(body, tc.remaining) {
			t.Errorf("%s: Envoy's key %s counts %s, want %s; answer %s (want %s)", tc.name, key, got, tc.want, body, tc.remaining)
		}
	}
}

// FuzzEnvoySettings reads arbitrary values of Envoy's variables: each is
// either refused with a usage error naming it, or makes settings that
// serve's flags take or refuse with a usage error.
func FuzzEnvoySettings(f *testing.F) {
	f.Add("redis:6379", "", "SINGLE", "tcp", "info", "8080", "false", "", "", "")
	f.Add("mymaster,s1:26379", "u:p@ss", "sentinel", "", "WARN", "0", "true", "", "x", "ps:1")
	f.Add("a:1,b:2", "pw", "cluster", "TCP", "debug", "x", "1", "/tmp/rl.sock", "", "")
	f.Add("/var/run/r.sock", "", "", "unix", "", "", "", "rl.sock", "u:p", "/ps.sock")
	f.Fuzz(func(t *testing.T, url, auth, typ, socket, level, port, flag, uds, sentinelAuth, perSecond string) {
		getenv := env("REDIS_URL="+url, "REDIS_AUTH="+auth, "REDIS_TYPE="+typ, "REDIS_SOCKET_TYPE="+socket,
			"LOG_LEVEL="+level, "PORT="+port, "SHADOW_MODE="+flag, "REDIS_TLS="+flag, "RUNTIME_ROOT=/r", "GRPC_UDS="+uds,
			"REDIS_SENTINEL_AUTH="+sentinelAuth, "REDIS_PERSECOND="+flag, "REDIS_PERSECOND_URL="+perSecond,
			"REDIS_PERSECOND_TYPE="+typ, "REDIS_PERSECOND_AUTH="+auth, "EXPIRATION_JITTER_MAX_SECONDS="+port)
		e, err := envoySettings(getenv)
		if err != nil {
			if exitCode(err) != 2 {
				t.Fatalf("envoySettings = %v, want a usage error", err)
			}
			return
		}
		if e == nil {
			t.Fatal("no Envoy environment though RUNTIME_ROOT is set")
		}
		if err := e.apply(serveFlags(t)); err != nil && exitCode(err) != 2 {
			t.Fatalf("apply = %v, want nil or a usage error", err)
		}
	})
}

func TestCommandArgs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		argv, want []string
	}{
		{argv: []string{"/bin/ratelimit"}, want: []string{"serve"}},         // Envoy's image's command
		{argv: []string{"ratelimit", "version"}, want: []string{"version"}}, // arguments: as they are
		{argv: []string{"/sluice"}, want: []string{}},                       // sluice's own name: the usage
		{argv: []string{"/sluice", "serve", "--rules", "r"}, want: []string{"serve", "--rules", "r"}},
		{argv: nil, want: nil},
	} {
		if got := commandArgs(tt.argv); !slices.Equal(got, tt.want) {
			t.Errorf("commandArgs(%q) = %q, want %q", tt.argv, got, tt.want)
		}
	}
}

// merge returns the union of maps, the later ones winning.
func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// TestServeEnvoyRuntimeAbsent: in Envoy's environment a runtime directory
// that is not there yet warns and starts, as Envoy's ratelimit does (every
// request passing), and the rules are in force once it is published
// (issue 24.5; serve ended with "load rules: ... no such file" before).
func TestServeEnvoyRuntimeAbsent(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	getenv := env("RUNTIME_ROOT="+filepath.Join(root, "current"), "RUNTIME_SUBDIRECTORY=ratelimit",
		"SLUICE_STORE=memory", "USE_STATSD=false", "LOG_LEVEL=info")
	s := startServer(t, getenv, "--ops-addr", "127.0.0.1:0")
	warn := s.logs.Find("no rules yet: nothing is there; every request passes unlimited until rules appear there")
	if warn == nil || warn["level"] != "WARN" {
		t.Fatalf("no warning that the runtime directory is missing; logs:\n%s", s.logs)
	}
	const req = `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"},{"key":"path","value":"/login"}]}]}`
	if r := s.do(t, "POST", "/json", req); r.code != 200 || strings.Contains(r.body, "requestsPerUnit") {
		t.Fatalf("POST /json without rules = %d %s, want OK with no limit", r.code, r.body)
	}
	rulesData, err := os.ReadFile(exampleRules)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(root, "v1", "ratelimit", "config")
	if err := os.MkdirAll(cfg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg, "rules"), rulesData, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("v1", filepath.Join(root, "current")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the published rules in force", func() bool {
		return strings.Contains(s.do(t, "POST", "/json", req).body, `"requestsPerUnit":5`)
	})
}
