package main

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/server"
)

// Envoy ratelimit's environment, read by `sluice serve` so that a
// Deployment of Envoy's ratelimit runs sluice by changing its image.
//
// The variables are those of Envoy ratelimit's settings (its
// src/settings/settings.go), with its defaults. sluice reads them only
// when one of envoyTriggers is set: a Deployment of Envoy's ratelimit sets
// some of them, since its defaults (rules under /srv/runtime_data/current,
// Redis through a nutcracker unix socket, statsd on localhost) rarely fit;
// generic names such as HOST, PORT or LOG_LEVEL alone do not switch it on.
// Flags and SLUICE_ variables win over Envoy's variables, which win over
// the --config file.

// envoyTriggers are the variables whose presence says that the process
// runs with Envoy ratelimit's environment.
var envoyTriggers = []string{
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY",
	"REDIS_URL", "REDIS_SOCKET_TYPE", "REDIS_TYPE", "BACKEND_TYPE",
	"USE_STATSD", "USE_PROMETHEUS", "CONFIG_TYPE",
}

// Envoy's RUNTIME_WATCH_ROOT and HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
// ask for what sluice does anyway (it reloads on any change below the
// rules directory, and is ready once the rules are read; a runtime
// directory missing or empty reads as no rules, with a warning, as
// Envoy's does): they are neither read nor named.

// envoyIgnored are Envoy's variables that have no effect in sluice: they
// are named in the startup warning when set. The variables envoyTable
// maps are not listed here; some of them are ignored in some cases (TLS
// files without GRPC_SERVER_USE_TLS, say), and then named too.
var envoyIgnored = []string{
	// stats: tags, DogStatsD, and the Prometheus sink's mapping (sluice
	// serves Prometheus metrics under the default mapping's names)
	"EXTRA_TAGS", "USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "PROMETHEUS_MAPPER_YAML",
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
	// Redis settings that sluice's client sets itself (it pipelines, and
	// --store-timeout bounds a decision's wait)
	"REDIS_POOL_SIZE", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
	"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME",
	// the per-second Redis's settings that sluice's client sets itself
	"REDIS_PERSECOND_POOL_SIZE",
	"REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT",
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
	"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
	// memcache (BACKEND_TYPE=memcache is refused)
	"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS",
	"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT",
	"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	// headers: sluice sends the IETF draft's fields and X-RateLimit-*
	"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER",
	// other modes
	"QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA",
	// tracing: the resource attributes beside service.name
	"TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
}

// envoyGroup is a part of Envoy's settings that applies when its
// condition holds: then each of its rows sets a flag; otherwise the
// variables of unused that are set have no effect and are named.
type envoyGroup struct {
	when   func(r *envoyReader) bool // nil: always
	unused []string
	rows   []envoyRow
}

// envoyRow sets the flag from the value Envoy's variables give it. A row
// without a flag only checks its variables.
type envoyRow struct {
	flag  string
	from  []string                            // the variables, for messages
	value func(r *envoyReader) (string, bool) // false: leave the flag alone
}

// envoyWhen are asked, by flag, as a value of Envoy's is about to be set
// (nothing set the flag before): false leaves the flag alone, an error
// stops sluice.
var envoyWhen = map[string]func(fs ff.Flags, value string) (bool, error){
	"store":               socketThere,
	"store-per-second":    socketThere,
	"envoy-redis-keys":    redisStore,
	"store-expiry-jitter": redisStore,
}

