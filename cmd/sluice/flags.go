package main

import (
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/server"
)

// settings is what the flags of serve and proxy set: the server's Config,
// and how to log (the one thing cmd/sluice makes itself).
type settings struct {
	cfg                 server.Config
	logLevel, logFormat string
}

// The commands a flag belongs to.
const (
	forServe = 1 << iota
	forProxy
	forRules // check and simulate too: how rules files are read
	forBoth  = forServe | forProxy
)

// setting is one flag: the help group it is listed under (flagGroups), the commands
// that have it, its name and usage, and the field of settings it sets.
type setting struct {
	group string
	cmds  int
	name  string
	usage string
	field func(s *settings) flag.Value
}

// headersUsage is the help of --response-headers, the one vocabulary of
// every way in (server.ParseHeaders).
const headersUsage = "rate limit headers sent: all, none, or a list of ratelimit, x-ratelimit, retry-after"

// settingsTable is every flag of serve and proxy, in the order of their
// help; DefaultConfig gives their defaults.
var settingsTable = []setting{
	{"listeners", forServe, "grpc-addr", "address of Envoy's gRPC rate limit API; port 0 picks a free port; empty: none (with --grpc-unix)", func(s *settings) flag.Value { return noAddr(&s.cfg.GRPC.Addr) }},
	{"listeners", forServe, "grpc-unix", "path of a unix domain socket on which to serve the gRPC API too (a stale socket there is replaced)", func(s *settings) flag.Value { return str(&s.cfg.GRPC.Unix) }},
	{"listeners", forServe, "grpc-unix-mode", "permissions of --grpc-unix's socket, in octal", func(s *settings) flag.Value { return fileMode(&s.cfg.GRPC.UnixMode) }},
	{"listeners", forServe, "http-addr", "address of the HTTP API; port 0 picks a free port", func(s *settings) flag.Value { return str(&s.cfg.HTTP.Addr) }},
	{"listeners", forProxy, "upstream", "URL of the service behind the proxy (required)", func(s *settings) flag.Value { return str(&s.cfg.Proxy.Upstream) }},
	{"listeners", forProxy, "listen", "address the proxy listens on; port 0 picks a free port", func(s *settings) flag.Value { return str(&s.cfg.Proxy.Listen) }},
	{"listeners", forBoth, "ops-addr", "addresses (comma-separated) of listeners serving only /healthz, /readyz, /healthcheck and /metrics; none by default", func(s *settings) flag.Value { return list(&s.cfg.OpsAddrs) }},
	{"listeners", forServe, "grpc-max-connection-age", "close gRPC connections this old, gracefully, so that clients reconnect and spread over replicas (0: never)", func(s *settings) flag.Value { return duration(&s.cfg.GRPC.MaxConnectionAge) }},
	{"listeners", forServe, "grpc-max-connection-age-grace", "how long calls on a connection past --grpc-max-connection-age may take to finish (0: no bound)", func(s *settings) flag.Value { return duration(&s.cfg.GRPC.MaxConnectionAgeGrace) }},
	{"listeners", forServe, "grpc-reflection", "serve gRPC server reflection (for grpcurl and ghz)", func(s *settings) flag.Value { return notBool(&s.cfg.GRPC.NoReflection) }},
	{"listeners", forServe, "ops-pprof", "serve Go's profiles under /debug/pprof/ on the --ops-addr listeners alone (on in Envoy's environment: its debug port serves them)", func(s *settings) flag.Value { return boolean(&s.cfg.OpsPprof) }},
	{"listeners", forServe, "pprof", "serve Go's profiles under /debug/pprof/ on the HTTP address", func(s *settings) flag.Value { return boolean(&s.cfg.HTTP.Pprof) }},
	{"listeners", forServe, "shutdown-timeout", "how long a shutdown waits for calls in flight", func(s *settings) flag.Value { return zeroOff(&s.cfg.ShutdownTimeout) }},
	{"listeners", forProxy, "shutdown-timeout", "how long a shutdown waits for requests in flight", func(s *settings) flag.Value { return zeroOff(&s.cfg.ShutdownTimeout) }},

	{"rules", forBoth, "rules", "rules file or directory of *.yaml files, a rules database: redis://host:port/db, or an xDS management server: xds://host:port (required)", func(s *settings) flag.Value { return str(&s.cfg.Rules.Source) }},
	{"rules", forBoth | forRules, "max-rules-size", "largest rules file read, in bytes (16 MiB); a directory may hold 4 times as much", func(s *settings) flag.Value { return integer(&s.cfg.Rules.MaxFileBytes) }},
	{"envoy", forBoth | forRules, "rules-envoy-layout", "read every file below the rules directory, any extension, subdirectories too, as Envoy's ratelimit reads its runtime directory", func(s *settings) flag.Value { return boolean(&s.cfg.Rules.EnvoyLayout) }},
	{"envoy", forBoth | forRules, "rules-ignore-dot-files", "with --rules-envoy-layout, skip hidden files and directories (Envoy's RUNTIME_IGNOREDOTFILES; needed for a ConfigMap mount)", func(s *settings) flag.Value { return boolean(&s.cfg.Rules.IgnoreDotFiles) }},
	{"envoy", forBoth | forRules, "rules-merge-domains", "let one domain span several files or documents (Envoy's MERGE_DOMAIN_CONFIG)", func(s *settings) flag.Value { return boolean(&s.cfg.Rules.MergeDomains) }},
	{"rules", forBoth, "rules-snapshot", "with --rules redis://...: file keeping the last good rules, from which a node starts while the database is down", func(s *settings) flag.Value { return str(&s.cfg.Rules.Snapshot) }},
	{"rules", forBoth, "rules-xds-node", "with --rules xds://...: the node id sent, under which the server keeps this node's rules (Envoy's CONFIG_GRPC_XDS_NODE_ID)", func(s *settings) flag.Value { return str(&s.cfg.Rules.XDS.Node) }},
	{"rules", forBoth, "rules-xds-node-metadata", "with --rules xds://...: the node's metadata, key=value,... (Envoy's CONFIG_GRPC_XDS_NODE_METADATA)", func(s *settings) flag.Value { return keyValues(&s.cfg.Rules.XDS.Metadata) }},
	{"rules", forBoth, "rules-xds-headers", "with --rules xds://...: gRPC metadata sent on the stream, key=value,... (Envoy's CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS)", func(s *settings) flag.Value { return keyValues(&s.cfg.Rules.XDS.Headers) }},
	{"rules", forBoth, "rules-xds-tls", "with --rules xds://...: dial the server with TLS (files read again at each connection)", func(s *settings) flag.Value { return boolean(&s.cfg.Rules.XDS.TLS) }},
	{"rules", forBoth, "rules-xds-ca", "with --rules-xds-tls: PEM CA bundle that signs the server's certificate (default: the system's)", func(s *settings) flag.Value { return str(&s.cfg.Rules.XDS.CA) }},
	{"rules", forBoth, "rules-xds-cert", "with --rules-xds-tls: PEM client certificate, for a server that asks for one", func(s *settings) flag.Value { return str(&s.cfg.Rules.XDS.Cert) }},
	{"rules", forBoth, "rules-xds-key", "PEM private key of --rules-xds-cert", func(s *settings) flag.Value { return str(&s.cfg.Rules.XDS.Key) }},
	{"rules", forBoth, "rules-xds-server-name", "with --rules-xds-tls: the name the server's certificate must carry (default: the host of --rules)", func(s *settings) flag.Value { return str(&s.cfg.Rules.XDS.ServerName) }},
	{"rules", forBoth, "rules-xds-retry", "with --rules xds://...: first wait before subscribing again after the stream failed, doubled at each failure in a row", func(s *settings) flag.Value { return positive(&s.cfg.Rules.XDS.RetryInitial) }},
	{"rules", forBoth, "rules-xds-retry-max", "longest wait of --rules-xds-retry's doubling", func(s *settings) flag.Value { return positive(&s.cfg.Rules.XDS.RetryMax) }},
	{"rules", forBoth, "rules-xds-retry-jitter", "share of each wait before subscribing again drawn at random either way, 0 to 1", func(s *settings) flag.Value { return zeroOff(&s.cfg.Rules.XDS.RetryJitter) }},
	{"rules", forBoth, "rules-xds-max-message-size", "with --rules xds://...: largest response read, in bytes (Envoy's XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES)", func(s *settings) flag.Value { return positive(&s.cfg.Rules.XDS.MaxMessageBytes) }},
	{"rules", forBoth, "rules-xds-start-without-rules", "with --rules xds://...: ready before the first rules come, every request unlimited until then (Envoy's FORCE_START_WITHOUT_INITIAL_CONFIG); otherwise not ready until they come", func(s *settings) flag.Value { return boolean(&s.cfg.Rules.XDS.StartWithoutRules) }},
	{"rules", forBoth, "rules-poll", "with --rules redis://..., or a rules directory's overrides: how often the generation is read in case a change was missed (negative: never)", func(s *settings) flag.Value { return duration(&s.cfg.Rules.Poll) }},

	{"store", forBoth, "store", "where counters live: memory, or redis://host:port/db, rediss://..., redis+cluster://h1:p1,h2:p2, redis+sentinel://host:port/master, unix:///path/to/redis.sock", func(s *settings) flag.Value { return storeURL(&s.cfg.Store.URL) }},
	{"store", forBoth, "store-sentinel-auth", "password, or user:password, of the sentinels of a redis+sentinel:// store (the URL's is the master's)", func(s *settings) flag.Value { return str(&s.cfg.Store.SentinelAuth) }},
	{"store", forBoth, "store-expiry-jitter", "most time a Redis key outlives its reset, a random part of it, so that the keys of one window do not expire at once (Envoy's EXPIRATION_JITTER_MAX_SECONDS); 0: none", func(s *settings) flag.Value { return duration(&s.cfg.Store.ExpiryJitter) }},
	{"store", forBoth, "store-per-second-sentinel-auth", "password, or user:password, of the sentinels of a redis+sentinel:// --store-per-second", func(s *settings) flag.Value { return str(&s.cfg.Store.PerSecondSentinelAuth) }},
	{"store", forBoth, "store-per-second", "a second Redis URL, for the limits whose period is below a minute (Envoy's REDIS_PERSECOND); none by default", func(s *settings) flag.Value { return str(&s.cfg.Store.PerSecond) }},
	{"store", forBoth, "store-ca", "PEM CA bundle that signs the rediss:// store's certificate (default: the system's)", func(s *settings) flag.Value { return str(&s.cfg.StoreTLS.CA) }},
	{"store", forBoth, "store-cert", "PEM client certificate for the rediss:// store", func(s *settings) flag.Value { return str(&s.cfg.StoreTLS.Cert) }},
	{"store", forBoth, "store-key", "PEM private key of --store-cert", func(s *settings) flag.Value { return str(&s.cfg.StoreTLS.Key) }},
	{"store", forBoth, "store-skip-hostname-verification", "accept a store certificate that the CAs signed whatever name it carries", func(s *settings) flag.Value { return boolean(&s.cfg.StoreTLS.SkipHostnameVerification) }},
	{"store", forBoth, "max-memory", "most memory the memory store's keys and the metric series named by request values (a 64th) make the server hold, such as 256MiB or 1GiB (about 288 bytes a client)", func(s *settings) flag.Value { return byteSize(&s.cfg.Store.MaxMemory) }},
	{"store", forBoth, "max-entries", "most keys the memory store holds besides --max-memory; 0: no limit but --max-memory", func(s *settings) flag.Value { return integer(&s.cfg.Store.MaxEntries) }},
	{"store", forBoth, "flood-guard", "memory store: a client seen for the first time takes no entry until it is seen again (two Bloom filters, 4 MiB), so a flood of one-shot clients cannot push real ones out; costs at most one uncounted request per client a minute", func(s *settings) flag.Value { return boolean(&s.cfg.Store.FloodGuard) }},
	{"sync", forBoth, "near-cache", "bytes of denials a node keeps to answer over-limit clients without a Redis call until their retry time, exactly (8 MiB); 0 turns it off", func(s *settings) flag.Value { return zeroOff(&s.cfg.Store.NearCache) }},
	{"sync", forBoth, "sync", "how limits without their own sync: reach Redis: exact (every decision), lease (every algorithm but sliding_log: a server admits from leases of a hot key's quota, never over the limit) or async (every algorithm but sliding_log: a server admits from its share of each key and writes hits back every --sync-interval, calling Redis on a key's first decision and when a window's share is spent with room left; over a window's limit by at most limit/50, over a bucket's by burst/50 plus an interval's refill)", func(s *settings) flag.Value {
		return parsed(&s.cfg.Store.Sync, sluice.ParseSync)
	}},
	{"sync", forBoth | forRules, "sync-interval", "how often async mode writes hits back to Redis (check: warns of sync: async windows shorter than 4 of it)", func(s *settings) flag.Value { return positive(&s.cfg.Store.SyncInterval) }},
	{"sync", forBoth, "async-nodes", "the fewest servers async mode shares among: the servers count themselves in Redis, at least this many (a floor for servers that join)", func(s *settings) flag.Value { return positive(&s.cfg.Store.AsyncNodes) }},
	{"sync", forBoth, "lease-lifetime", "how long a lease outlives its client's last request before its unused hits go back to Redis (a window limit's at most a quarter of its period)", func(s *settings) flag.Value { return positive(&s.cfg.Store.LeaseLifetime) }},
	{"sync", forBoth, "max-lease", "most hits one lease carries (also at most 1/16 of its limit, 1/4 of a window of 4 lifetimes or less)", func(s *settings) flag.Value { return positive(&s.cfg.Store.MaxLease) }},
	{"envoy", forBoth, "envoy-redis-keys", "count fixed windows in Redis under Envoy ratelimit's keys and as it counts (INCRBY, EXPIRE), sharing its counters (a Redis --store only; on in Envoy's environment with a Redis store: =false opts out)", func(s *settings) flag.Value { return boolean(&s.cfg.Store.EnvoyKeys) }},
	{"envoy", forBoth, "envoy-stop-increment", "with --envoy-redis-keys, a request whose hits would take a key over its limit counts them on such keys alone (Envoy's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)", func(s *settings) flag.Value { return boolean(&s.cfg.Store.EnvoyStopIncrement) }},
	{"envoy", forBoth, "envoy-key-prefix", "with --envoy-redis-keys, the prefix of Envoy's keys (Envoy's CACHE_KEY_PREFIX)", func(s *settings) flag.Value { return str(&s.cfg.Store.EnvoyKeyPrefix) }},
	{"store", forBoth, "region", "this server's region: with --peer-region, a limit of scope: global is one limit for every region, each deciding on its own Redis (docs/regions.md); empty: every limit is its region's", func(s *settings) flag.Value { return str(&s.cfg.Store.Region) }},
	{"store", forBoth | forRules, "region-sync-interval", "how often a --region server reads every region's counts and sets its caps (a round)", func(s *settings) flag.Value { return positive(&s.cfg.Store.RegionSyncInterval) }},
	{"store", forBoth, "region-peer-timeout", "the least a round waits for a peer region's read: it waits 3 times the peer's reads, within this and --region-max-peer-timeout; a peer not read in time is cut off for the round, one whose read takes longer than this is lagging (read, and every region's rounds wait for it)", func(s *settings) flag.Value { return positive(&s.cfg.Store.RegionPeerTimeout) }},
	{"store", forBoth, "region-max-peer-timeout", "the most a round waits for a peer region's read (default 4 times --region-peer-timeout)", func(s *settings) flag.Value { return positive(&s.cfg.Store.RegionMaxPeerTimeout) }},
	{"store", forBoth | forRules, "region-share", "k: a round gives each region 1/(regions × k) of what is left of a global limit, which is overshot by at most 1/k of it", func(s *settings) flag.Value { return positive(&s.cfg.Store.RegionShare) }},
	{"store", forBoth, "peer-region", "another region, as NAME=URL: a Redis through which its counts are read (its own, or a read replica of it in this region); once for each region, every region listing every other", func(s *settings) flag.Value { return peerRegions(&s.cfg.Store.Peers) }},

	{"decisions", forBoth, "fail", "when the store is slow, stalled, failing or not reached: local (each server decides from the store's last counts and its share of each limit among the servers counted, at most about 1.05x the limit plus a hit a server, and writes its hits back when the store answers; a denial of a key its own calls or settling keep local waits for the store while it answers, at most 1.5s; docs/stores.md), open (admit without limits) or closed (deny); with open and closed a call over --store-timeout is denied (slow)", failMode},
	{"decisions", forBoth, "store-timeout", "least wait for the store per decision before --fail decides: the wait follows the store's latency (twice its p99 of recent calls, at most 200ms); with --fail local the call goes on and counts its hits (negative: no bound)", func(s *settings) flag.Value { return duration(&s.cfg.StoreTimeout) }},
	{"decisions", forBoth, "store-hard-timeout", "with --fail local, the longest a store call goes on after its decision was made locally; one that ends within it is counted by the store, one that does not counts as failed and its hits are written back later (Envoy's REDIS_TIMEOUT, REDIS_PERSECOND_TIMEOUT)", func(s *settings) flag.Value { return duration(&s.cfg.StoreHardTimeout) }},
	{"decisions", forBoth, "concurrency-lease", "how long a request of the decision APIs (gRPC, JSON, forward-auth), which report no end, holds a slot of a concurrency limit", func(s *settings) flag.Value { return positive(&s.cfg.ConcurrencyLease) }},
	{"decisions", forBoth, "shadow", "every limit in shadow mode: decided and counted, never enforced (Envoy's SHADOW_MODE)", func(s *settings) flag.Value { return boolean(&s.cfg.Shadow) }},
	{"decisions", forServe, "identity", "identity file (Envoy rate_limits actions): serves forward-auth on GET /v1/auth", func(s *settings) flag.Value { return str(&s.cfg.Identity) }},
	{"decisions", forProxy, "identity", "identity file (Envoy rate_limits actions); default: one limit per client IP", func(s *settings) flag.Value { return str(&s.cfg.Identity) }},
	{"decisions", forProxy, "domain", "rules domain of the default per-IP identity (unused with --identity)", func(s *settings) flag.Value { return str(&s.cfg.Proxy.Domain) }},
	{"decisions", forBoth, "response-headers", headersUsage, func(s *settings) flag.Value { return parsed(&s.cfg.ResponseHeaders, server.ParseHeaders) }},
	{"decisions", forBoth, "retry-jitter", "most random time added to Retry-After, in whole seconds", func(s *settings) flag.Value { return zeroOff(&s.cfg.RetryJitter) }},
	{"decisions", forProxy, "max-delay", "longest a request a leaky_bucket admits is held for its turn; one whose turn is further gets 429 at once (0: never hold)", func(s *settings) flag.Value { return duration(&s.cfg.Proxy.MaxDelay) }},
	{"decisions", forProxy, "max-waiting", "most requests waiting for their turn at once", func(s *settings) flag.Value { return integer(&s.cfg.Proxy.MaxWaiting) }},
	{"decisions", forProxy, "shed", "adaptive load shedding: an adaptive limit on requests in flight to the upstream, which sheds by the rules' priority (503) when it is saturated; critical and default requests wait up to --max-delay (1s when 0) for a slot", func(s *settings) flag.Value { return boolean(&s.cfg.Proxy.Shed) }},

	{"observability", forBoth, "log-level", "debug, info, warn or error", func(s *settings) flag.Value { return slogLevel(&s.logLevel) }},
	{"observability", forBoth, "log-format", "text, json, or envoy: JSON with Envoy ratelimit's field names (@timestamp, @message, level as logrus names it)", func(s *settings) flag.Value { return oneOf(&s.logFormat, "log format", "text", "json", "envoy") }},
	{"observability", forBoth, "deny-log-rate", "most denials logged a second, each with domain, descriptor, limit and retry time (10); the next line logged counts those left out; negative logs none", func(s *settings) flag.Value { return zeroOff(&s.cfg.Observe.DenyLogRate) }},
	{"observability", forBoth, "top-keys", "most domain and descriptor key pairs whose heavy hitters GET /v1/top counts (16: 6.5 MiB at most with --top-width 1024)", func(s *settings) flag.Value { return positive(&s.cfg.Observe.TopKeys) }},
	{"observability", forBoth, "top-width", "counters per row of each count-min sketch: /v1/top's counts are at most e/width of a window's total too high, with 98% confidence (1024: 0.27%)", func(s *settings) flag.Value { return positive(&s.cfg.Observe.TopWidth) }},
	{"envoy", forBoth, "envoy-metrics", "also count Envoy ratelimit's per-descriptor metrics under its names (ratelimit_service_rate_limit_total_hits...)", func(s *settings) flag.Value { return boolean(&s.cfg.Envoy.Metrics) }},
	{"envoy", forBoth, "near-limit-ratio", "share of a limit past which --envoy-metrics counts hits as near_limit", func(s *settings) flag.Value { return float(&s.cfg.Envoy.NearLimitRatio) }},
	{"envoy", forBoth, "statsd-addr", "host:port of a statsd server (UDP) to send Envoy ratelimit's counters to, by Envoy's names (with --envoy-metrics); none by default", func(s *settings) flag.Value { return str(&s.cfg.Envoy.StatsdAddr) }},
	{"envoy", forBoth, "statsd-flush-interval", "how often --statsd-addr gets what the counters counted since", func(s *settings) flag.Value { return positive(&s.cfg.Envoy.StatsdFlushInterval) }},
	{"observability", forBoth, "otlp-endpoint", "OTLP collector URL (http://collector:4317): trace decisions and store calls; none: no tracing, at no cost", func(s *settings) flag.Value { return str(&s.cfg.Tracing.Endpoint) }},
	{"observability", forBoth, "otlp-protocol", "grpc or http (OTLP/HTTP)", func(s *settings) flag.Value {
		return oneOf(&s.cfg.Tracing.Protocol, "OTLP protocol", "grpc", "http", "http/protobuf")
	}},
	{"observability", forBoth, "trace-sample-ratio", "share of decisions without a parent span that are traced (under a sampled parent, all are)", func(s *settings) flag.Value { return zeroOff(&s.cfg.Tracing.SampleRatio) }},
	{"observability", forBoth, "trace-service-name", "service.name of the spans", func(s *settings) flag.Value { return str(&s.cfg.Tracing.ServiceName) }},

	{"tls", forBoth, "tls-cert", "PEM certificate chain: serve TLS (reloaded when the file changes)", func(s *settings) flag.Value { return str(&s.cfg.TLS.Cert) }},
	{"tls", forBoth, "tls-key", "PEM private key of --tls-cert", func(s *settings) flag.Value { return str(&s.cfg.TLS.Key) }},
	{"tls", forBoth, "tls-client-ca", "PEM CA bundle: require client certificates it signed (mutual TLS)", func(s *settings) flag.Value { return str(&s.cfg.TLS.ClientCA) }},
	{"tls", forBoth, "tls-client-san", "a name (DNS, URI, IP or email) every client certificate must carry", func(s *settings) flag.Value { return str(&s.cfg.TLS.ClientSAN) }},
	{"tls", forBoth, "tls-listeners", "listeners that serve TLS: all, or a list of grpc, http, ops, admin, ui (serve) or proxy, ops, admin, ui (proxy)", func(s *settings) flag.Value {
		return listOf(&s.cfg.TLS.Listeners, "listener", "all", "grpc", "http", "ops", "admin", "ui", "proxy")
	}},

	{"admin", forBoth, "admin-addr", "address of the admin API (rules, history, overrides), served when --admin-tokens is set; loopback by default", func(s *settings) flag.Value { return str(&s.cfg.Admin.Addr) }},
	{"admin", forBoth, "admin-tokens", "file of admin API tokens, one a line: NAME read|write SECRET (# comments); none: no admin API", func(s *settings) flag.Value { return str(&s.cfg.Admin.Tokens) }},
	{"admin", forBoth, "admin-read-only", "the admin API reads and dry-runs only (a GitOps setup)", func(s *settings) flag.Value { return boolean(&s.cfg.Admin.ReadOnly) }},
	{"listeners", forBoth, "ui-addr", "the dashboard's own listener (/ui, its simulator, /v1/top, /v1/keys), where alone it is then served; none: no dashboard; default: beside the HTTP API and on the ops listeners", func(s *settings) flag.Value { return str(&s.cfg.UI.Addr) }},
	{"admin", forBoth, "ui-auth", "the dashboard asks for a token of --admin-tokens (any role): a browser's password prompt, or Authorization: Bearer", func(s *settings) flag.Value { return boolean(&s.cfg.UI.Auth) }},
}

