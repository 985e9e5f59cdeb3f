// Package stack composes sluice's stores, and is the only code that knows
// the order of their layers. New turns a Config into a Stack: one
// sluice.Store to decide with, the in-process store beside it that decide's
// fail: local falls back to, and what the composed store can do, found
// once here and handed on as values (NonBlocking, Ready, the veto on
// limits, concurrency slots, the local-first layers' counters), so that no
// layer passes another's abilities on.
//
// The order, outermost first (a request goes down until a layer decides
// it), under the observe hook (Config.Watchers: told of each call of the
// outermost layer, on either store, never of Local's):
//
//	Redis (Config.URL a Redis URL):
//
//	  persecond ─┬─ a period below a minute ─> envoykeys > local-first > redis             (Config.PerSecond)
//	             └─ the others ──────────────> envoykeys > local-first > [regions] > redis (Config.URL)
//
//	  persecond   store/persecond, only with Config.PerSecond
//	  envoykeys   store/envoykeys, only with Config.EnvoyKeys: a request with an
//	              Envoy descriptor is counted as Envoy's ratelimit counts it, never
//	              from a near cache, a lease or an async share
//	  local-first store/localfirst: the near cache of denials, then lease or async
//	              by Request.Sync (Config.Sync for the default)
//	  regions     store/regions, only with Config.Region (not with PerSecond): a
//	              request of scope global is one limit for all regions, decided on
//	              this region's Redis under a cap its rounds set from every
//	              region's counts (each Config.Peers Redis, read in the background)
//	  redis       store/redis, connecting in the background
//
//	memory (Config.URL "memory"):
//
//	  floodguard > memory    store/floodguard only with Config.FloodGuard
//
//	Local, beside either: a memory store, never guarded: the memory store
//	itself, or one of its own beside Redis.
//
// No other code composes them.
package stack

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/envoykeys"
	"github.com/sluicehq/sluice/store/floodguard"
	"github.com/sluicehq/sluice/store/localfirst"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/persecond"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/regions"
)

// Config says where the counters live and how the store is layered. Start
// from DefaultConfig, or from the zero Config: a zero field means its
// default, as stated at each field and in DefaultConfig.
type Config struct {
	// URL is "memory" (or "memory://"): the counters in this process; or a
	// Redis URL, as redis.Open reads it: redis://, rediss://,
	// redis+cluster://, rediss+cluster://, redis+sentinel://, unix://.
	// Default "memory".
	URL string
	// SentinelAuth is the password, or user:password, of the sentinels of
	// a redis+sentinel:// URL (Envoy's REDIS_SENTINEL_AUTH form). Default
	// "": none.
	SentinelAuth string
	// PerSecond is the URL of a second Redis for the limits whose period
	// is below a minute, as Envoy's REDIS_PERSECOND: store/persecond sends
	// them there, over a near cache, leases and Envoy's keys of its own.
	// Default "": every limit in URL's store.
	PerSecond string
	// PerSecondSentinelAuth is PerSecond's SentinelAuth. Default "": none.
	PerSecondSentinelAuth string
	// TLS configures the rediss:// connections of both Redis. Default
	// nil: the system's roots and the URL's host name.
	TLS *tls.Config
	// ExpiryJitter is the most a Redis key outlives its reset, at random
	// (redis.Config.ExpiryJitter, envoykeys.Config.ExpiryJitter). Default
	// 0: none.
	ExpiryJitter time.Duration

	// MaxMemory bounds the memory, in bytes, of the memory store, and of
	// the Local store beside Redis (memory.Config.MaxBytes). Default
	// memory.DefaultMaxBytes.
	MaxMemory int64
	// MaxEntries bounds the keys of the same stores. Default 0: no bound
	// but MaxMemory.
	MaxEntries int
	// FloodGuard puts store/floodguard over the memory store: a key seen
	// for the first time takes no entry until it is seen again. Not over
	// Redis, nor over Local. Default off.
	FloodGuard bool

	// NearCache bounds the bytes of the near cache of denials over each
	// Redis. Default 8 MiB; negative: none.
	NearCache int64
	// Sync is how a request whose Sync is sluice.DefaultSync reaches
	// Redis. Default sluice.Exact.
	Sync sluice.Sync
	// SyncInterval is how often async mode writes hits back. Default
	// 100ms.
	SyncInterval time.Duration
	// AsyncNodes is the fewest servers async mode shares among: it counts
	// the servers that heartbeat in Redis, at least this many. Default 1.
	AsyncNodes int64
	// LeaseLifetime is how long a lease outlives its key's last request
	// (a window limit's at most a quarter of its period). Default 500ms.
	LeaseLifetime time.Duration
	// MaxLease is the most hits one lease carries. Default 1000.
	MaxLease int64

	// EnvoyKeys counts the limits whose counter Envoy's ratelimit could
	// share under its keys, in Redis, as it counts them (store/envoykeys).
	// Default off.
	EnvoyKeys bool
	// EnvoyKeyPrefix begins those keys: Envoy's CACHE_KEY_PREFIX. Default
	// "".
	EnvoyKeyPrefix string
	// EnvoyStopIncrement counts a request's hits, when one of its Envoy
	// keys would go over its limit, on those keys alone: Envoy's
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT. Default off, as Envoy's.
	EnvoyStopIncrement bool

	// Region names this server's region (store/regions): a limit of scope
	// global is then one limit for all the regions of Peers and this one,
	// each deciding on its own Redis. Not with PerSecond. Default "": no
	// regions, every limit is its region's.
	Region string
	// Peers are the other regions, each by name and the URL of a Redis
	// through which its counts are read: the region's own Redis, across the
	// WAN, or a read replica of it (see docs/regions.md). Every region must
	// list every other. Default none.
	Peers []Peer
	// RegionSyncInterval is how often the regions layer runs a round
	// (regions.Config.SyncInterval). Default 0: regions's, 100ms.
	RegionSyncInterval time.Duration
	// RegionPeerTimeout is the least a round waits for a peer's read, and
	// RegionMaxPeerTimeout the most (regions.Config.PeerTimeout and
	// MaxPeerTimeout: between them, three times the peer's reads).
	// Default 0: regions's, 500ms and 4 × RegionPeerTimeout.
	RegionPeerTimeout, RegionMaxPeerTimeout time.Duration
	// RegionShare is k, the share of what is left a round gives a region,
	// 1/(R × k) (regions.Config.Share). Default 0: regions's, 10.
	RegionShare int64

	// Watchers are told of every call of the outermost layer (metrics
	// times it, tracing records its span), in this order; not of the calls
	// of Local. Default none.
	Watchers []Watcher

	// Logger warns while a Redis does not answer, and says when the
	// local-first layer puts back counts Redis lost. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock of the stores and layers. Default nil: time.Now,
	// and Redis's own TIME for the Redis stores' decisions.
	Now func() time.Time
}

