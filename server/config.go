package server

import (
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/admit"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/sketch"
	"github.com/sluicehq/sluice/store/stack"
	"github.com/sluicehq/sluice/tracing"
	"github.com/sluicehq/sluice/transport/respond"
)

// Config configures a Server. Start from DefaultConfig, or from the zero
// Config with Rules.Source set: a zero field means its default, which
// DefaultConfig spells out with its reason. Where zero is a setting of its
// own (no jitter, no near cache), a negative value (or NoAddr) says it.
//
// Each field is the setting of the flag named in its comment, which is
// also its key in a config file and, as SLUICE_ and the name upper-cased,
// its environment variable; New's errors name settings by it.
type Config struct {
	Rules RulesConfig
	// Store says where counters live and how the store is layered: its
	// fields, defaults and their reasons are store/stack's (--store,
	// --store-sentinel-auth, --store-per-second,
	// --store-per-second-sentinel-auth, --store-expiry-jitter,
	// --max-memory, --max-entries, --flood-guard, --near-cache, --sync,
	// --sync-interval, --async-nodes, --lease-lifetime, --max-lease,
	// --envoy-redis-keys, --envoy-key-prefix). Its TLS and Logger are
	// set from StoreTLS and Logger. Async mode counts the servers that
	// share Redis by their heartbeats there; --async-nodes is only the
	// fewest it counts.
	Store    stack.Config
	StoreTLS StoreTLSConfig

	// Fail says how to decide while the store fails or is slow (--fail).
	// Default decide.FailLocal: each server decides locally, bounded.
	Fail decide.Fail
	// FailExplicit says the operator chose Fail (--fail, SLUICE_FAIL, the
	// config file) rather than leaving it to its default. A server whose
	// store has never answered is not ready (/readyz 503) until it has,
	// unless Fail is FailOpen and FailExplicit: then it is ready, and says
	// at Warn every minute that it admits without limits until the store
	// answers. Default false.
	FailExplicit bool
	// StoreTimeout is the least the store calls of one decision wait for
	// the store (--store-timeout): the timeout follows the store's latency
	// (twice its p99) up to decide's StoreMaxTimeout, 200ms; negative: no
	// bound. Default 50ms (decide's).
	StoreTimeout time.Duration
	// StoreHardTimeout is the longest a store call goes on past the store
	// timeout, with Fail decide.FailLocal, before it counts as failed and
	// the hits decided locally are written back later
	// (--store-hard-timeout; Envoy's REDIS_TIMEOUT). Default 10s
	// (decide's).
	StoreHardTimeout time.Duration
	// ConcurrencyLease is how long a request of the decision APIs, which
	// report no end, holds a slot of a concurrency limit
	// (--concurrency-lease). Default 1s (admit's).
	ConcurrencyLease time.Duration
	// Shadow puts every limit in shadow mode: decided and counted, never
	// enforced, as Envoy's SHADOW_MODE (--shadow).
	Shadow bool

	// ResponseHeaders are the rate limit headers sent on every way in
	// (--response-headers). Default respond.AllHeaders.
	ResponseHeaders respond.Headers
	// RetryJitter is the most random time added to Retry-After, in whole
	// seconds (--retry-jitter); negative: none. Default 1s.
	RetryJitter time.Duration
	// Identity is an identity file (Envoy rate_limits actions): serve
	// answers forward-auth on GET /v1/auth with it; the proxy limits by it
	// instead of per client IP (--identity). Default: none.
	Identity string

	GRPC GRPCConfig
	HTTP HTTPConfig
	// OpsAddrs are listeners serving only /healthz, /readyz, /healthcheck
	// and /metrics (and the dashboard) (--ops-addr). Default: none.
	OpsAddrs []string
	// OpsPprof serves Go's profiles under /debug/pprof/ on the ops
	// listeners alone, as Envoy's debug port does (--ops-pprof).
	OpsPprof bool
	TLS      TLSConfig
	Admin    AdminConfig
	UI       UIConfig
	// Proxy, when not nil, makes the Server a reverse proxy that limits
	// requests before forwarding them (sluice proxy) instead of serving
	// the decision APIs: GRPC, HTTP and Identity's forward-auth are unused.
	Proxy *ProxyConfig

	Observe ObserveConfig
	Envoy   EnvoyConfig
	Tracing TracingConfig

	// ShutdownTimeout is how long a shutdown waits for calls in flight
	// (--shutdown-timeout); negative: not at all. Default 10s.
	ShutdownTimeout time.Duration
	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger
}