// newSettings returns the settings of the command cmd (forServe or
// forProxy) at their defaults.
func newSettings(cmd int) *settings {
	s := &settings{cfg: server.DefaultConfig(), logLevel: "info", logFormat: "text"}
	if cmd == forProxy {
		p := server.DefaultProxyConfig()
		s.cfg.Proxy = &p
	}
	return s
}

// register adds to fs the flags of the commands cmd, each with its
// environment variable in its usage, bound to s.
func (s *settings) register(fs *ff.FlagSet, cmd int) {
	for _, st := range settingsTable {
		if st.cmds&cmd == 0 {
			continue
		}
		if _, err := fs.AddFlag(ff.FlagConfig{LongName: st.name, Usage: withEnv(st.name, st.usage), Value: st.field(s)}); err != nil {
			panic(err) // a mistake in settingsTable
		}
	}
}

// value is a flag.Value over a field of settings: parse reads a flag's
// text into it, show writes it back.
type value[T any] struct {
	p      *T
	parse  func(string) (T, error)
	show   func(T) string
	isBool bool
	ph     string // the help's placeholder; "": the type's name
}

func (v *value[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}

func (v *value[T]) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return v.show(*v.p)
}

// IsBoolFlag makes a boolean flag take no argument.
func (v *value[T]) IsBoolFlag() bool { return v.isBool }