// Peer is another region, as Config.Peers lists it.
type Peer struct {
	Name string
	URL  string
}

// DefaultConfig returns the default configuration: what every zero field
// of a Config means.
func DefaultConfig() Config {
	lf := localfirst.DefaultConfig() // the local-first layers' defaults are theirs
	return Config{
		URL:           "memory",               // one process, exact
		MaxMemory:     memory.DefaultMaxBytes, // 256 MiB: about 288 bytes a client
		NearCache:     lf.NearCacheBytes,      // 8 MiB of denials answered without Redis
		Sync:          sluice.Exact,           // every decision reaches Redis
		SyncInterval:  lf.SyncInterval,        // 100ms: async mode's write-back
		AsyncNodes:    lf.AsyncNodes,          // 1: the servers count themselves (heartbeats in Redis)
		LeaseLifetime: lf.LeaseLifetime,       // 500ms: unused hits go back soon after a client stops
		MaxLease:      lf.MaxLease,            // 1000, and at most a sixteenth of the limit (a quarter of a per-second window)
		Logger:        slog.Default(),
		// SentinelAuth, PerSecond, PerSecondSentinelAuth: none
		// TLS: nil, the system's roots; ExpiryJitter: 0, none
		// MaxEntries: 0, no bound but MaxMemory; FloodGuard: off
		// EnvoyKeys: off; EnvoyKeyPrefix: "", Envoy's default
		// Region: "", no regions; Peers: none; Watchers: none
		// RegionSyncInterval, RegionPeerTimeout, RegionMaxPeerTimeout,
		// RegionShare: 0, store/regions's defaults (100ms, 500ms, 2s, 10)
		// Now: nil, time.Now and Redis's TIME
	}
}

// ConfigError is a Config that New refuses. Field is the name of the field
// at fault, as Config spells it; the message may name others. Error names
// them as Config spells them, after "store "; Text as the caller calls
// them (its flags, say).
type ConfigError struct {
	Field string
	text  string // the message: {Name} names field Name, args fill its verbs
	args  []any
}

// Error returns the message, naming the fields as Config spells them.
func (e *ConfigError) Error() string {
	return "store " + e.Text(func(field string) string { return field })
}

// Text returns the message with name(f) for each field f it names.
func (e *ConfigError) Text(name func(field string) string) string {
	var b strings.Builder
	rest := e.text
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i+1:], '}')
		if j < 0 {
			break
		}
		b.WriteString(rest[:i])
		b.WriteString(strings.ReplaceAll(name(rest[i+1:i+1+j]), "%", "%%"))
		rest = rest[i+2+j:]
	}
	b.WriteString(rest)
	return fmt.Sprintf(b.String(), e.args...)
}

// configError returns a *ConfigError of field: text begins with {field}.
func configError(field, text string, args ...any) error {
	return &ConfigError{Field: field, text: "{" + field + "}" + text, args: args}
}

// withDefaults returns c with every zero field set to its default, and
// refuses what can never work.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	setDefault(&c.URL, d.URL)
	setDefault(&c.MaxMemory, d.MaxMemory)
	setDefault(&c.NearCache, d.NearCache)
	setDefault(&c.Sync, d.Sync)
	setDefault(&c.SyncInterval, d.SyncInterval)
	setDefault(&c.AsyncNodes, d.AsyncNodes)
	setDefault(&c.LeaseLifetime, d.LeaseLifetime)
	setDefault(&c.MaxLease, d.MaxLease)
	if c.Logger == nil {
		c.Logger = d.Logger
	}
	switch {
	case c.ExpiryJitter < 0:
		return c, configError("ExpiryJitter", " %v: want 0 or more", c.ExpiryJitter)
	case c.SyncInterval < 0 || c.AsyncNodes < 0 || c.LeaseLifetime < 0 || c.MaxLease < 0:
		return c, configError("LeaseLifetime", ", {MaxLease}, {SyncInterval} and {AsyncNodes} must be positive")
	}
	return c, c.checkRegions()
}