// RulesConfig says where the rules come from and how they are read.
type RulesConfig struct {
	// Source is a rules file, a directory of *.yaml files, or a rules
	// database: a Redis URL (--rules). Required.
	Source string
	// MaxFileBytes is the largest rules file read; a directory may hold 4
	// times as much (--max-rules-size). Default rules.DefaultMaxFileBytes,
	// 16 MiB.
	MaxFileBytes int
	// EnvoyLayout reads every file below the directory, any extension, as
	// Envoy's ratelimit reads its runtime (--rules-envoy-layout); as
	// Envoy's, a directory missing or empty at the start is no rules, with
	// a warning, until rules appear there.
	EnvoyLayout bool
	// IgnoreDotFiles skips hidden entries with EnvoyLayout
	// (--rules-ignore-dot-files).
	IgnoreDotFiles bool
	// MergeDomains lets one domain span files (--rules-merge-domains).
	MergeDomains bool
	// Snapshot is the file keeping a rules database's last good rules,
	// from which a node starts while the database is down
	// (--rules-snapshot). Default: none.
	Snapshot string
	// Poll is how often a rules database's (or a directory's overrides')
	// generation is read in case a change was missed (--rules-poll);
	// negative: never. Default control.DefaultPoll, 5s.
	Poll time.Duration
	// XDS is how rules come from an xDS management server, when Source
	// is xds://HOST:PORT.
	XDS XDSConfig
}

// StoreTLSConfig is the TLS of a rediss:// store (and of a rediss://
// rules database): the PEM files of the CAs that sign its certificate
// (--store-ca; default: the system's) and of a client certificate
// (--store-cert, --store-key).
type StoreTLSConfig struct {
	CA, Cert, Key string
	// SkipHostnameVerification accepts a store certificate the CAs signed
	// whatever name it carries (--store-skip-hostname-verification).
	SkipHostnameVerification bool
}

// NoAddr is an address that turns its listener off: GRPCConfig.Addr's,
// serving gRPC on GRPCConfig.Unix alone.
const NoAddr = "none"

// GRPCConfig is serve's gRPC listener of Envoy's rate limit API.
type GRPCConfig struct {
	// Addr is its address; port 0 picks a free port; NoAddr: none, with
	// Unix (--grpc-addr). Default "127.0.0.1:8081".
	Addr string
	// Unix is a unix domain socket's path on which gRPC is served too; a
	// stale socket there is replaced (--grpc-unix). Default: none.
	Unix string
	// UnixMode is the socket's permissions (--grpc-unix-mode). Default
	// 0660: the owner and its group may connect.
	UnixMode fs.FileMode
	// NoReflection turns gRPC server reflection (for grpcurl and ghz) off
	// (--grpc-reflection=false).
	NoReflection bool
	// MaxConnectionAge closes connections this old, gracefully, so that
	// clients spread over replicas (--grpc-max-connection-age). Default 0:
	// never.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long calls on such a connection may
	// take to finish (--grpc-max-connection-age-grace). Default 0: no
	// bound.
	MaxConnectionAgeGrace time.Duration
}

// HTTPConfig is serve's HTTP API listener.
type HTTPConfig struct {
	// Addr is its address; port 0 picks a free port (--http-addr).
	// Default "127.0.0.1:8080".
	Addr string
	// Pprof serves Go's profiles under /debug/pprof/ here and on the ops
	// listeners (--pprof).
	Pprof bool
}

