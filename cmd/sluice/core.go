package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/peterbourgon/ff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/localfirst"
	"github.com/sluicehq/sluice/tracing"
	"github.com/sluicehq/sluice/transport/forwardauth"
	"github.com/sluicehq/sluice/transport/respond"
	"github.com/sluicehq/sluice/ui"
)

// coreFlags are the flags of every command that decides: serve and proxy.
type coreFlags struct {
	rules        string
	maxRulesSize int
	envoyLayout  bool // read the rules directory as Envoy's runtime
	ignoreDot    bool // with envoyLayout, skip hidden entries
	mergeDomains bool // a domain may span files
	store        string
	sentinelAuth string // the sentinels' "password" or "user:password"
	perSecond    string // a Redis for the limits below a minute, or ""
	perSecondSA  string // its sentinels' "password" or "user:password"
	expiryJitter time.Duration
	storeTimeout time.Duration
	slotLease    time.Duration
	fail         string
	maxEntries   int
	maxMemory    byteSize
	nearCache    int
	sync         string
	leaseLife    time.Duration
	maxLease     int
	syncInterval time.Duration
	asyncNodes   int
	logLevel     string
	logFormat    string
	compat       compatFlags  // Envoy ratelimit's metrics and shadow mode
	observe      observeFlags // heavy hitters and the denial log
	net          listenFlags  // ops listeners and TLS
	trace        traceFlags   // OpenTelemetry spans
	storeTLS     storeTLSFlags
	db           rulesDBFlags // a rules database's snapshot and polling
	admin        adminFlags   // the admin API
}

func (c *coreFlags) register(fs *ff.FlagSet) {
	fs.StringVar(&c.rules, 0, "rules", "", withEnv("rules", "rules file or directory of *.yaml files, or a rules database: redis://host:port/db (required)"))
	c.registerRules(fs)
	c.db.register(fs)
	fs.StringVar(&c.store, 0, "store", "memory", withEnv("store", "where counters live: memory, or redis://host:port/db, rediss://..., redis+cluster://h1:p1,h2:p2, redis+sentinel://host:port/master, unix:///path/to/redis.sock"))
	fs.StringVar(&c.sentinelAuth, 0, "store-sentinel-auth", "", withEnv("store-sentinel-auth", "password, or user:password, of the sentinels of a redis+sentinel:// store (the URL's is the master's)"))
	fs.DurationVar(&c.expiryJitter, 0, "store-expiry-jitter", 0, withEnv("store-expiry-jitter", "most time a Redis key outlives its reset, a random part of it, so that the keys of one window do not expire at once (Envoy's EXPIRATION_JITTER_MAX_SECONDS); 0: none"))
	fs.StringVar(&c.perSecondSA, 0, "store-per-second-sentinel-auth", "", withEnv("store-per-second-sentinel-auth", "password, or user:password, of the sentinels of a redis+sentinel:// --store-per-second"))
	fs.StringVar(&c.perSecond, 0, "store-per-second", "", withEnv("store-per-second", "a second Redis URL, for the limits whose period is below a minute (Envoy's REDIS_PERSECOND); none by default"))
	fs.DurationVar(&c.slotLease, 0, "concurrency-lease", decide.DefaultConfig().Lease, withEnv("concurrency-lease", "how long a request of the decision APIs (gRPC, JSON, forward-auth), which report no end, holds a slot of a concurrency limit"))
	fs.DurationVar(&c.storeTimeout, 0, "store-timeout", decide.DefaultConfig().StoreTimeout, withEnv("store-timeout", "longest wait for the store per decision before --fail decides (negative: no bound)"))
	fs.StringVar(&c.fail, 0, "fail", "open", withEnv("fail", "when the store fails: open (allow), closed (deny) or local (in-process limits)"))
	c.maxMemory = defaultMaxMemory
	fs.Value(0, "max-memory", &c.maxMemory, withEnv("max-memory", "most memory the memory store's keys make the server hold, such as 256MiB or 1GiB (about 288 bytes a client)"))
	fs.IntVar(&c.maxEntries, 0, "max-entries", 0, withEnv("max-entries", "most keys the memory store holds besides --max-memory; 0: no limit but --max-memory"))
	fs.IntVar(&c.nearCache, 0, "near-cache", 8<<20, withEnv("near-cache", "bytes of denials a node keeps to answer over-limit clients without a Redis call until their retry time, exactly (8 MiB); 0 turns it off"))
	fs.StringVar(&c.sync, 0, "sync", "exact", withEnv("sync", "how limits without their own sync: reach Redis: exact (every decision), lease (every algorithm but sliding_log: a server admits from leases of a hot key's quota, never over the limit) or async (every algorithm but sliding_log: no Redis call per decision, hits written back every --sync-interval; over a window's limit by at most limit/50, over a bucket's by burst/50 plus an interval's refill)"))
	fs.DurationVar(&c.syncInterval, 0, "sync-interval", 100*time.Millisecond, withEnv("sync-interval", "how often async mode writes hits back to Redis"))
	fs.IntVar(&c.asyncNodes, 0, "async-nodes", 1, withEnv("async-nodes", "how many servers share Redis in async mode: each admits between syncs 1/(50 × this) of what is left (and of a bucket's refill, 1/this)"))
	fs.DurationVar(&c.leaseLife, 0, "lease-lifetime", 500*time.Millisecond, withEnv("lease-lifetime", "how long a lease outlives its client's last request before its unused hits go back to Redis"))
	fs.IntVar(&c.maxLease, 0, "max-lease", 1000, withEnv("max-lease", "most hits one lease carries (and at most a sixteenth of its limit)"))
	fs.StringVar(&c.logLevel, 0, "log-level", "info", withEnv("log-level", "debug, info, warn or error"))
	fs.StringVar(&c.logFormat, 0, "log-format", "text", withEnv("log-format", "text or json"))
	c.compat.register(fs)
	c.observe.register(fs)
	c.net.register(fs)
	c.trace.register(fs)
	c.storeTLS.register(fs)
	c.admin.register(fs)
}