// checkRegions refuses Region and Peers that can never work.
func (c Config) checkRegions() error {
	if c.Region == "" {
		if len(c.Peers) > 0 {
			return configError("Peers", ": peer regions without a {Region}")
		}
		return nil
	}
	if k, err := kind("URL", c.URL); err != nil || k != kindRedis {
		return configError("Region", ": regions meet in Redis; {URL} is %s", redis.Redact(c.URL))
	}
	if c.PerSecond != "" {
		return configError("Region", ": not with {PerSecond}, whose Redis has no peers")
	}
	seen := map[string]bool{c.Region: true}
	for _, p := range c.Peers {
		if p.Name == "" || seen[p.Name] {
			return configError("Peers", ": region %q: each region once, with a name, this one (%s) not among them", p.Name, c.Region)
		}
		seen[p.Name] = true
		if k, err := kind("Peers", p.URL); err != nil || k != kindRedis {
			return configError("Peers", ": region %s: %q: want a Redis URL", p.Name, redis.Redact(p.URL))
		}
	}
	return nil
}

// setDefault sets *v to def when it is zero.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// The kinds of store a URL names.
const (
	kindMemory = "memory"
	kindRedis  = "redis"
)

// kind returns the kind of store rawURL names: kindMemory for "memory"
// (or "memory://"), kindRedis for a Redis URL.
func kind(field, rawURL string) (string, error) {
	scheme := rawURL
	if i := strings.Index(rawURL, "://"); i >= 0 {
		scheme = rawURL[:i]
		if _, err := url.Parse(rawURL); err != nil {
			return "", configError(field, " %q: %v", rawURL, err)
		}
	}
	switch strings.ToLower(scheme) {
	case "memory":
		return kindMemory, nil
	case "redis", "rediss", "redis+sentinel", "redis+cluster", "rediss+cluster", "unix":
		return kindRedis, nil
	}
	return "", configError(field, " %q: unknown store (want memory or a redis:// URL)", rawURL)
}

// Redact returns a store URL with its password masked, as logs and
// errors show it (redis.Redact).
func Redact(rawURL string) string { return redis.Redact(rawURL) }

// ClientOption returns the rueidis options of the Redis rawURL names, read
// exactly as the store reads its URL, with tc for rediss:// (nil: the
// system's roots): for another client of a Redis, the rules database's.
func ClientOption(rawURL string, tc *tls.Config) (rueidis.ClientOption, error) {
	return redis.ClientOption(rawURL, redis.Config{TLS: tc})
}

// LimitCheck returns the veto on limits of the store rawURL names, without
// opening it (what `sluice check --store` applies): store/redis's for a
// Redis, nil for the memory store, which applies every valid limit.
func LimitCheck(rawURL string) (func(sluice.Limit) error, error) {
	k, err := kind("URL", rawURL)
	if err != nil || k != kindRedis {
		return nil, err
	}
	return redis.CheckLimit, nil
}

// Watcher watches the calls of a Stack's outermost layer (Config.Watchers):
// the observe hook, outside every layer. StartCall is called before a call
// and returns the context the call runs in (ctx, or one with a span);
// EndCall is called after it with that context, the time the call took
// (by the system clock) and its error. Both run on the decision's path:
// they must be quick and safe for concurrent use, and must neither change
// nor keep reqs.
type Watcher interface {
	StartCall(ctx context.Context, reqs []sluice.Request) context.Context
	EndCall(ctx context.Context, reqs []sluice.Request, took time.Duration, err error)
}

// Stats are the counters of a Stack's local-first layers, summed over its
// Redis stores; zero on the memory store.
type Stats = localfirst.Stats

// Stack is a composed store: see the package documentation. It is a
// sluice.Store, safe for concurrent use, whose TakeAll is its outermost
// layer's. Its methods NonBlocking, Ready and CheckLimit say what the
// composed store can do, found when New composed it.
type Stack struct {
	regions     Regions
	watchers    []Watcher
	top         sluice.Store
	local       sluice.Store
	slots       *redis.SlotCounter
	check       func(sluice.Limit) error
	ready       []func() bool
	pings       []func(context.Context) error
	nonBlocking bool
	stats       []func() Stats
	writeBacks  []writeBack                   // the Redis stores that take back hits, by the limits they keep
	wroteOver   []wroteOver                   // the local-first layers told of hits written beneath them
	fleet       *fleetCount                   // the servers counted on the main Redis, or nil
	wroteBack   atomic.Uint64                 // hits WriteBack wrote
	putBack     atomic.Uint64                 // counts RestoreCounts put back
	closers     []func(context.Context) error // closed last first
}

// writeBack is a Redis store that takes back hits admitted without it, and
// the limits it keeps.
type writeBack struct {
	store   syncer
	restore restorer    // store's, or nil
	envoy   envoyWriter // the envoykeys layer over store, or nil
	keeps   func(sluice.Limit) bool
	// over is the local-first layer over store, or nil: see WriteBack.
	over asyncLayer
}

// envoyWriter is a layer that counts some requests under keys of its own,
// as Envoy's ratelimit does (store/envoykeys): their hits are written
// back there, not to the store beneath it.
type envoyWriter interface {
	Counts(r *sluice.Request) bool
	WriteBack(ctx context.Context, reqs []sluice.Request, windows []int64) error
	RestoreCounts(ctx context.Context, reqs []sluice.Request, windows []int64) error
}