// TLSConfig is the TLS of the listeners; without Cert there is none.
type TLSConfig struct {
	// Cert and Key are the PEM certificate chain and its key, reloaded
	// when the files change (--tls-cert, --tls-key).
	Cert, Key string
	// ClientCA requires client certificates it signed (--tls-client-ca).
	ClientCA string
	// ClientSAN is a name every client certificate must carry
	// (--tls-client-san).
	ClientSAN string
	// Listeners are the listeners that serve TLS: "all", or grpc, http,
	// ops, admin, ui (serve) or proxy, ops, admin, ui (proxy)
	// (--tls-listeners). Default ["all"].
	Listeners []string
}

// AdminConfig is the admin API (rules, history, overrides).
type AdminConfig struct {
	// Addr is its address (--admin-addr). Default "127.0.0.1:8082".
	Addr string
	// Tokens is the file of its tokens; none: no admin API
	// (--admin-tokens).
	Tokens string
	// ReadOnly makes it read and dry-run only (--admin-read-only).
	ReadOnly bool
}

// UIConfig says where the dashboard is served (/ui, its simulator, and
// GET /v1/top and /v1/keys/..., which show clients' keys) and who may see
// it.
type UIConfig struct {
	// Addr is the dashboard's own listener, where alone it is then served;
	// NoAddr: no dashboard (--ui-addr). Default "": beside the HTTP API
	// (serve) and on the ops listeners, whoever reaches them.
	Addr string
	// Auth asks for a token of the admin tokens file (--admin-tokens, any
	// role) on every dashboard route: HTTP Basic's password, which a
	// browser prompts for, or a bearer token (--ui-auth).
	Auth bool
}

// ProxyConfig is the reverse proxy of `sluice proxy`.
type ProxyConfig struct {
	// Upstream is the URL of the service behind the proxy, http:// or
	// https:// (--upstream). Required.
	Upstream string
	// Listen is the proxy's address; port 0 picks a free port (--listen).
	// Default "127.0.0.1:8000".
	Listen string
	// Domain is the rules domain of the default per-IP identity, unused
	// with Config.Identity (--domain). Default "api".
	Domain string
	// MaxDelay is the longest a request a leaky_bucket admits is held for
	// its turn (--max-delay). Default 0: never hold.
	MaxDelay time.Duration
	// MaxWaiting is the most requests waiting for their turn at once
	// (--max-waiting). Default 1024.
	MaxWaiting int
	// Shed turns adaptive load shedding on (--shed).
	Shed bool
}

// ObserveConfig sizes the heavy hitters (GET /v1/top) and the denial log.
type ObserveConfig struct {
	// DenyLogRate is the most denials logged a second (--deny-log-rate);
	// negative: none. Default 10.
	DenyLogRate float64
	// TopKeys is the most domain and descriptor key pairs whose heavy
	// hitters are counted, 1 to observe.MaxMaxKeys (--top-keys). Default 16.
	TopKeys int
	// TopWidth is the counters per row of each count-min sketch, 1 to
	// sketch.MaxWidth (--top-width). Default 1024.
	TopWidth int
}

// EnvoyConfig is Envoy ratelimit's metrics, by its names.
type EnvoyConfig struct {
	// Metrics counts Envoy ratelimit's per-descriptor metrics under its
	// names too (--envoy-metrics).
	Metrics bool
	// NearLimitRatio is the share of a limit past which Metrics counts
	// hits as near_limit (--near-limit-ratio). Default 0.8.
	NearLimitRatio float64
	// StatsdAddr is a statsd server (UDP) to send those counters to
	// (--statsd-addr). Default: none.
	StatsdAddr string
	// StatsdFlushInterval is how often StatsdAddr gets what the counters
	// counted since (--statsd-flush-interval). Default 10s, Envoy's.
	StatsdFlushInterval time.Duration
}

// TracingConfig is OpenTelemetry tracing, off without Endpoint.
type TracingConfig struct {
	// Endpoint is the OTLP collector's URL (--otlp-endpoint). Default:
	// none, no tracing.
	Endpoint string
	// Protocol is grpc or http (--otlp-protocol). Default "grpc".
	Protocol string
	// SampleRatio is the share of decisions without a parent span that
	// are traced (--trace-sample-ratio); negative: none. Default 0.01.
	SampleRatio float64
	// ServiceName is the spans' service.name (--trace-service-name).
	// Default "sluice".
	ServiceName string
}