// envoyTable is how Envoy ratelimit's variables map onto serve's flags.
var envoyTable = []envoyGroup{
	{rows: []envoyRow{ // listeners, with Envoy's defaults: all interfaces
		{"http-addr", vars("HOST", "PORT"), hostPort("HOST", "0.0.0.0", "PORT", "8080")},
		{"grpc-max-connection-age", vars("GRPC_MAX_CONNECTION_AGE"), plain("GRPC_MAX_CONNECTION_AGE", "24h")},
		{"grpc-max-connection-age-grace", vars("GRPC_MAX_CONNECTION_AGE_GRACE"), plain("GRPC_MAX_CONNECTION_AGE_GRACE", "1h")},
		{"ops-addr", vars("DEBUG_HOST", "DEBUG_PORT", "USE_PROMETHEUS", "PROMETHEUS_ADDR"), opsAddr},
		{"ops-pprof", vars("DEBUG_HOST", "DEBUG_PORT"), constant("true")}, // Envoy's debug port serves them
		{"log-level", vars("LOG_LEVEL"), logLevel},
		{"log-format", vars("LOG_FORMAT"), func(r *envoyReader) (string, bool) {
			if f := strings.ToLower(r.get("LOG_FORMAT", "text")); f != "json" {
				return f, true
			}
			return "envoy", true // JSON with Envoy's field names
		}},
	}},
	{when: isSet("GRPC_UDS"), rows: []envoyRow{ // a unix socket instead of GRPC_HOST:GRPC_PORT, as in Envoy
		{"grpc-unix", vars("GRPC_UDS"), plain("GRPC_UDS", "")},
		{"grpc-addr", vars("GRPC_UDS"), constant("")},
	}},
	{when: not(isSet("GRPC_UDS")), unused: vars("GRPC_HOST", "GRPC_PORT"), rows: []envoyRow{
		{"grpc-addr", vars("GRPC_HOST", "GRPC_PORT"), hostPort("GRPC_HOST", "0.0.0.0", "GRPC_PORT", "8081")},
	}},
	{when: isTrue("USE_PROMETHEUS", false), unused: vars("PROMETHEUS_ADDR", "PROMETHEUS_PATH")},
	// statsd: on by default, as in Envoy, unless stats are off or go to
	// DogStatsD (named in the warning). sluice sends UDP; Envoy's stats
	// library's default is TCP (its STATSD_PROTOCOL).
	{when: statsdOn, unused: vars("STATSD_HOST", "STATSD_PORT", "STATS_FLUSH_INTERVAL", "STATSD_PROTOCOL"), rows: []envoyRow{
		{"statsd-addr", vars("USE_STATSD", "STATSD_HOST", "STATSD_PORT"), hostPort("STATSD_HOST", "localhost", "STATSD_PORT", "8125")},
		{"statsd-flush-interval", vars("STATS_FLUSH_INTERVAL"), plain("STATS_FLUSH_INTERVAL", "10s")},
		{"", nil, ignoreUnless("STATSD_PROTOCOL", "udp")},
	}},
	{rows: []envoyRow{ // rules, from files or an xDS server
		{"", nil, configType},
		{"rules-merge-domains", vars("MERGE_DOMAIN_CONFIG"), boolOf("MERGE_DOMAIN_CONFIG", false)},
	}},
	{when: not(xdsRules), unused: vars("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES"), rows: []envoyRow{ // read as Envoy's runtime reads them
		{"rules", vars("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"), func(r *envoyReader) (string, bool) {
			return filepath.Join(r.get("RUNTIME_ROOT", "/srv/runtime_data/current"), r.get("RUNTIME_SUBDIRECTORY", ""),
				r.get("RUNTIME_APPDIRECTORY", "config")), true
		}},
		{"rules-envoy-layout", vars("RUNTIME_ROOT"), constant("true")},
		{"rules-ignore-dot-files", vars("RUNTIME_IGNOREDOTFILES"), boolOf("RUNTIME_IGNOREDOTFILES", false)},
	}},
	// CONFIG_TYPE=GRPC_XDS_SOTW, as Envoy Gateway runs its Deployment
	{when: xdsRules, unused: xdsVars, rows: []envoyRow{
		{"rules", vars("CONFIG_GRPC_XDS_SERVER_URL"), func(r *envoyReader) (string, bool) {
			return "xds://" + r.get("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"), true
		}},
		{"rules-xds-node", vars("CONFIG_GRPC_XDS_NODE_ID"), plain("CONFIG_GRPC_XDS_NODE_ID", "default")},
		{"rules-xds-node-metadata", vars("CONFIG_GRPC_XDS_NODE_METADATA"), plain("CONFIG_GRPC_XDS_NODE_METADATA", "")},
		{"rules-xds-headers", vars("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"), plain("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "")},
		// One backoff: its first wait is the backoff's initial interval when
		// set, else the connect retry interval (3s).
		{"rules-xds-retry", vars("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"), func(r *envoyReader) (string, bool) {
			return r.get("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", r.get("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s")), true
		}},
		{"rules-xds-retry-max", vars("XDS_CLIENT_BACKOFF_MAX_INTERVAL"), plain("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s")},
		{"rules-xds-retry-jitter", vars("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER"), func(r *envoyReader) (string, bool) {
			if !r.boolean("XDS_CLIENT_BACKOFF_JITTER", true) {
				return "0", true
			}
			return r.get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5"), true
		}},
		{"rules-xds-max-message-size", vars("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"), plain("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "")},
		{"rules-xds-start-without-rules", vars("FORCE_START_WITHOUT_INITIAL_CONFIG"), boolOf("FORCE_START_WITHOUT_INITIAL_CONFIG", false)},
	}},
	{when: all(xdsRules, isTrue("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)), // TLS to the xDS server
		unused: vars("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN"), rows: []envoyRow{
			{"rules-xds-tls", vars("CONFIG_GRPC_XDS_SERVER_USE_TLS"), constant("true")},
			{"rules-xds-cert", vars("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), plain("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "")},
			{"rules-xds-key", vars("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"), plain("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "")},
			{"rules-xds-ca", vars("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"), plain("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "")},
			{"rules-xds-server-name", vars("CONFIG_GRPC_XDS_SERVER_TLS_SAN"), plain("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "")},
		}},
	{rows: []envoyRow{ // the store
		{"", nil, refuseUnless("BACKEND_TYPE", "redis", "sluice keeps counters in Redis (or in memory), not memcache")},
		// Envoy's default Redis is a nutcracker's socket: used when it is
		// there, else a startup error says so, never a quiet memory store
		// (envoyWhen).
		{"store", vars("REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE", "REDIS_AUTH", "REDIS_TLS"), storeOf("REDIS_", envoyRedisSocket)},
		// Envoy's keys and counting, so that Envoy's and sluice's pods on
		// one Redis share every count (--envoy-redis-keys=false opts out;
		// not with a memory store: envoyWhen).
		{"envoy-redis-keys", vars("REDIS_URL"), constant("true")},
		{"envoy-key-prefix", vars("CACHE_KEY_PREFIX"), plain("CACHE_KEY_PREFIX", "")},
		{"near-cache", vars("LOCAL_CACHE_SIZE_IN_BYTES"), plain("LOCAL_CACHE_SIZE_IN_BYTES", "")},
		{"envoy-stop-increment", vars("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"), ifTrue("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")},
	}},
	{when: isTrue("REDIS_PERSECOND", false), unused: perSecondVars, rows: []envoyRow{
		// Envoy's default is a nutcracker's socket, as for REDIS_URL.
		{"store-per-second", append(vars("REDIS_PERSECOND"), perSecondVars[:5]...), storeOf("REDIS_PERSECOND_", envoyPerSecondSocket)},
	}},
	// A sentinel's password without a sentinel is ignored, as in Envoy.
	{when: sentinel("REDIS_PERSECOND_"), unused: vars("REDIS_PERSECOND_SENTINEL_AUTH"), rows: []envoyRow{
		{"store-per-second-sentinel-auth", vars("REDIS_PERSECOND_SENTINEL_AUTH"), plain("REDIS_PERSECOND_SENTINEL_AUTH", "")},
	}},
	{when: sentinel("REDIS_"), unused: vars("REDIS_SENTINEL_AUTH"), rows: []envoyRow{
		{"store-sentinel-auth", vars("REDIS_SENTINEL_AUTH"), plain("REDIS_SENTINEL_AUTH", "")},
	}},
	{when: all(isTrue("REDIS_TLS", false), isSet("REDIS_URL")),
		unused: vars("REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"), rows: []envoyRow{
			{"store-ca", vars("REDIS_TLS_CACERT"), plain("REDIS_TLS_CACERT", "")},
			{"store-cert", vars("REDIS_TLS_CLIENT_CERT"), plain("REDIS_TLS_CLIENT_CERT", "")},
			{"store-key", vars("REDIS_TLS_CLIENT_KEY"), plain("REDIS_TLS_CLIENT_KEY", "")},
			{"store-skip-hostname-verification", vars("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"), ifTrue("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")},
		}},
	{rows: []envoyRow{ // not with a memory store (envoyWhen)
		{"store-expiry-jitter", vars("EXPIRATION_JITTER_MAX_SECONDS"), expiryJitter},
		// How long Envoy's Redis clients wait for an answer: the longest a
		// store call goes on (a decision waits --store-timeout's adaptive
		// wait at most, then is decided locally).
		{"store-hard-timeout", vars("REDIS_TIMEOUT", "REDIS_PERSECOND_TIMEOUT"), redisTimeout},
	}},
	// the per-second Redis's timeout, without a per-second Redis
	{when: isTrue("REDIS_PERSECOND", false), unused: vars("REDIS_PERSECOND_TIMEOUT")},
	{rows: []envoyRow{ // decisions, headers and metrics
		{"shadow", vars("SHADOW_MODE"), boolOf("SHADOW_MODE", false)},
		{"response-headers", vars("LIMIT_RESPONSE_HEADERS_ENABLED"), func(r *envoyReader) (string, bool) {
			if r.boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
				return "all", true
			}
			return "none", true // Envoy sends no rate limit headers unless asked
		}},
		{"envoy-metrics", nil, constant("true")},
		{"near-limit-ratio", vars("NEAR_LIMIT_RATIO"), plain("NEAR_LIMIT_RATIO", "0.8")},
	}},
	{when: isTrue("GRPC_SERVER_USE_TLS", false), // TLS on the gRPC listener
		unused: vars("GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"), rows: []envoyRow{
			{"tls-cert", vars("GRPC_SERVER_TLS_CERT"), constantOf("GRPC_SERVER_TLS_CERT")},
			{"tls-key", vars("GRPC_SERVER_TLS_KEY"), constantOf("GRPC_SERVER_TLS_KEY")},
			{"tls-client-ca", vars("GRPC_CLIENT_TLS_CACERT"), plain("GRPC_CLIENT_TLS_CACERT", "")},
			{"tls-client-san", vars("GRPC_CLIENT_TLS_SAN"), plain("GRPC_CLIENT_TLS_SAN", "")},
			{"tls-listeners", vars("GRPC_SERVER_USE_TLS"), constant("grpc")},
		}},
	{when: isTrue("TRACING_ENABLED", false), // to the OpenTelemetry SDK's endpoint variables
		unused: vars("TRACING_SERVICE_NAME", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE"), rows: []envoyRow{
			{"otlp-endpoint", vars("TRACING_ENABLED", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"), otlpEndpoint},
			{"otlp-protocol", vars("TRACING_EXPORTER_PROTOCOL"), func(r *envoyReader) (string, bool) { return otlpProtocol(r), true }},
			{"trace-sample-ratio", vars("TRACING_SAMPLING_RATE"), plain("TRACING_SAMPLING_RATE", "1")},
			{"trace-service-name", vars("TRACING_SERVICE_NAME"), plain("TRACING_SERVICE_NAME", "RateLimit")},
		}},
}

// xdsVars are the variables of rules from an xDS server, without effect
// with rules from files.
var xdsVars = vars("FORCE_START_WITHOUT_INITIAL_CONFIG", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
	"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
	"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")

// configType refuses a CONFIG_TYPE other than Envoy's two: FILE (the
// default) and GRPC_XDS_SOTW.
func configType(r *envoyReader) (string, bool) {
	if v := r.get("CONFIG_TYPE", "FILE"); !strings.EqualFold(v, "FILE") && !strings.EqualFold(v, "GRPC_XDS_SOTW") {
		r.fail(envoyError("CONFIG_TYPE", v, "want FILE or GRPC_XDS_SOTW"))
	}
	return "", false
}

// xdsRules reports whether rules come from an xDS server
// (CONFIG_TYPE=GRPC_XDS_SOTW).
func xdsRules(r *envoyReader) bool {
	return strings.EqualFold(r.get("CONFIG_TYPE", "FILE"), "GRPC_XDS_SOTW")
}

// perSecondVars are the per-second Redis's variables: its URL's five,
// then its sentinels' password.
var perSecondVars = vars("REDIS_PERSECOND_URL", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_SOCKET_TYPE",
	"REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH")

// envoySetting is a flag value taken from Envoy's variables.
type envoySetting struct {
	flag, value string
	from        []string // the variables it comes from
}

// envoyEnv is what Envoy's environment asks of `sluice serve`.
type envoyEnv struct {
	settings []envoySetting
	ignored  []string // variables set without effect, sorted
	prefix   bool     // CACHE_KEY_PREFIX is set
	stop     bool     // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is true
}

// envoyReader reads Envoy's variables, collecting the first mistake and
// the variables without effect.
type envoyReader struct {
	getenv  func(string) string
	err     error
	ignored []string
}

// get returns the variable, or def when it is unset or empty, as Envoy's
// envconfig reads it.
func (r *envoyReader) get(name, def string) string {
	if v := r.getenv(name); v != "" {
		return v
	}
	return def
}

// boolean returns the boolean variable, or def; a value that is no
// boolean is a mistake.
func (r *envoyReader) boolean(name string, def bool) bool {
	v := r.get(name, strconv.FormatBool(def))
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(envoyError(name, v, "want true or false"))
	}
	return b
}

// fail records err unless a mistake is recorded already.
func (r *envoyReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// ignore names each of names that is set as without effect.
func (r *envoyReader) ignore(names ...string) {
	for _, n := range names {
		if r.getenv(n) != "" {
			r.ignored = append(r.ignored, n)
		}
	}
}

// envoyError is a variable of Envoy's that sluice cannot honour.
func envoyError(name, value, why string) error {
	return usageError("Envoy ratelimit's %s=%q: %s", name, value, why)
}

// envoySettings reads Envoy ratelimit's variables through getenv and
// returns the flag settings envoyTable makes of them, or nil when none of
// envoyTriggers is set. A variable sluice cannot honour safely (a
// memcache backend) is an error.
func envoySettings(getenv func(string) string) (*envoyEnv, error) {
	if !slices.ContainsFunc(envoyTriggers, func(k string) bool { return getenv(k) != "" }) {
		return nil, nil
	}
	r := &envoyReader{getenv: getenv}
	e := &envoyEnv{}
	for _, g := range envoyTable {
		if g.when != nil && !g.when(r) {
			r.ignore(g.unused...)
			continue
		}
		for _, row := range g.rows {
			if v, ok := row.value(r); ok && row.flag != "" {
				e.settings = append(e.settings, envoySetting{flag: row.flag, value: v, from: row.from})
			}
		}
	}
	r.ignore(envoyIgnored...)
	if r.err != nil {
		return nil, r.err
	}
	e.prefix = r.get("CACHE_KEY_PREFIX", "") != ""
	e.stop = r.boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)
	slices.Sort(r.ignored)
	e.ignored = slices.Compact(r.ignored)
	return e, nil
}

// Envoy ratelimit's REDIS_URL and REDIS_PERSECOND_URL when they are
// unset: the unix sockets of a nutcracker (twemproxy) beside it.
const (
	envoyRedisSocket     = "/var/run/nutcracker/ratelimit.sock"
	envoyPerSecondSocket = "/var/run/nutcracker/ratelimitpersecond.sock"
)

// socketThere refuses a unix socket store that is not there: Envoy's
// default socket (REDIS_URL unset), say, where a Deployment runs no
// nutcracker.
func socketThere(_ ff.Flags, value string) (bool, error) {
	u, err := url.Parse(value)
	if err != nil || u.Scheme != "unix" {
		return true, nil
	}
	if _, err := os.Stat(u.Path); err == nil {
		return true, nil
	}
	name := map[string]string{envoyRedisSocket: "REDIS_URL", envoyPerSecondSocket: "REDIS_PERSECOND_URL"}[u.Path]
	if name != "" {
		return false, usageError("Envoy ratelimit's %s is unset, and nothing is at Envoy's default, the socket %s: "+
			"set %s (host:port, or a socket's path), or SLUICE_STORE=memory to count in this process alone", name, u.Path, name)
	}
	return false, usageError("Envoy ratelimit's Redis socket %s: nothing is there", u.Path)
}

// redisStore reports whether the store is a Redis: Envoy's keys are
// counted there, not in a memory store a flag or SLUICE_STORE chose.
func redisStore(fs ff.Flags, _ string) (bool, error) {
	f, ok := fs.GetFlag("store")
	return ok && !strings.EqualFold(f.GetValue(), "memory"), nil
}

// vars is a list of variable names.
func vars(names ...string) []string { return names }

// plain is the variable, or def; with def "", only when it is set.
func plain(name, def string) func(*envoyReader) (string, bool) {
	return func(r *envoyReader) (string, bool) {
		v := r.get(name, def)
		return v, v != ""
	}
}

// constantOf is the variable, even when it is empty.
func constantOf(name string) func(*envoyReader) (string, bool) {
	return func(r *envoyReader) (string, bool) { return r.get(name, ""), true }
}

func constant(v string) func(*envoyReader) (string, bool) {
	return func(*envoyReader) (string, bool) { return v, true }
}

func boolOf(name string, def bool) func(*envoyReader) (string, bool) {
	return func(r *envoyReader) (string, bool) { return strconv.FormatBool(r.boolean(name, def)), true }
}

// ifTrue is "true" when the boolean variable is, and nothing otherwise.
func ifTrue(name string) func(*envoyReader) (string, bool) {
	return func(r *envoyReader) (string, bool) { return "true", r.boolean(name, false) }
}

func hostPort(host, hostDef, port, portDef string) func(*envoyReader) (string, bool) {
	return func(r *envoyReader) (string, bool) {
		return net.JoinHostPort(r.get(host, hostDef), r.get(port, portDef)), true
	}
}

// ignoreUnless names the variable as without effect when it is set to
// anything but want.
func ignoreUnless(name, want string) func(*envoyReader) (string, bool) {
	return func(r *envoyReader) (string, bool) {
		if v := r.get(name, want); !strings.EqualFold(v, want) {
			r.ignored = append(r.ignored, name)
		}
		return "", false
	}
}

// refuseUnless refuses the variable set to anything but want.
func refuseUnless(name, want, why string) func(*envoyReader) (string, bool) {
	return func(r *envoyReader) (string, bool) {
		if v := r.get(name, want); !strings.EqualFold(v, want) {
			r.fail(envoyError(name, v, why))
		}
		return "", false
	}
}

func isSet(name string) func(*envoyReader) bool {
	return func(r *envoyReader) bool { return r.get(name, "") != "" }
}

func isTrue(name string, def bool) func(*envoyReader) bool {
	return func(r *envoyReader) bool { return r.boolean(name, def) }
}

func not(f func(*envoyReader) bool) func(*envoyReader) bool {
	return func(r *envoyReader) bool { return !f(r) }
}

func all(fs ...func(*envoyReader) bool) func(*envoyReader) bool {
	return func(r *envoyReader) bool {
		for _, f := range fs {
			if !f(r) {
				return false
			}
		}
		return true
	}
}

// statsdOn reports whether Envoy would send statsd: USE_STATSD, unless
// stats are off or go to DogStatsD.
func statsdOn(r *envoyReader) bool {
	return r.boolean("USE_STATSD", true) && !r.boolean("DISABLE_STATS", false) && !r.boolean("USE_DOG_STATSD", false)
}

// sentinel reports whether the Redis of prefix (REDIS_ or
// REDIS_PERSECOND_) is a Sentinel's with a sentinel password.
func sentinel(prefix string) func(*envoyReader) bool {
	return func(r *envoyReader) bool {
		on := r.get(prefix+"SENTINEL_AUTH", "") != "" && strings.EqualFold(r.get(prefix+"TYPE", "single"), "sentinel")
		if prefix == "REDIS_" {
			return on && r.get("REDIS_URL", "") != ""
		}
		return on && r.boolean("REDIS_PERSECOND", false)
	}
}

// opsAddr is DEBUG_HOST:DEBUG_PORT, and PROMETHEUS_ADDR with
// USE_PROMETHEUS (whose PROMETHEUS_PATH is always /metrics here).
func opsAddr(r *envoyReader) (string, bool) {
	ops := net.JoinHostPort(r.get("DEBUG_HOST", "0.0.0.0"), r.get("DEBUG_PORT", "6070"))
	if r.boolean("USE_PROMETHEUS", false) {
		ops += "," + r.get("PROMETHEUS_ADDR", ":9090")
		ignoreUnless("PROMETHEUS_PATH", "/metrics")(r)
	}
	return ops, true
}

// envoyLevels maps LOG_LEVEL's values onto --log-level's.
var envoyLevels = map[string]string{"trace": "debug", "debug": "debug", "info": "info", "warn": "warn", "warning": "warn",
	"error": "error", "fatal": "error", "panic": "error"}

func logLevel(r *envoyReader) (string, bool) {
	lv := r.get("LOG_LEVEL", "WARN")
	if l, ok := envoyLevels[strings.ToLower(lv)]; ok {
		return l, true
	}
	r.fail(envoyError("LOG_LEVEL", lv, "want trace, debug, info, warn, error, fatal or panic"))
	return "", false
}

// storeOf is the store URL of the Redis variables of prefix, whose URL
// defaults to defURL; nothing when there is none.
func storeOf(prefix, defURL string) func(*envoyReader) (string, bool) {
	return func(r *envoyReader) (string, bool) {
		s, err := envoyStore(r, prefix, defURL)
		if err != nil {
			r.fail(err)
		}
		return s, s != ""
	}
}

// expiryJitter is EXPIRATION_JITTER_MAX_SECONDS, whose default spreads
// Envoy's keys' expiry over 300 s.
func expiryJitter(r *envoyReader) (string, bool) {
	jitter := r.get("EXPIRATION_JITTER_MAX_SECONDS", "300")
	n, err := strconv.ParseUint(jitter, 10, 31)
	if err != nil {
		r.fail(envoyError("EXPIRATION_JITTER_MAX_SECONDS", jitter, "want whole seconds"))
		return "", false
	}
	return (time.Duration(n) * time.Second).String(), true
}

// redisTimeout is the longest of Envoy's REDIS_TIMEOUT and, with
// REDIS_PERSECOND, REDIS_PERSECOND_TIMEOUT (10s each by default): one
// bound for a decision's store calls, which may go to both Redis. Envoy's
// 0 (no timeout) is refused: a call that never ends holds its goroutine.
func redisTimeout(r *envoyReader) (string, bool) {
	names := []string{"REDIS_TIMEOUT"}
	if r.boolean("REDIS_PERSECOND", false) {
		names = append(names, "REDIS_PERSECOND_TIMEOUT")
	}
	var longest time.Duration
	for _, name := range names {
		v := r.get(name, "10s")
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			r.fail(envoyError(name, v, "want a duration above 0, such as 10s"))
			return "", false
		}
		longest = max(longest, d)
	}
	return longest.String(), true
}

func otlpProtocol(r *envoyReader) string {
	return strings.ToLower(r.get("TRACING_EXPORTER_PROTOCOL", "http"))
}

// otlpEndpoint is the OpenTelemetry SDK's endpoint, or its default for
// the protocol.
func otlpEndpoint(r *envoyReader) (string, bool) {
	def := "http://localhost:4318"
	if otlpProtocol(r) == "grpc" {
		def = "http://localhost:4317"
	}
	return r.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", r.get("OTEL_EXPORTER_OTLP_ENDPOINT", def)), true
}

// envoyStore returns the store URL that Envoy's Redis variables name,
// those of the prefix REDIS_ (--store) or REDIS_PERSECOND_
// (--store-per-second), or "" when its URL is not set and defURL is ""
// (the store stays as it is).
func envoyStore(r *envoyReader, prefix, defURL string) (string, error) {
	raw := r.get(prefix+"URL", defURL)
	socket := r.get(prefix+"SOCKET_TYPE", "")
	if r.get(prefix+"URL", "") == "" {
		socket = "unix" // Envoy's default, a socket's path, whatever the socket type says
	}
	typ := strings.ToLower(r.get(prefix+"TYPE", "SINGLE"))
	auth := r.get(prefix+"AUTH", "")
	tlsOn := r.boolean(prefix+"TLS", false)
	if raw == "" {
		return "", nil
	}
	// Envoy dials a single Redis over REDIS_SOCKET_TYPE, whose default is
	// unix; a cluster's and a sentinel's nodes always over TCP. sluice
	// takes a REDIS_URL that is no path for TCP when the type is unset.
	if socket != "" && !strings.EqualFold(socket, "tcp") && !strings.EqualFold(socket, "unix") {
		return "", envoyError(prefix+"SOCKET_TYPE", socket, "want tcp or unix")
	}
	unix := typ == "single" && (strings.EqualFold(socket, "unix") || socket == "" && strings.HasPrefix(raw, "/"))
	if strings.Contains(raw, "://") {
		return raw, nil // already a URL
	}
	user := ""
	if auth != "" {
		name, pass, ok := strings.Cut(auth, ":") // Envoy's user:password for ACLs
		if !ok {
			name, pass = "", auth
		}
		user = url.UserPassword(name, pass).String() + "@"
	}
	if unix {
		if tlsOn {
			return "", envoyError(prefix+"TLS", "true", "sluice reaches a Redis on a unix socket without TLS")
		}
		path, err := filepath.Abs(raw) // Envoy's dial reads a relative path from its directory
		if err != nil {
			return "", envoyError(prefix+"URL", raw, err.Error())
		}
		return "unix://" + user + path, nil
	}
	scheme := "redis"
	if tlsOn {
		scheme = "rediss"
	}
	hosts := strings.Split(raw, ",")
	for i := range hosts {
		hosts[i] = strings.TrimSpace(hosts[i])
	}
	switch typ {
	case "single":
		if len(hosts) != 1 {
			return "", envoyError(prefix+"URL", raw, "one host:port for REDIS_TYPE=single")
		}
		return scheme + "://" + user + hosts[0], nil
	case "cluster":
		return scheme + "+cluster://" + user + strings.Join(hosts, ","), nil
	case "sentinel":
		if tlsOn {
			return "", envoyError(prefix+"TLS", "true", "sluice reaches a Sentinel-managed Redis without TLS only")
		}
		if len(hosts) < 2 {
			return "", envoyError(prefix+"URL", raw, "want the master's name, then the sentinels: mymaster,host:26379,...")
		}
		return "redis+sentinel://" + user + strings.Join(hosts[1:], ",") + "/" + hosts[0], nil
	}
	return "", envoyError(prefix+"TYPE", typ, "want single, cluster or sentinel")
}

// apply sets each flag of fs that nothing set yet from e, checking the
// values even where a flag or SLUICE_ variable wins. A flag the command
// lacks makes its variables ignored, and so does CACHE_KEY_PREFIX without
// Envoy's keys, and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.
func (e *envoyEnv) apply(fs ff.Flags) error {
	defer func() {
		if f, ok := fs.GetFlag("envoy-redis-keys"); !ok || f.GetValue() != "true" {
			if e.prefix {
				e.ignored = append(e.ignored, "CACHE_KEY_PREFIX") // sluice's own keys have their own names
			}
			if e.stop {
				e.ignored = append(e.ignored, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT") // sluice's own keys count nothing when denied
			}
		}
		slices.Sort(e.ignored)
		e.ignored = slices.Compact(e.ignored)
	}()
	for _, s := range e.settings {
		f, ok := fs.GetFlag(s.flag)
		if !ok {
			e.ignored = append(e.ignored, s.from...)
			continue
		}
		if when := envoyWhen[s.flag]; when != nil && !f.IsSet() {
			if ok, err := when(fs, s.value); err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
		}
		if err := setChecked(f, s.value); err != nil {
			from := "Envoy ratelimit's environment"
			if len(s.from) > 0 {
				from = "Envoy ratelimit's " + strings.Join(s.from, ", ")
			}
			return usageError("%s: --%s %q: %v", from, s.flag, s.value, err)
		}
	}
	return nil
}

// redactedSettings returns the settings as "flag=value" for a log line,
// with the store's password hidden.
func (e *envoyEnv) redactedSettings() []string {
	out := make([]string, 0, len(e.settings))
	for _, s := range e.settings {
		v := s.value
		switch s.flag {
		case "store", "store-per-second":
			v = server.Redact(v)
		case "store-sentinel-auth", "store-per-second-sentinel-auth":
			v = "xxxxx"
		}
		out = append(out, fmt.Sprintf("%s=%s", s.flag, v))
	}
	return out
}

// logEnvoy logs, with the logger the flags of fs ask for, that sluice
// runs on Envoy ratelimit's environment, and names in one warning the
// variables set that have no effect.
func logEnvoy(w io.Writer, fs ff.Flags, e *envoyEnv) error {
	value := func(name string) string {
		if f, ok := fs.GetFlag(name); ok {
			return f.GetValue()
		}
		return ""
	}
	log, err := newLogger(w, value("log-level"), value("log-format"))
	if err != nil {
		return err
	}
	log.Info("reading Envoy ratelimit's environment; flags and SLUICE_ variables win over it", "settings", e.redactedSettings())
	if len(e.ignored) > 0 {
		log.Warn("Envoy ratelimit's variables without effect in sluice", "variables", e.ignored)
	}
	return nil
}

// envoyCommand is the name of Envoy ratelimit's binary (/bin/ratelimit in
// its image), which Deployments name in their command.
const envoyCommand = "ratelimit"

// commandArgs returns the arguments run gets for the command line argv
// (the program's name first): the arguments after the name, or, when
// sluice runs under Envoy's binary's name without arguments, as Envoy
// ratelimit's image is run, "serve".
func commandArgs(argv []string) []string {
	if len(argv) == 0 {
		return nil
	}
	if len(argv) == 1 && filepath.Base(argv[0]) == envoyCommand {
		return []string{"serve"}
	}
	return argv[1:]
}