// restorer is a store that puts back counts it lost, merged by maximum
// (store/redis's RestoreCounts).
type restorer interface {
	RestoreCounts(ctx context.Context, reqs []sluice.Request, windows []int64) (int64, error)
}

// syncer is a store that takes back hits admitted without it
// (store/redis's SyncCounts).
type syncer interface {
	Syncable(l sluice.Limit) bool
	SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error)
}

var _ sluice.Store = (*Stack)(nil)

// New composes the stores cfg asks for. A Redis that does not answer is no
// error: it connects in the background (Ready reports when), and its calls
// fail until then, which decide's fail mode decides. A Config that can
// never work is a *ConfigError.
func New(cfg Config) (*Stack, error) { return build(cfg, realParts()) }

// TakeAll implements sluice.Store: the outermost layer's TakeAll, watched
// by Config.Watchers.
func (s *Stack) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if len(s.watchers) == 0 {
		return s.top.TakeAll(ctx, reqs, ds)
	}
	for _, w := range s.watchers {
		ctx = w.StartCall(ctx, reqs)
	}
	t := time.Now()
	err := s.top.TakeAll(ctx, reqs, ds)
	took := time.Since(t)
	for _, w := range s.watchers {
		w.EndCall(ctx, reqs, took, err)
	}
	return err
}

// Local returns the in-process store that decide's fail: local decides
// with: the memory store, unguarded.
func (s *Stack) Local() sluice.Store { return s.local }

// SlotCounter returns the concurrency slots of the Redis store (its
// requests in flight, counted across servers), or nil on the memory store,
// whose server counts its own.
func (s *Stack) SlotCounter() *redis.SlotCounter { return s.slots }

// CheckLimit implements sluice.LimitChecker: the veto of the store a limit
// goes to, nil when it applies every valid limit.
func (s *Stack) CheckLimit(l sluice.Limit) error {
	if s.check == nil {
		return nil
	}
	return s.check(l)
}

// NonBlocking reports whether the store never waits on I/O
// (decide.NonBlocking): true for the memory store.
func (s *Stack) NonBlocking() bool { return s.nonBlocking }

// Ready reports whether every Redis of the store has connected
// (decide.Ready); the memory store always is.
func (s *Stack) Ready() bool {
	for _, r := range s.ready {
		if !r() {
			return false
		}
	}
	return true
}

// Ping asks every Redis of the store whether it answers within ctx, as
// a readiness probe does (decide.Config.Ping): nil when all do, and the
// memory store always does; otherwise each failure, joined.
func (s *Stack) Ping(ctx context.Context) error {
	var err error
	for _, p := range s.pings {
		err = errors.Join(err, p(ctx))
	}
	return err
}

// Stats returns the local-first layers' counters, summed, and the most
// servers one of them counts (AsyncServers; 1 without local-first layers).
func (s *Stack) Stats() Stats {
	var sum Stats
	for _, f := range s.stats {
		st := f()
		sum.NearHits += st.NearHits
		sum.NearMisses += st.NearMisses
		sum.NearEntries += st.NearEntries
		sum.NearBytes += st.NearBytes
		sum.LeaseHits += st.LeaseHits
		sum.AsyncDecisions += st.AsyncDecisions
		sum.Grants += st.Grants
		sum.Returned += st.Returned
		sum.ReturnErrors += st.ReturnErrors
		sum.StoreCalls += st.StoreCalls
		sum.Restored += st.Restored
		sum.AsyncServers = max(sum.AsyncServers, st.AsyncServers)
	}
	sum.AsyncServers = max(sum.AsyncServers, 1) // one node: no layer counts more
	return sum
}

// Servers returns how many servers share the store, as the heartbeats in
// Redis count them (every server beats once a second in a set of its own,
// store/redis's Fleet; the last count read while Redis does not answer),
// at least 1: what decide's fail
// mode local divides a limit by (decide.Config.Servers).
func (s *Stack) Servers() int64 {
	if s.fleet != nil {
		return max(s.fleet.n.Load(), 1)
	}
	return s.Stats().AsyncServers
}

// WriteBack writes to Redis hits admitted without it (decide.Config's
// WriteBack): reqs[i].Cost hits of reqs[i].Limit on reqs[i].Key, admitted
// in the window that starts at windows[i] (µs since the Unix epoch; 0 for
// a bucket limit), added whether or not they fit, each to the Redis that
// keeps its limit, where the layer that counts it counts it: beneath the
// local-first layers, or, for a request the envoykeys layer counts (one
// with an Envoy descriptor, with Config.EnvoyKeys), under its Envoy key,
// where Envoy's ratelimit on the same Redis sees them. Hits of a limit
// Redis cannot take back (a sliding_log, a sliding_window of sub-windows)
// are left out, as is everything on the memory store, which never fails.
// It returns the errors of the stores that failed, joined.
func (s *Stack) WriteBack(ctx context.Context, reqs []sluice.Request, windows []int64) error {
	var err error
	for _, wb := range s.writeBacks {
		rs, ws, es, ews := wb.route(reqs, windows, wb.store.Syncable)
		if len(es) > 0 {
			if e := wb.envoy.WriteBack(ctx, es, ews); e != nil {
				err = errors.Join(err, e)
			} else {
				s.wroteBack.Add(hitsOf(es))
			}
		}
		if len(rs) == 0 {
			continue
		}
		if wb.over != nil {
			// The async layer syncs these keys first: if Redis restarted
			// empty, the sync finds it and puts back the counts the layer
			// holds (merged by maximum) before these hits are added, which
			// would otherwise raise the empty count past them and hide the
			// loss (store/localfirst's SyncKeys).
			if e := wb.over.SyncKeys(ctx, rs); e != nil {
				err = errors.Join(err, e)
				continue
			}
		}
		if _, _, e := wb.store.SyncCounts(ctx, rs, ws); e != nil {
			err = errors.Join(err, e)
			continue
		}
		if wb.over != nil {
			wb.over.Wrote(rs, ws)
		}
		s.wroteBack.Add(hitsOf(rs))
	}
	return err
}

