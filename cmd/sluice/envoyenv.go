package main

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"
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
// rules directory, and is ready only with rules loaded): they are neither
// read nor named.

// envoyIgnored are Envoy's variables that have no effect in sluice: they
// are named in the startup warning when set. The variables envoySettings
// maps are not listed here; some of them are ignored in some cases (TLS
// files without GRPC_SERVER_USE_TLS, say), and then named too.
var envoyIgnored = []string{
	// rules from an xDS server
	"FORCE_START_WITHOUT_INITIAL_CONFIG", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
	"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
	"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
	// stats: tags, DogStatsD, and the Prometheus sink's mapping (sluice
	// serves Prometheus metrics under the default mapping's names)
	"EXTRA_TAGS", "USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "PROMETHEUS_MAPPER_YAML",
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
	// Redis settings that sluice's client sets itself (it pipelines, and
	// --store-timeout bounds a decision's wait)
	"REDIS_POOL_SIZE", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM",
	"REDIS_TIMEOUT", "REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
	"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME",
	// the per-second Redis's settings that sluice's client sets itself
	"REDIS_PERSECOND_POOL_SIZE",
	"REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT",
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "REDIS_PERSECOND_TIMEOUT",
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

// envoySetting is a flag value taken from Envoy's variables.
type envoySetting struct {
	flag, value string
	from        []string // the variables it comes from
}

// envoyEnv is what Envoy's environment asks of `sluice serve`.
type envoyEnv struct {
	settings []envoySetting
	ignored  []string // variables set without effect, sorted
}

// envoyError is a variable of Envoy's that sluice cannot honour.
func envoyError(name, value, why string) error {
	return usageError("Envoy ratelimit's %s=%q: %s", name, value, why)
}

// envoySettings reads Envoy ratelimit's variables through getenv and
// returns the flag settings they make, or nil when none of envoyTriggers
// is set. A variable sluice cannot honour safely (a memcache backend,
// rules from xDS) is an error.
func envoySettings(getenv func(string) string) (*envoyEnv, error) {
	if !slices.ContainsFunc(envoyTriggers, func(k string) bool { return getenv(k) != "" }) {
		return nil, nil
	}
	e := &envoyEnv{}
	// get returns the variable, or def when it is unset or empty, as
	// Envoy's envconfig reads it.
	get := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var errs []error
	boolean := func(name string, def bool) bool {
		v := get(name, strconv.FormatBool(def))
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, envoyError(name, v, "want true or false"))
		}
		return b
	}
	set := func(flag, value string, from ...string) {
		e.settings = append(e.settings, envoySetting{flag: flag, value: value, from: from})
	}
	ignore := func(names ...string) {
		for _, n := range names {
			if getenv(n) != "" {
				e.ignored = append(e.ignored, n)
			}
		}
	}

	// Listeners, with Envoy's defaults: all interfaces.
	set("http-addr", net.JoinHostPort(get("HOST", "0.0.0.0"), get("PORT", "8080")), "HOST", "PORT")
	if uds := get("GRPC_UDS", ""); uds != "" {
		// A unix socket instead of GRPC_HOST:GRPC_PORT, as in Envoy.
		set("grpc-unix", uds, "GRPC_UDS")
		set("grpc-addr", "", "GRPC_UDS")
		ignore("GRPC_HOST", "GRPC_PORT")
	} else {
		set("grpc-addr", net.JoinHostPort(get("GRPC_HOST", "0.0.0.0"), get("GRPC_PORT", "8081")), "GRPC_HOST", "GRPC_PORT")
	}
	set("grpc-max-connection-age", get("GRPC_MAX_CONNECTION_AGE", "24h"), "GRPC_MAX_CONNECTION_AGE")
	set("grpc-max-connection-age-grace", get("GRPC_MAX_CONNECTION_AGE_GRACE", "1h"), "GRPC_MAX_CONNECTION_AGE_GRACE")
	ops := []string{net.JoinHostPort(get("DEBUG_HOST", "0.0.0.0"), get("DEBUG_PORT", "6070"))}
	opsFrom := []string{"DEBUG_HOST", "DEBUG_PORT"}
	if boolean("USE_PROMETHEUS", false) {
		ops = append(ops, get("PROMETHEUS_ADDR", ":9090"))
		opsFrom = append(opsFrom, "USE_PROMETHEUS", "PROMETHEUS_ADDR")
		if p := get("PROMETHEUS_PATH", "/metrics"); p != "/metrics" {
			e.ignored = append(e.ignored, "PROMETHEUS_PATH")
		}
	} else {
		ignore("PROMETHEUS_ADDR", "PROMETHEUS_PATH")
	}
	set("ops-addr", strings.Join(ops, ","), opsFrom...)

	// statsd: on by default, as in Envoy, unless stats are off or go to
	// DogStatsD (named in the warning). sluice sends UDP; Envoy's stats
	// library's default is TCP (its STATSD_PROTOCOL).
	statsdVars := []string{"STATSD_HOST", "STATSD_PORT", "STATS_FLUSH_INTERVAL", "STATSD_PROTOCOL"}
	if boolean("USE_STATSD", true) && !boolean("DISABLE_STATS", false) && !boolean("USE_DOG_STATSD", false) {
		set("statsd-addr", net.JoinHostPort(get("STATSD_HOST", "localhost"), get("STATSD_PORT", "8125")),
			"USE_STATSD", "STATSD_HOST", "STATSD_PORT")
		set("statsd-flush-interval", get("STATS_FLUSH_INTERVAL", "10s"), "STATS_FLUSH_INTERVAL")
		if p := get("STATSD_PROTOCOL", "udp"); !strings.EqualFold(p, "udp") {
			e.ignored = append(e.ignored, "STATSD_PROTOCOL")
		}
	} else {
		ignore(statsdVars...)
	}

	// Logs.
	lv := get("LOG_LEVEL", "WARN")
	switch strings.ToLower(lv) {
	case "trace", "debug":
		set("log-level", "debug", "LOG_LEVEL")
	case "info":
		set("log-level", "info", "LOG_LEVEL")
	case "warn", "warning":
		set("log-level", "warn", "LOG_LEVEL")
	case "error", "fatal", "panic":
		set("log-level", "error", "LOG_LEVEL")
	default:
		errs = append(errs, envoyError("LOG_LEVEL", lv, "want trace, debug, info, warn, error, fatal or panic"))
	}
	set("log-format", strings.ToLower(get("LOG_FORMAT", "text")), "LOG_FORMAT")

	// Rules: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, read as
	// Envoy's runtime reads it.
	if ct := get("CONFIG_TYPE", "FILE"); !strings.EqualFold(ct, "FILE") {
		errs = append(errs, envoyError("CONFIG_TYPE", ct, "sluice reads rules from files (CONFIG_TYPE=FILE) only"))
	}
	set("rules", filepath.Join(get("RUNTIME_ROOT", "/srv/runtime_data/current"), get("RUNTIME_SUBDIRECTORY", ""),
		get("RUNTIME_APPDIRECTORY", "config")), "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
	set("rules-envoy-layout", "true", "RUNTIME_ROOT")
	set("rules-ignore-dot-files", strconv.FormatBool(boolean("RUNTIME_IGNOREDOTFILES", false)), "RUNTIME_IGNOREDOTFILES")
	set("rules-merge-domains", strconv.FormatBool(boolean("MERGE_DOMAIN_CONFIG", false)), "MERGE_DOMAIN_CONFIG")

	// The store.
	if bt := get("BACKEND_TYPE", "redis"); !strings.EqualFold(bt, "redis") {
		errs = append(errs, envoyError("BACKEND_TYPE", bt, "sluice keeps counters in Redis (or in memory), not memcache"))
	}
	if store, err := envoyStore(get, boolean, "REDIS_", ""); err != nil {
		errs = append(errs, err)
	} else if store != "" {
		set("store", store, "REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE", "REDIS_AUTH", "REDIS_TLS")
	}
	perSecondVars := []string{"REDIS_PERSECOND_URL", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_SOCKET_TYPE",
		"REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS"}
	if boolean("REDIS_PERSECOND", false) {
		// Envoy's default is a nutcracker's socket, as for REDIS_URL.
		ps, err := envoyStore(get, boolean, "REDIS_PERSECOND_", "/var/run/nutcracker/ratelimitpersecond.sock")
		if err != nil {
			errs = append(errs, err)
		} else {
			set("store-per-second", ps, append([]string{"REDIS_PERSECOND"}, perSecondVars...)...)
		}
		if v := get("REDIS_PERSECOND_SENTINEL_AUTH", ""); v != "" && strings.EqualFold(get("REDIS_PERSECOND_TYPE", "single"), "sentinel") {
			set("store-per-second-sentinel-auth", v, "REDIS_PERSECOND_SENTINEL_AUTH")
		} else {
			ignore("REDIS_PERSECOND_SENTINEL_AUTH") // as in Envoy, without a sentinel
		}
	} else {
		ignore(append(perSecondVars, "REDIS_PERSECOND_SENTINEL_AUTH")...)
	}
	if v := get("REDIS_SENTINEL_AUTH", ""); v != "" && get("REDIS_URL", "") != "" && strings.EqualFold(get("REDIS_TYPE", "single"), "sentinel") {
		set("store-sentinel-auth", v, "REDIS_SENTINEL_AUTH")
	} else {
		ignore("REDIS_SENTINEL_AUTH") // as in Envoy, without a sentinel
	}
	storeTLSVars := []string{"REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"}
	if boolean("REDIS_TLS", false) && get("REDIS_URL", "") != "" {
		if v := get("REDIS_TLS_CACERT", ""); v != "" {
			set("store-ca", v, "REDIS_TLS_CACERT")
		}
		if v := get("REDIS_TLS_CLIENT_CERT", ""); v != "" {
			set("store-cert", v, "REDIS_TLS_CLIENT_CERT")
		}
		if v := get("REDIS_TLS_CLIENT_KEY", ""); v != "" {
			set("store-key", v, "REDIS_TLS_CLIENT_KEY")
		}
		if boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false) {
			set("store-skip-hostname-verification", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
		}
	} else {
		ignore(storeTLSVars...)
	}
	if get("REDIS_URL", "") != "" {
		// Envoy's default spreads its keys' expiry over 300 s.
		jitter := get("EXPIRATION_JITTER_MAX_SECONDS", "300")
		if n, err := strconv.ParseUint(jitter, 10, 31); err != nil {
			errs = append(errs, envoyError("EXPIRATION_JITTER_MAX_SECONDS", jitter, "want whole seconds"))
		} else {
			set("store-expiry-jitter", (time.Duration(n) * time.Second).String(), "EXPIRATION_JITTER_MAX_SECONDS")
		}
	} else {
		ignore("EXPIRATION_JITTER_MAX_SECONDS") // the memory store
	}
	if v := get("CACHE_KEY_PREFIX", ""); v != "" {
		set("envoy-key-prefix", v, "CACHE_KEY_PREFIX")
	}
	if v := get("LOCAL_CACHE_SIZE_IN_BYTES", ""); v != "" {
		set("near-cache", v, "LOCAL_CACHE_SIZE_IN_BYTES")
	}
	if !boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", true) {
		// sluice never counts what it denies.
		e.ignored = append(e.ignored, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")
	}

	// Decisions, headers and metrics.
	set("shadow", strconv.FormatBool(boolean("SHADOW_MODE", false)), "SHADOW_MODE")
	headers := "none" // Envoy sends no rate limit headers unless asked
	if boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
		headers = "all"
	}
	set("response-headers", headers, "LIMIT_RESPONSE_HEADERS_ENABLED")
	set("envoy-metrics", "true")
	set("near-limit-ratio", get("NEAR_LIMIT_RATIO", "0.8"), "NEAR_LIMIT_RATIO")

	// TLS on the gRPC listener.
	tlsVars := []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"}
	if boolean("GRPC_SERVER_USE_TLS", false) {
		set("tls-cert", get("GRPC_SERVER_TLS_CERT", ""), "GRPC_SERVER_TLS_CERT")
		set("tls-key", get("GRPC_SERVER_TLS_KEY", ""), "GRPC_SERVER_TLS_KEY")
		if ca := get("GRPC_CLIENT_TLS_CACERT", ""); ca != "" {
			set("tls-client-ca", ca, "GRPC_CLIENT_TLS_CACERT")
		}
		if san := get("GRPC_CLIENT_TLS_SAN", ""); san != "" {
			set("tls-client-san", san, "GRPC_CLIENT_TLS_SAN")
		}
		set("tls-listeners", "grpc", "GRPC_SERVER_USE_TLS")
	} else {
		ignore(tlsVars...)
	}

	// Tracing, to the OpenTelemetry SDK's endpoint variables.
	traceVars := []string{"TRACING_SERVICE_NAME", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE"}
	if boolean("TRACING_ENABLED", false) {
		proto := strings.ToLower(get("TRACING_EXPORTER_PROTOCOL", "http"))
		def := "http://localhost:4318" // the SDK's default endpoints
		if proto == "grpc" {
			def = "http://localhost:4317"
		}
		set("otlp-endpoint", get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", get("OTEL_EXPORTER_OTLP_ENDPOINT", def)),
			"TRACING_ENABLED", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
		set("otlp-protocol", proto, "TRACING_EXPORTER_PROTOCOL")
		set("trace-sample-ratio", get("TRACING_SAMPLING_RATE", "1"), "TRACING_SAMPLING_RATE")
		set("trace-service-name", get("TRACING_SERVICE_NAME", "RateLimit"), "TRACING_SERVICE_NAME")
	} else {
		ignore(traceVars...)
	}

	ignore(envoyIgnored...)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	slices.Sort(e.ignored)
	e.ignored = slices.Compact(e.ignored)
	return e, nil
}

// envoyStore returns the store URL that Envoy's Redis variables name,
// those of the prefix REDIS_ (--store) or REDIS_PERSECOND_
// (--store-per-second), or "" when its URL is not set and defURL is ""
// (the store stays as it is).
func envoyStore(get func(name, def string) string, boolean func(string, bool) bool, prefix, defURL string) (string, error) {
	raw := get(prefix+"URL", defURL)
	socket := get(prefix+"SOCKET_TYPE", "")
	typ := strings.ToLower(get(prefix+"TYPE", "SINGLE"))
	auth := get(prefix+"AUTH", "")
	tlsOn := boolean(prefix+"TLS", false)
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
// lacks makes its variables ignored.
func (e *envoyEnv) apply(fs ff.Flags) error {
	for _, s := range e.settings {
		f, ok := fs.GetFlag(s.flag)
		if !ok {
			e.ignored = append(e.ignored, s.from...)
			continue
		}
		if err := setChecked(f, s.value); err != nil {
			from := "Envoy ratelimit's environment"
			if len(s.from) > 0 {
				from = "Envoy ratelimit's " + strings.Join(s.from, ", ")
			}
			return usageError("%s: --%s %q: %v", from, s.flag, s.value, err)
		}
	}
	slices.Sort(e.ignored)
	e.ignored = slices.Compact(e.ignored)
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
			v = redactURL(v)
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