// registerRules registers the flags of how rules are read, which check
// shares.
func (c *coreFlags) registerRules(fs *ff.FlagSet) {
	fs.IntVar(&c.maxRulesSize, 0, "max-rules-size", rules.DefaultMaxFileBytes, withEnv("max-rules-size", "largest rules file read, in bytes (16 MiB); a directory may hold 4 times as much"))
	fs.BoolVar(&c.envoyLayout, 0, "rules-envoy-layout", withEnv("rules-envoy-layout", "read every file below the rules directory, any extension, subdirectories too, as Envoy's ratelimit reads its runtime directory"))
	fs.BoolVar(&c.ignoreDot, 0, "rules-ignore-dot-files", withEnv("rules-ignore-dot-files", "with --rules-envoy-layout, skip hidden files and directories (Envoy's RUNTIME_IGNOREDOTFILES; needed for a ConfigMap mount)"))
	fs.BoolVar(&c.mergeDomains, 0, "rules-merge-domains", withEnv("rules-merge-domains", "let one domain span several files or documents (Envoy's MERGE_DOMAIN_CONFIG)"))
}

// loader returns the rules loader the flags ask for: a cap of
// --max-rules-size on a file and 4 times that on a directory.
func (c *coreFlags) loader() rules.Loader {
	return rules.Loader{MaxFileBytes: int64(c.maxRulesSize), MaxTotalBytes: 4 * int64(c.maxRulesSize),
		EnvoyLayout: c.envoyLayout, IgnoreDotFiles: c.ignoreDot, MergeDomains: c.mergeDomains}
}

// core is what serve and proxy share: the metrics registry, the store, the
// rules watcher and the decision service wrapped in metrics.
type core struct {
	reg      *prometheus.Registry
	watcher  rulesSource // the files' watcher or the rules database's retriever
	rulesDB  control.DB  // what the admin API writes: the rules database, or control/filedb for a rules directory; nil for one file
	rulesM   *metrics.RulesSource
	decider  *metrics.Decider
	svc      *decide.Service  // beneath the decorators: GET /v1/keys looks without counting
	observer *observe.Decider // heavy hitters, denial log
	events   *ui.Events       // rules loads, for the dashboard
	stores   *openedStore
	closers  []func() error // in the order to call them
}