// route splits the requests of reqs (and their windows) that wb keeps,
// of a positive Cost, between those the envoykeys layer over wb counts
// (es, ews) and those beneath it whose limit takes says it takes (rs, ws).
// The rest are left out.
func (wb *writeBack) route(reqs []sluice.Request, windows []int64, takes func(sluice.Limit) bool) (rs []sluice.Request, ws []int64, es []sluice.Request, ews []int64) {
	for i, r := range reqs {
		switch {
		case !wb.keeps(r.Limit) || r.Cost <= 0:
		case wb.envoy != nil && wb.envoy.Counts(&r):
			es, ews = append(es, r), append(ews, windows[i])
		case takes(r.Limit):
			rs, ws = append(rs, r), append(ws, windows[i])
		}
	}
	return rs, ws, es, ews
}

// hitsOf returns the hits of reqs: their costs summed.
func hitsOf(reqs []sluice.Request) uint64 {
	var n int64
	for _, r := range reqs {
		n += r.Cost
	}
	return uint64(n)
}

// WrittenBack returns the hits WriteBack wrote to Redis since New.
func (s *Stack) WrittenBack() uint64 { return s.wroteBack.Load() }

// RestoredCounts returns the counts put back in a Redis that lost them
// since New: by RestoreCounts (decide's ledger) and by the async layers
// (Stats' Restored).
func (s *Stack) RestoredCounts() (ledger, async uint64) {
	return s.putBack.Load(), s.Stats().Restored
}

// RestoreCounts puts back counts a Redis store lost (a restart without
// persistence, a failover to a replica that lagged), as this server knew
// them: reqs[i].Cost is what reqs[i].Limit, a fixed_window or
// sliding_window, counted at least on reqs[i].Key in the window that
// starts at windows[i] (µs, aligned to the limit's period as the store
// aligns it), routed to the Redis that keeps the limit, as WriteBack
// routes hits, and under its Envoy key for a request the envoykeys layer
// counts. A count below it is raised to it and one at or above it left
// alone, so servers that each put back what they knew never add up. Other
// limits, and stores that cannot, are skipped. For decide's ledger
// (decide.Config's Restore).
func (s *Stack) RestoreCounts(ctx context.Context, reqs []sluice.Request, windows []int64) error {
	var err error
	for _, wb := range s.writeBacks {
		rs, ws, es, ews := wb.route(reqs, windows, func(l sluice.Limit) bool {
			return wb.restore != nil && wb.store.Syncable(l) && (l.Algorithm == sluice.FixedWindow || l.Algorithm == sluice.SlidingWindow)
		})
		if len(es) > 0 {
			if e := wb.envoy.RestoreCounts(ctx, es, ews); e != nil {
				err = errors.Join(err, e)
			} else {
				s.putBack.Add(uint64(len(es)))
			}
		}
		if len(rs) == 0 {
			continue
		}
		if _, e := wb.restore.RestoreCounts(ctx, rs, ws); e != nil {
			err = errors.Join(err, e)
			continue
		}
		s.putBack.Add(uint64(len(rs)))
	}
	return err
}

// Regions is what the regions layer says of itself (store/regions's
// Store): its last round's findings and a global key's counts by region.
type Regions interface {
	Status() regions.Status
	Usage(key string) (regions.Use, bool)
}

// PeerUnreachable is the state of a peer region that the regions layer
// could not read in its last round, as Regions' Status reports it
// (regions.Unreachable).
const PeerUnreachable = regions.Unreachable

// Regions returns the regions layer, or nil without Config.Region.
func (s *Stack) Regions() Regions { return s.regions }

// HasLocalFirst reports whether the store has local-first layers (a Redis
// store), whose counters Stats returns.
func (s *Stack) HasLocalFirst() bool { return len(s.stats) > 0 }

// Close closes the layers and the stores, outermost first, returning
// leases and writing async hits back within ctx's time. It is safe to
// call once.
func (s *Stack) Close(ctx context.Context) error {
	var err error
	for i := len(s.closers) - 1; i >= 0; i-- {
		err = errors.Join(err, s.closers[i](ctx))
	}
	s.closers = nil
	return err
}

// closeStore adapts a store's Close to Stack.closers.
func closeStore(c interface{ Close() error }) func(context.Context) error {
	return func(context.Context) error { return c.Close() }
}

// build composes cfg's stores from p's parts.
func build(cfg Config, p parts) (_ *Stack, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	k, err := kind("URL", cfg.URL)
	if err != nil {
		return nil, err
	}
	s := &Stack{watchers: cfg.Watchers}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Close(context.Background()))
		}
	}()
	if k == kindMemory {
		return s, s.memory(cfg, p)
	}
	return s, s.redis(cfg, p)
}