// GetPlaceholder names the flag's value in the help.
func (v *value[T]) GetPlaceholder() string { return v.ph }

func str(p *string) flag.Value {
	return &value[string]{p: p, parse: func(s string) (string, error) { return s, nil }, show: func(s string) string { return s }}
}

func boolean(p *bool) flag.Value {
	return &value[bool]{p: p, parse: strconv.ParseBool, show: strconv.FormatBool, isBool: true}
}

// notBool is a flag whose true is the field's false: --grpc-reflection
// sets GRPCConfig.NoReflection.
func notBool(p *bool) flag.Value {
	return &value[bool]{p: p, isBool: true,
		parse: func(s string) (bool, error) { b, err := strconv.ParseBool(s); return !b, err },
		show:  func(b bool) string { return strconv.FormatBool(!b) }}
}

func duration(p *time.Duration) flag.Value {
	return &value[time.Duration]{p: p, parse: time.ParseDuration, show: time.Duration.String}
}

func integer(p *int) flag.Value {
	return &value[int]{p: p, parse: parseNumber[int], show: strconv.Itoa}
}

func float(p *float64) flag.Value {
	return &value[float64]{p: p, parse: func(s string) (float64, error) { return strconv.ParseFloat(s, 64) },
		show: func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }}
}

// number is what zeroOff and positive take.
type number interface {
	~int | ~int64 | ~float64
}