// newCore opens the store, loads and watches the rules and makes the
// decision service. The caller calls close when done, also on error paths
// after newCore returned.
func newCore(log *slog.Logger, c coreFlags) (_ *core, err error) {
	if c.rules == "" {
		return nil, usageError("--rules (or $SLUICE_RULES) is required")
	}
	fail, err := decide.ParseFail(c.fail)
	if err != nil {
		return nil, usageError("--fail: %v", err)
	}
	sync, err := sluice.ParseSync(c.sync)
	if err != nil {
		return nil, usageError("--sync: %v", err)
	}
	if c.leaseLife <= 0 || c.maxLease <= 0 || c.syncInterval <= 0 || c.asyncNodes <= 0 {
		return nil, usageError("--lease-lifetime, --max-lease, --sync-interval and --async-nodes must be positive")
	}
	if c.slotLease <= 0 {
		return nil, usageError("--concurrency-lease %v: must be above 0", c.slotLease)
	}
	oc, err := c.observe.config()
	if err != nil {
		return nil, err
	}
	co := &core{reg: prometheus.NewRegistry(), events: ui.NewEvents(reloadEvents)}
	defer func() {
		if err != nil {
			err = errors.Join(err, co.close())
		}
	}()
	for _, col := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := co.reg.Register(col); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	m, err := metrics.New(co.reg)
	if err != nil {
		return nil, err
	}
	if err := c.compat.metrics(m, co.reg); err != nil {
		return nil, err
	}
	if c.compat.statsd.addr != "" {
		co.closers = append(co.closers, startStatsd(m, c.compat.statsd, log))
	}

	storeTLS, err := c.storeTLS.config(c.store)
	if err != nil {
		return nil, err
	}
	st, err := openStore(c.store, storeOptions{
		maxEntries: c.maxEntries, maxMemory: int64(c.maxMemory), floodGuard: c.observe.floodGuard, log: log, tls: storeTLS, envoyKeys: c.compat.envoyKeys, envoyKeyPrefix: c.compat.envoyKeyPrefix,
		sentinelAuth: c.sentinelAuth, perSecond: c.perSecond, expiryJitter: c.expiryJitter,
		perSecondSentinelAuth: c.perSecondSA,
		local: localfirst.Config{
			NearCacheBytes: int64(c.nearCache), Sync: sync, RequestSync: true,
			LeaseLifetime: c.leaseLife, MaxLease: int64(c.maxLease),
			SyncInterval: c.syncInterval, AsyncNodes: int64(c.asyncNodes),
		},
	})
	if err != nil {
		return nil, err
	}
	if nc := st.near; len(nc) > 0 {
		hits := func() uint64 { return nc.Stats().NearHits }
		misses := func() uint64 { return nc.Stats().NearMisses }
		if err := metrics.NearCache(co.reg, hits, misses); err != nil {
			return nil, errors.Join(err, st.close())
		}
		leased := func() uint64 { return nc.Stats().LeaseHits }
		grants := func() uint64 { return nc.Stats().Grants }
		calls := func() uint64 { return nc.Stats().StoreCalls }
		if err := metrics.Leases(co.reg, leased, grants, calls); err != nil {
			return nil, errors.Join(err, st.close())
		}
		if err := metrics.Async(co.reg, func() uint64 { return nc.Stats().AsyncDecisions }); err != nil {
			return nil, errors.Join(err, st.close())
		}
	}
	if co.rulesM, err = metrics.NewRulesSource(co.reg, func() *rules.Set {
		if co.watcher == nil {
			return nil
		}
		return co.watcher.Current()
	}); err != nil {
		return nil, errors.Join(err, st.close())
	}
	watcher, db, closeRules, err := openRules(log, c, st.check, m, co.rulesM, func(set *rules.Set, err error) { co.events.Add(time.Now(), set, err) })
	if err != nil {
		return nil, errors.Join(err, st.close())
	}
	co.watcher, co.rulesDB, co.stores = watcher, db, st
	co.closers = append(co.closers, closeRules, st.close)
	log.Info("rules loaded", "rules", redactURL(c.rules), "version", watcher.Current().Version(), "domains", watcher.Current().Domains())

	dc := decide.DefaultConfig()
	tp, stopTracing, err := c.trace.provider()
	if err != nil {
		return nil, err
	}
	var store sluice.Store = m.Store(st.store)
	if tp != nil {
		co.closers = append(co.closers, stopTracing)
		store = tracing.NewStore(store, tp)
	}
	dc.Rules, dc.Store, dc.Local = watcher.Current, store, st.local
	dc.StoreTimeout, dc.Fail, dc.Logger = c.storeTimeout, fail, log
	dc.Lease = c.slotLease
	if st.slots != nil {
		dc.Slots = st.slots
	}
	svc, err := decide.New(dc)
	if err != nil {
		return nil, fmt.Errorf("decision service: %w", err)
	}
	inner := c.compat.decorate(svc)
	if tp != nil {
		inner = tracing.NewDecider(inner, tp)
	}
	oc.Logger = log
	if co.observer, err = observe.New(inner, oc); err != nil {
		return nil, err
	}
	co.closers = append(co.closers, co.observer.Close)
	co.svc, co.decider = svc, m.Decider(co.observer)
	return co, nil
}