// memory composes the memory store: floodguard > memory; Local is the
// memory store itself, which cannot fail.
func (s *Stack) memory(cfg Config, p parts) error {
	for _, f := range []struct {
		name string
		set  bool
		why  string
	}{
		{"EnvoyKeys", cfg.EnvoyKeys, ": Envoy's counters are in Redis; {URL} is memory"},
		{"SentinelAuth", cfg.SentinelAuth != "", ": {URL} is memory, not a redis+sentinel:// URL"},
		{"PerSecond", cfg.PerSecond != "", ": {URL} is memory, which keeps every limit"},
		{"PerSecondSentinelAuth", cfg.PerSecondSentinelAuth != "", ": {URL} is memory, with no {PerSecond}"},
	} {
		if f.set {
			return configError(f.name, f.why)
		}
	}
	mem, err := p.memory(memory.Config{MaxBytes: cfg.MaxMemory, MaxEntries: cfg.MaxEntries, Now: cfg.Now})
	if err != nil {
		return err
	}
	s.closers = append(s.closers, closeStore(mem))
	s.top, s.local = mem, mem
	if nb, ok := mem.(interface{ NonBlocking() bool }); ok {
		s.nonBlocking = nb.NonBlocking()
	}
	if cfg.FloodGuard {
		if s.top, err = p.floodguard(mem, floodguard.Config{Now: cfg.Now}); err != nil {
			return err
		}
	}
	return nil
}

// redis composes the Redis store, and the per-second one under persecond
// when cfg has one; Local is a memory store of its own.
func (s *Stack) redis(cfg Config, p parts) error {
	if cfg.PerSecond == "" && cfg.PerSecondSentinelAuth != "" {
		return configError("PerSecondSentinelAuth", ": there is no {PerSecond}")
	}
	if cfg.PerSecond != "" {
		if k, err := kind("PerSecond", cfg.PerSecond); err != nil || k != kindRedis {
			return configError("PerSecond", " %q: want a Redis URL", redis.Redact(cfg.PerSecond))
		}
	}
	mem, err := p.memory(memory.Config{MaxBytes: cfg.MaxMemory, MaxEntries: cfg.MaxEntries, Now: cfg.Now})
	if err != nil {
		return err
	}
	s.closers = append(s.closers, closeStore(mem))
	s.local = mem
	main, b, err := s.redisLayers(cfg, p, redisSpec{"URL", cfg.URL, "SentinelAuth", cfg.SentinelAuth})
	if err != nil {
		return err
	}
	s.top, s.slots, s.check = main, b.SlotCounter(), vetoOf(b)
	if cfg.Region != "" {
		s.check = vetoes(s.check, func(l sluice.Limit) error { return regions.CheckLimit(l, vetoOf(b)) })
	}
	if cfg.PerSecond == "" {
		s.addWriteBack(b, main, func(sluice.Limit) bool { return true })
		return nil
	}
	short, sb, err := s.redisLayers(cfg, p, redisSpec{"PerSecond", cfg.PerSecond, "PerSecondSentinelAuth", cfg.PerSecondSentinelAuth})
	if err != nil {
		return err
	}
	rt, err := p.perSecond(short, main)
	if err != nil {
		return err
	}
	s.top = rt
	s.addWriteBack(b, main, func(l sluice.Limit) bool { return !rt.Short(l) })
	s.addWriteBack(sb, short, rt.Short)
	shortCheck, longCheck := vetoOf(sb), s.check
	s.check = func(l sluice.Limit) error {
		c := longCheck
		if rt.Short(l) {
			c = shortCheck
		}
		if c == nil {
			return nil
		}
		return c(l)
	}
	return nil
}

// RegionRound returns the regions layer's round and share with d and k,
// Config's RegionSyncInterval and RegionShare: each, or regions's default
// when 0.
func RegionRound(d time.Duration, k int64) (time.Duration, int64) {
	def := regions.DefaultConfig()
	if d <= 0 {
		d = def.SyncInterval
	}
	if k <= 0 {
		k = def.Share
	}
	return d, k
}

// vetoes returns the veto of every layer a limit goes through: the first
// refusal of those not nil, in order.
func vetoes(vs ...func(sluice.Limit) error) func(sluice.Limit) error {
	return func(l sluice.Limit) error {
		for _, v := range vs {
			if v == nil {
				continue
			}
			if err := v(l); err != nil {
				return err
			}
		}
		return nil
	}
}

// fleeter is a store that counts the servers using it (store/redis's
// Fleet).
type fleeter interface {
	Fleet(ctx context.Context, id string, ttl time.Duration) (int64, error)
}

// fleetEvery is how often a server beats in the fleet's set; it stays
// counted fleetTTL after its last beat (a paused server a while longer).
const (
	fleetEvery = time.Second
	fleetTTL   = 10 * time.Second
)

// fleetCount beats in a Redis's fleet set every fleetEvery, from a
// goroutine that close stops, and holds the last count of servers read.
type fleetCount struct {
	n    atomic.Int64
	stop context.CancelFunc
	done chan struct{}
}