// parseNumber reads a duration for time.Duration, a number otherwise.
func parseNumber[T number](s string) (T, error) {
	var zero T
	switch any(zero).(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		return T(d), err
	case float64:
		f, err := strconv.ParseFloat(s, 64)
		return T(f), err
	}
	n, err := strconv.ParseInt(s, 0, strconv.IntSize)
	return T(n), err
}

// showNumber writes what parseNumber reads.
func showNumber[T number](n T) string {
	switch v := any(n).(type) {
	case time.Duration:
		return v.String()
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strconv.FormatInt(int64(n), 10)
}

// placeholder names a number's type in the help.
func placeholder[T number]() string {
	switch any(*new(T)).(type) {
	case time.Duration:
		return "DURATION"
	case float64:
		return "FLOAT64"
	}
	return "INT"
}

// zeroOff is a flag whose 0 turns something off, which the field says by
// a negative value (its zero is the default).
func zeroOff[T number](p *T) flag.Value {
	return &value[T]{p: p, ph: placeholder[T](),
		parse: func(s string) (T, error) {
			n, err := parseNumber[T](s)
			if err == nil && n == 0 {
				n = -1
			}
			return n, err
		},
		show: func(n T) string { return showNumber(max(n, 0)) }}
}

// positive is a flag that must be above 0 (the field's 0 is its default).
func positive[T number](p *T) flag.Value {
	return &value[T]{p: p, show: showNumber[T], ph: placeholder[T](),
		parse: func(s string) (T, error) {
			n, err := parseNumber[T](s)
			if err == nil && n <= 0 {
				err = fmt.Errorf("%s: must be above 0", s)
			}
			return n, err
		}}
}

// failMode is --fail: set (from the command line, SLUICE_FAIL or
// --config), it also says the operator chose it (server.Config.FailExplicit:
// --fail open, given, serves before the store is reached).
func failMode(s *settings) flag.Value {
	return &value[server.Fail]{p: &s.cfg.Fail, ph: "STRING", show: server.Fail.String,
		parse: func(v string) (server.Fail, error) {
			f, err := server.ParseFail(v)
			if err == nil {
				s.cfg.FailExplicit = true
			}
			return f, err
		}}
}

// parsed is a flag of a typed field read by parse and written by its
// String method.
func parsed[T fmt.Stringer](p *T, parse func(string) (T, error)) flag.Value {
	return &value[T]{p: p, parse: parse, show: func(v T) string { return v.String() }, ph: "STRING"}
}

// oneOf is a string flag whose value is one of names, in any case, or
// empty (the default); what is a name of. A mistake is refused where it is
// set, so that a config file reports it at its line even when nothing
// uses the value.
func oneOf(p *string, what string, names ...string) flag.Value {
	return &value[string]{p: p, show: func(s string) string { return s },
		parse: func(s string) (string, error) {
			if s == "" || slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(s, n) }) {
				return s, nil
			}
			return "", unknown(what, s, names)
		}}
}