// DefaultConfig returns the configuration of every zero field: what
// `sluice serve` runs with when no flag is given (Rules.Source aside).
func DefaultConfig() Config {
	dc, oc, tc := decide.DefaultConfig(), observe.DefaultConfig(), tracing.DefaultConfig() // their defaults are theirs
	rc := respond.DefaultConfig()
	return Config{
		Rules: RulesConfig{
			MaxFileBytes: rules.DefaultMaxFileBytes, // 16 MiB: rules files are small; a directory 4 times that
			Poll:         control.DefaultPoll,       // 5s: a missed change is picked up soon
			XDS:          defaultXDS(),              // Envoy ratelimit's: node "default", retry 3s to 60s
		},
		Store:            stack.DefaultConfig(),       // memory: one node, exact, 256 MiB; on Redis an 8 MiB near cache, exact sync
		Fail:             decide.FailLocal,            // a store outage neither stops traffic nor lifts the limits
		StoreTimeout:     dc.StoreTimeout,             // 50ms: a slow store costs a decision little
		StoreHardTimeout: dc.StoreHardTimeout,         // 10s: longer than a stall of Redis lasts, as Envoy's REDIS_TIMEOUT
		ConcurrencyLease: admit.DefaultConfig().Lease, // 1s: the decision APIs never say when a request ends
		ResponseHeaders:  rc.Headers,                  // the IETF draft's fields, X-RateLimit-* and Retry-After
		RetryJitter:      rc.RetryJitter,              // 1s: denied clients do not retry in lockstep
		GRPC: GRPCConfig{
			Addr:     "127.0.0.1:8081", // loopback: exposing it is a decision
			UnixMode: 0o660,            // the owner and its group may connect
			// MaxConnectionAge 0: connections live as long as their clients
		},
		HTTP:  HTTPConfig{Addr: "127.0.0.1:8080"},    // loopback, as gRPC
		TLS:   TLSConfig{Listeners: []string{"all"}}, // a certificate, once given, serves every listener
		Admin: AdminConfig{Addr: "127.0.0.1:8082"},   // loopback: it writes rules; off without Tokens
		Observe: ObserveConfig{
			DenyLogRate: oc.DenialLogRate, // 10 lines a second: enough to see who, not a flood
			TopKeys:     oc.MaxKeys,       // 16: a few domains' rules; 6.5 MiB at most
			TopWidth:    oc.Sketch.Width,  // 1024: counts at most 0.27% of a window's total too high
		},
		Envoy: EnvoyConfig{
			NearLimitRatio:      metrics.DefaultNearLimitRatio, // 0.8, Envoy's NEAR_LIMIT_RATIO
			StatsdFlushInterval: 10 * time.Second,              // Envoy's STATS_FLUSH_INTERVAL
		},
		Tracing: TracingConfig{ // off without an Endpoint
			Protocol:    tc.Protocol,    // OTLP/gRPC, the collectors' first
			SampleRatio: tc.SampleRatio, // 1%: spans cost; Envoy's sampled parents are always traced
			ServiceName: tc.ServiceName, // sluice
		},
		ShutdownTimeout: 10 * time.Second, // calls in flight finish; within Kubernetes' 30s grace
		Logger:          slog.Default(),
		// Identity, OpsAddrs, Proxy, Shadow: none.
	}
}

// DefaultProxyConfig returns the proxy's configuration of every zero
// field.
func DefaultProxyConfig() ProxyConfig {
	return ProxyConfig{
		Listen:     "127.0.0.1:8000", // loopback
		Domain:     "api",            // the examples' domain
		MaxWaiting: 1024,             // requests held at once in queue mode
	}
}

// ConfigError is a setting New refuses: a mistake of configuration, not a
// failure to start (`sluice serve` exits with status 2 for it).
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

// configError returns a *ConfigError.
func configError(format string, args ...any) error {
	return &ConfigError{msg: fmt.Sprintf(format, args...)}
}