// startFleet starts beating in f's fleet set under an ID of its own.
func startFleet(f fleeter) *fleetCount {
	ctx, cancel := context.WithCancel(context.Background())
	fc := &fleetCount{stop: cancel, done: make(chan struct{})}
	id := rand.Text()
	go func() {
		defer close(fc.done)
		t := time.NewTicker(fleetEvery)
		defer t.Stop()
		for {
			bctx, bcancel := context.WithTimeout(ctx, fleetEvery)
			if n, err := f.Fleet(bctx, id, fleetTTL); err == nil {
				fc.n.Store(n)
			}
			bcancel()
			select {
			case <-ctx.Done():
				// Leave the set, so that the others count one fewer now.
				lctx, lcancel := context.WithTimeout(context.Background(), fleetEvery)
				_, _ = f.Fleet(lctx, id, 0)
				lcancel()
				return
			case <-t.C:
			}
		}
	}()
	return fc
}

// close stops the beats and leaves the set.
func (fc *fleetCount) close(context.Context) error {
	fc.stop()
	<-fc.done
	return nil
}

// addWriteBack adds b to the stores WriteBack writes to, for the limits
// keeps says it keeps, if b takes back hits; top is the outermost layer
// over b (redisLayers'), the envoykeys layer when there is one. The
// local-first layer over b, if any, syncs the keys first and is told what
// was written beneath it (wroteOver).
func (s *Stack) addWriteBack(b, top sluice.Store, keeps func(sluice.Limit) bool) {
	if sy, ok := b.(syncer); ok {
		re, _ := b.(restorer)
		ew, _ := top.(envoyWriter)
		wb := writeBack{store: sy, restore: re, envoy: ew, keeps: keeps}
		for _, w := range s.wroteOver {
			if w.b == b {
				wb.over = w.lf
			}
		}
		s.writeBacks = append(s.writeBacks, wb)
	}
}

// asyncLayer is what WriteBack needs of the local-first layer over a Redis
// store (store/localfirst's Store): a sync of its async keys among
// those written, and to hear of the hits written beneath it.
type asyncLayer interface {
	SyncKeys(ctx context.Context, reqs []sluice.Request) error
	Wrote(reqs []sluice.Request, windows []int64)
}

// wroteOver is a Redis store and the local-first layer over it.
type wroteOver struct {
	b  sluice.Store
	lf asyncLayer
}

// vetoOf returns b's veto on limits (sluice.LimitChecker), or nil.
func vetoOf(b sluice.Store) func(sluice.Limit) error {
	if c, ok := b.(sluice.LimitChecker); ok {
		return c.CheckLimit
	}
	return nil
}

// redisSpec names a Redis of a Config: the fields of its URL and its
// sentinels' auth, and their values.
type redisSpec struct {
	field, url, authField, auth string
}

// redisLayers opens the Redis r names and the layers over it: envoykeys >
// local-first > redis. It returns the outermost layer and the Redis store.
func (s *Stack) redisLayers(cfg Config, p parts, r redisSpec) (sluice.Store, backend, error) {
	rcfg := redis.DefaultConfig()
	rcfg.TLS, rcfg.ExpiryJitter, rcfg.Now = cfg.TLS, cfg.ExpiryJitter, cfg.Now
	if r.auth != "" {
		if !strings.HasPrefix(strings.ToLower(r.url), "redis+sentinel://") {
			return nil, nil, configError(r.authField, ": {"+r.field+"} %s names no sentinel (want redis+sentinel://)", redis.Redact(r.url))
		}
		user, pass, ok := strings.Cut(r.auth, ":") // Envoy's REDIS_SENTINEL_AUTH form
		if !ok {
			user, pass = "", r.auth
		}
		rcfg.SentinelUsername, rcfg.SentinelPassword = user, pass
	}
	rcfg.ConnectFailed = connectFailed(cfg.Logger, r.url)
	b, err := p.redis(r.url, rcfg)
	if err != nil {
		// The URL or the Config: New makes no connection before this.
		return nil, nil, configError(r.field, ": %v", err)
	}
	s.closers = append(s.closers, closeStore(b))
	s.ready, s.pings = append(s.ready, b.Ready), append(s.pings, b.Ping)
	if f, ok := b.(fleeter); ok && s.fleet == nil {
		s.fleet = startFleet(f)
		s.closers = append(s.closers, s.fleet.close)
	}
	lc := localfirst.Config{
		NearCacheBytes: cfg.NearCache, Sync: cfg.Sync, RequestSync: true,
		LeaseLifetime: cfg.LeaseLifetime, MaxLease: cfg.MaxLease,
		SyncInterval: cfg.SyncInterval, AsyncNodes: cfg.AsyncNodes, Now: cfg.Now,
		Backend: b, Logger: cfg.Logger,
	}
	var next sluice.Store = b
	if cfg.Region != "" {
		if next, err = s.regionsOver(cfg, p, b, rcfg); err != nil {
			return nil, nil, err
		}
		// the regions layer decides its requests; local-first reaches
		// Redis's abilities for the others directly, not through it
		lc.Direct = regions.Decides
	}
	lf, err := p.localFirst(next, lc)
	if err != nil {
		return nil, nil, err
	}
	if a, ok := lf.(asyncLayer); ok {
		s.wroteOver = append(s.wroteOver, wroteOver{b, a})
	}
	s.closers = append(s.closers, lf.Close)
	s.stats = append(s.stats, lf.Stats)
	if !cfg.EnvoyKeys {
		return lf, b, nil
	}
	return p.envoyKeys(lf, b, envoykeys.Config{Prefix: cfg.EnvoyKeyPrefix, ExpiryJitter: cfg.ExpiryJitter, Now: cfg.Now,
		StopIncrementWhenOverLimit: cfg.EnvoyStopIncrement}), b, nil
}