// listOf is a comma-separated flag of names (each checked as oneOf checks).
func listOf(p *[]string, what string, names ...string) flag.Value {
	return &value[[]string]{p: p, ph: "STRING", show: func(l []string) string { return strings.Join(l, ",") },
		parse: func(s string) ([]string, error) {
			l := strings.Split(s, ",")
			for _, x := range l {
				if !slices.Contains(names, strings.TrimSpace(x)) {
					return nil, unknown(what, x, names)
				}
			}
			return l, nil
		}}
}

// unknown is the mistake of a value that is none of names.
func unknown(what, s string, names []string) error {
	return fmt.Errorf("unknown %s %q (want %s or %s)", what, s, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
}

// slogLevel is --log-level: a level slog reads (debug, info, warn, error).
func slogLevel(p *string) flag.Value {
	return &value[string]{p: p, show: func(s string) string { return s },
		parse: func(s string) (string, error) {
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(s)); err != nil {
				return "", unknown("log level", s, []string{"debug", "info", "warn", "error"})
			}
			return s, nil
		}}
}

// keyValues is a comma-separated flag of key=value pairs (key:value too,
// as Envoy's variables write them).
func keyValues(p *map[string]string) flag.Value {
	show := func(m map[string]string) string {
		keys := slices.Sorted(maps.Keys(m))
		for i, k := range keys {
			keys[i] = k + "=" + m[k]
		}
		return strings.Join(keys, ",")
	}
	return &value[map[string]string]{p: p, ph: "KEY=VALUE,...", show: show,
		parse: func(s string) (map[string]string, error) {
			out := map[string]string{}
			for _, kv := range strings.Split(s, ",") {
				if strings.TrimSpace(kv) == "" {
					continue
				}
				i := strings.IndexAny(kv, "=:")
				if i <= 0 {
					return nil, fmt.Errorf("%q: want key=value", kv)
				}
				out[strings.TrimSpace(kv[:i])] = strings.TrimSpace(kv[i+1:])
			}
			return out, nil
		}}
}