// withDefaults returns c with every zero field set to its default, and
// refuses settings that can never work.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Rules.Source == "" {
		return c, configError("--rules (or $SLUICE_RULES) is required")
	}
	setDefault(&c.Rules.MaxFileBytes, d.Rules.MaxFileBytes)
	setDefault(&c.Rules.Poll, d.Rules.Poll)
	setDefault(&c.Rules.XDS.Node, d.Rules.XDS.Node)
	setDefault(&c.Rules.XDS.RetryInitial, d.Rules.XDS.RetryInitial)
	setDefault(&c.Rules.XDS.RetryMax, d.Rules.XDS.RetryMax)
	setDefault(&c.Rules.XDS.RetryJitter, d.Rules.XDS.RetryJitter)
	setDefault(&c.Rules.XDS.MaxMessageBytes, d.Rules.XDS.MaxMessageBytes)
	setDefault(&c.Store.URL, d.Store.URL) // for the logs; store/stack sets the Store's other defaults
	setDefault(&c.StoreTimeout, d.StoreTimeout)
	setDefault(&c.StoreHardTimeout, d.StoreHardTimeout)
	setDefault(&c.ConcurrencyLease, d.ConcurrencyLease)
	setDefault(&c.ResponseHeaders, d.ResponseHeaders)
	setDefault(&c.RetryJitter, d.RetryJitter)
	setDefault(&c.GRPC.Addr, d.GRPC.Addr)
	setDefault(&c.GRPC.UnixMode, d.GRPC.UnixMode)
	setDefault(&c.HTTP.Addr, d.HTTP.Addr)
	if len(c.TLS.Listeners) == 0 {
		c.TLS.Listeners = d.TLS.Listeners
	}
	setDefault(&c.Admin.Addr, d.Admin.Addr)
	setDefault(&c.Observe.DenyLogRate, d.Observe.DenyLogRate)
	setDefault(&c.Observe.TopKeys, d.Observe.TopKeys)
	setDefault(&c.Observe.TopWidth, d.Observe.TopWidth)
	setDefault(&c.Envoy.NearLimitRatio, d.Envoy.NearLimitRatio)
	setDefault(&c.Envoy.StatsdFlushInterval, d.Envoy.StatsdFlushInterval)
	setDefault(&c.Tracing.Protocol, d.Tracing.Protocol)
	setDefault(&c.Tracing.SampleRatio, d.Tracing.SampleRatio)
	setDefault(&c.Tracing.ServiceName, d.Tracing.ServiceName)
	setDefault(&c.ShutdownTimeout, d.ShutdownTimeout)
	setDefault(&c.Logger, d.Logger)
	if c.Proxy != nil {
		p, dp := *c.Proxy, DefaultProxyConfig()
		setDefault(&p.Listen, dp.Listen)
		setDefault(&p.Domain, dp.Domain)
		setDefault(&p.MaxWaiting, dp.MaxWaiting)
		c.Proxy = &p
	}
	return c, c.check()
}

// setDefault sets *v to def when it is zero.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// check refuses settings that are out of range whatever else is set.
func (c Config) check() error {
	if c.StoreHardTimeout < 0 {
		return configError("--store-hard-timeout %v: must not be negative", c.StoreHardTimeout)
	}
	if c.ConcurrencyLease < 0 {
		return configError("--concurrency-lease %v: must be above 0", c.ConcurrencyLease)
	}
	if c.Observe.TopKeys < 1 || c.Observe.TopKeys > observe.MaxMaxKeys {
		return configError("--top-keys %d: want 1 to %d", c.Observe.TopKeys, observe.MaxMaxKeys)
	}
	if c.Observe.TopWidth < 1 || c.Observe.TopWidth > sketch.MaxWidth {
		return configError("--top-width %d: want 1 to %d", c.Observe.TopWidth, sketch.MaxWidth)
	}
	if c.UI.Auth && c.Admin.Tokens == "" {
		return configError("--ui-auth: the dashboard asks for the admin tokens; set --admin-tokens")
	}
	return nil
}