// regionsOver opens the peers' Redis with rcfg, the home's configuration,
// and puts the regions layer over home: it reads every region's counts and
// board under the same key prefix.
func (s *Stack) regionsOver(cfg Config, p parts, home backend, rcfg redis.Config) (sluice.Store, error) {
	var peers []peerBackend
	for _, pr := range cfg.Peers {
		pc := rcfg
		pc.ConnectFailed = connectFailed(cfg.Logger, pr.URL)
		pc.MaxReply = regions.MaxPeerReply // a peer's replies are input: bounded before they are read
		b, err := p.redis(pr.URL, pc)
		if err != nil {
			return nil, configError("Peers", ": region %s: %v", pr.Name, err)
		}
		s.closers = append(s.closers, closeStore(b))
		peers = append(peers, peerBackend{pr.Name, b})
	}
	rc := regions.Config{Region: cfg.Region, Now: cfg.Now, SyncInterval: cfg.RegionSyncInterval,
		PeerTimeout: cfg.RegionPeerTimeout, MaxPeerTimeout: cfg.RegionMaxPeerTimeout, Share: cfg.RegionShare}
	reg, err := p.regions(home, peers, rc, rcfg.KeyPrefix)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, closeStore(reg))
	s.regions = reg
	return reg, nil
}

// connectFailed returns a redis.Config.ConnectFailed that warns of the
// first failure to connect to rawURL, then once a minute, and whenever
// the cause changes: a first attempt that timed out on a busy machine
// must not hide for a minute the certificate the next ones refuse. Its
// Store calls it from one goroutine.
func connectFailed(log *slog.Logger, rawURL string) func(error) {
	attempts, logged := 0, ""
	return func(err error) {
		if attempts%60 == 0 || err.Error() != logged {
			log.Warn("store not connected; deciding by --fail until it is", "store", redis.Redact(rawURL), "err", err, "attempts", attempts+1)
			logged = err.Error()
		}
		attempts++
	}
}

// closer is a store that New closes.
type closer interface {
	sluice.Store
	Close() error
}

// backend is a Redis store: what the layers over it use of it.
type backend interface {
	closer
	Ready() bool
	Ping(context.Context) error
	Client() rueidis.Client
	Conn() (rueidis.Client, error)
	SlotCounter() *redis.SlotCounter
}

// layer is the local-first layers over a Redis store.
type layer interface {
	sluice.Store
	Stats() Stats
	Close(context.Context) error
}

// regionLayer is the regions layer over a Redis store.
type regionLayer interface {
	sluice.Store
	Regions
	Close() error
}

// peerBackend is another region's Redis, by the region's name.
type peerBackend struct {
	name string
	b    backend
}

// router sends a request to one of two stores by its limit's period.
type router interface {
	sluice.Store
	Short(sluice.Limit) bool
}

// parts are the stores and layers New composes: realParts, or a test's
// recording fakes. Each is given what it decorates.
type parts struct {
	memory     func(memory.Config) (closer, error)
	redis      func(rawURL string, cfg redis.Config) (backend, error)
	floodguard func(next sluice.Store, cfg floodguard.Config) (sluice.Store, error)
	regions    func(home backend, peers []peerBackend, cfg regions.Config, prefix string) (regionLayer, error)
	localFirst func(next sluice.Store, cfg localfirst.Config) (layer, error)
	envoyKeys  func(next sluice.Store, b backend, cfg envoykeys.Config) sluice.Store
	perSecond  func(short, long sluice.Store) (router, error)
}

// realParts returns sluice's stores and layers.
func realParts() parts {
	return parts{
		memory: func(cfg memory.Config) (closer, error) {
			m, err := memory.New(cfg)
			if err != nil {
				return nil, fmt.Errorf("memory store: %w", err)
			}
			return m, nil
		},
		redis: func(rawURL string, cfg redis.Config) (backend, error) { return redis.New(rawURL, cfg) },
		floodguard: func(next sluice.Store, cfg floodguard.Config) (sluice.Store, error) {
			return floodguard.New(next, cfg)
		},
		regions:    openRegions,
		localFirst: func(next sluice.Store, cfg localfirst.Config) (layer, error) { return localfirst.New(next, cfg) },
		envoyKeys: func(next sluice.Store, b backend, cfg envoykeys.Config) sluice.Store {
			return envoykeys.New(next, b.Client, cfg)
		},
		perSecond: func(short, long sluice.Store) (router, error) {
			return persecond.New(short, long, persecond.Config{})
		},
	}
}

// openRegions puts store/regions over home, reading each Redis's counts
// and board through a RedisSite under prefix.
func openRegions(home backend, peers []peerBackend, cfg regions.Config, prefix string) (regionLayer, error) {
	site := func(name string, b backend) (regions.Site, error) {
		c, ok := b.(regions.Counter)
		if !ok {
			return nil, fmt.Errorf("regions: the store of region %s cannot read counts", name)
		}
		refused := func(err error) bool { return errors.Is(err, redis.ErrReplyTooLarge) }
		return regions.NewRedisSite(c, b.Conn, refused, name, prefix, 0), nil // Conn: an error until connected
	}
	var err error
	if cfg.Home, err = site(cfg.Region, home); err != nil {
		return nil, err
	}
	for _, p := range peers {
		ps, err := site(p.name, p.b)
		if err != nil {
			return nil, err
		}
		cfg.Peers = append(cfg.Peers, regions.Peer{Name: p.name, Site: ps})
	}
	return regions.New(home, cfg)
}