// list is a comma-separated flag of a list of strings.
func list(p *[]string) flag.Value {
	return &value[[]string]{p: p, ph: "STRING", show: func(l []string) string { return strings.Join(l, ",") },
		parse: func(s string) ([]string, error) { return strings.Split(s, ","), nil }}
}

// peerRegions is --peer-region: each NAME=URL it is given adds a region,
// and a list of them (a config file's, SLUICE_PEER_REGION), comma-separated,
// adds each; a comma followed by no NAME=scheme:// is part of the URL before
// it (redis+cluster://h1:p1,h2:p2). Given back the list it held before its
// last value, it goes back to it: a config file's value is checked so
// against a flag's, which it does not replace (setChecked).
func peerRegions(p *[]server.Peer) flag.Value {
	show := func(ps []server.Peer) string {
		s := make([]string, len(ps))
		for i, pr := range ps {
			s[i] = pr.Name + "=" + pr.URL
		}
		return strings.Join(s, ",")
	}
	var prev []server.Peer
	return &value[[]server.Peer]{p: p, ph: "NAME=URL", show: show, parse: func(s string) ([]server.Peer, error) {
		if len(*p) > 0 && s == show(prev) {
			return prev, nil
		}
		add, err := parsePeers(s)
		if err != nil {
			return nil, err
		}
		prev = *p
		return append(slices.Clone(*p), add...), nil
	}}
}