// close stops the rules watcher and closes the store.
func (co *core) close() error {
	var err error
	for _, f := range co.closers {
		err = errors.Join(err, f())
	}
	co.closers = nil
	return err
}

// newIdentity reads the identity file at path, or, when path is empty,
// limits per client address in domain. Its one-time warnings go to log.
func newIdentity(path, domain string, log *slog.Logger) (*identity.Identity, error) {
	cfg := identity.DefaultConfig()
	cfg.Domain = domain
	if path != "" {
		var err error
		if cfg, err = identity.Load(path); err != nil {
			return nil, fmt.Errorf("--identity: %w", err)
		}
	}
	id, err := identity.New(cfg, nil, identity.WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	return id, nil
}

// identityMetrics exposes on reg id's counts of the forwarding headers it
// did not believe, as sluice_forwarded_headers_ignored_total by reason.
func identityMetrics(reg prometheus.Registerer, id *identity.Identity) error {
	for _, c := range []struct {
		reason string
		count  func(identity.ForwardStats) uint64
	}{
		{"untrusted_peer", func(s identity.ForwardStats) uint64 { return s.Untrusted }},
		{"other_header", func(s identity.ForwardStats) uint64 { return s.OtherHeader }},
	} {
		cf := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_forwarded_headers_ignored_total",
			Help: "Requests whose X-Forwarded-For, Forwarded or X-Real-IP was not believed, by reason: " +
				"untrusted_peer (the peer is not in trusted_proxies: a proxy missing there, or a client's own header), " +
				"other_header (a trusted proxy sent another header than forwarded_header).",
			ConstLabels: prometheus.Labels{"reason": c.reason},
		}, func() float64 { return float64(c.count(id.ForwardStats())) })
		if err := reg.Register(cf); err != nil {
			return fmt.Errorf("register identity metrics: %w", err)
		}
	}
	return nil
}

// headersUsage is the help of --response-headers, the one vocabulary of
// every way in (respond.ParseHeaders).
const headersUsage = "rate limit headers sent: all, none, or a list of ratelimit, x-ratelimit, retry-after"

// newResponder returns the writer of the rate limit fields for the
// --response-headers set and --retry-jitter (0: no jitter), for every way
// in of the command.
func newResponder(headers string, jitter time.Duration) (*respond.Writer, error) {
	h, err := respond.ParseHeaders(headers)
	if err != nil {
		return nil, usageError("--response-headers: %v", err)
	}
	if jitter < 0 {
		return nil, usageError("--retry-jitter %v is negative", jitter)
	}
	if jitter == 0 {
		jitter = -1 // respond.Config's "no jitter"; zero is its default
	}
	return respond.New(respond.Config{Headers: h, RetryJitter: jitter}), nil
}

// newForwardAuth returns the GET /v1/auth handler for nginx auth_request and
// Traefik ForwardAuth.
func newForwardAuth(identityPath string, rw *respond.Writer, d respond.Decider, log *slog.Logger, reg prometheus.Registerer) (*forwardauth.Handler, error) {
	id, err := newIdentity(identityPath, "", log)
	if err != nil {
		return nil, err
	}
	if err := identityMetrics(reg, id); err != nil {
		return nil, err
	}
	return forwardauth.New(forwardauth.Config{Identity: id, Decider: d, Respond: rw, Logger: log})
}

// redactURL hides the password of a store URL for logs.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