// parsePeers reads NAME=URL items, comma-separated (see peerRegions).
func parsePeers(s string) ([]server.Peer, error) {
	var out []server.Peer
	for _, part := range strings.Split(s, ",") {
		name, rest, ok := strings.Cut(part, "=")
		if ok && validRegion(name) && strings.Contains(rest, "://") {
			out = append(out, server.Peer{Name: name, URL: rest})
			continue
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("%q: want NAME=URL, such as us-east=redis://redis.us-east:6379", part)
		}
		out[len(out)-1].URL += "," + part
	}
	return out, nil
}

// validRegion reports whether name can name a region: letters, digits,
// '.', '_' and '-'.
func validRegion(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// noAddr is an address flag whose empty value is server.NoAddr.
func noAddr(p *string) flag.Value {
	return &value[string]{p: p,
		parse: func(s string) (string, error) {
			if s == "" {
				return server.NoAddr, nil
			}
			return s, nil
		},
		show: func(s string) string { return strings.TrimPrefix(s, server.NoAddr) }}
}

// storeURL is --store, which may not be empty.
func storeURL(p *string) flag.Value {
	return &value[string]{p: p, show: func(s string) string { return s },
		parse: func(s string) (string, error) {
			if s == "" {
				return "", fmt.Errorf("--store is empty (want memory)")
			}
			return s, nil
		}}
}

// maxMemoryCap is the largest --max-memory accepted: 1 PiB.
const maxMemoryCap = 1 << 50

// byteSize is a flag of bytes written as a size: 268435456, 256MiB,
// 1.5GiB or 300MB (humanize.ParseBytes: KiB, MiB, GiB are powers of 1024;
// kB, MB, GB powers of 1000).
func byteSize(p *int64) flag.Value {
	return &value[int64]{p: p, ph: "BYTESIZE", show: func(n int64) string { return humanize.IBytes(uint64(n)) },
		parse: func(s string) (int64, error) {
			n, err := humanize.ParseBytes(s)
			switch {
			case err != nil:
				return 0, fmt.Errorf("want a size such as 256MiB or 1GiB: %w", err)
			case n == 0 || n > maxMemoryCap:
				return 0, fmt.Errorf("%s: want more than 0 and at most 1PiB", s)
			}
			return int64(n), nil
		}}
}

// fileMode is a flag of file permissions written in octal: 660, 0660 or
// 0o660; at most 0777.
func fileMode(p *fs.FileMode) flag.Value {
	return &value[fs.FileMode]{p: p, show: func(m fs.FileMode) string { return fmt.Sprintf("%#o", uint32(m)) },
		parse: func(s string) (fs.FileMode, error) {
			n, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O"), 8, 32)
			if err != nil || n > 0o777 {
				return 0, fmt.Errorf("%q: want permissions in octal, such as 0660 (at most 0777)", s)
			}
			return fs.FileMode(n), nil
		}}
}
