package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/store/envoykeys"
	"github.com/sluicehq/sluice/store/floodguard"
	"github.com/sluicehq/sluice/store/localfirst"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/route"
)

// storeOptions are the flags that shape a store.
type storeOptions struct {
	maxEntries int               // memory store: most keys held; 0: no limit but maxMemory
	maxMemory  int64             // memory store: most bytes; 0: memory.Config's default
	local      localfirst.Config // Redis: the near cache and leases; NearCacheBytes 0 turns the cache off
	log        *slog.Logger      // warns while a Redis store is not connected
	tls        *tls.Config       // rediss://: nil means the system's roots and the URL's host
	envoyKeys  bool              // Redis: count Envoy's keys as Envoy does (store/envoykeys)
	// envoyKeyPrefix begins Envoy's keys (Envoy's CACHE_KEY_PREFIX).
	envoyKeyPrefix string
	floodGuard     bool // memory store: a new key takes no entry until seen again (store/floodguard)
	// sentinelAuth is the password, or user:password, of the sentinels
	// of a redis+sentinel:// store; "" for none.
	sentinelAuth string
	// perSecondSentinelAuth is that of perSecond's sentinels.
	perSecondSentinelAuth string
	// perSecond is the URL of a Redis for the limits whose period is
	// below a minute (Envoy's REDIS_PERSECOND; store/route), or "" to keep
	// them with the others.
	perSecond string
	// expiryJitter is the most a Redis key outlives its reset, at random
	// (redis.Config.ExpiryJitter, envoykeys.Config.ExpiryJitter); 0: none.
	expiryJitter time.Duration
}

// openedStore is the store that --store names, the in-process store that
// --fail local falls back to, and how to close both.
type openedStore struct {
	store sluice.Store
	local sluice.Store
	near  nearCaches // the near caches in store: none, or one a Redis
	// slots count the requests in flight of concurrency limits: nil for
	// the memory store (decide's own slots.Memory), Redis's otherwise.
	slots decide.Slots
	// check is the store's veto on limits (sluice.LimitChecker), or nil
	// when it applies every valid limit.
	check func(sluice.Limit) error
	close func() error
}

// The kinds of store --store names.
const (
	storeMemory = "memory"
	storeRedis  = "redis"
)

// storeKind returns the kind of store spec names: storeMemory for
// "memory" (or "memory://"), storeRedis for a Redis URL (redis://,
// rediss://, redis+cluster://, rediss+cluster://, redis+sentinel://, or
// unix:// for a Redis on a unix socket).
func storeKind(spec string) (string, error) {
	scheme := spec
	if i := strings.Index(spec, "://"); i >= 0 {
		scheme = spec[:i]
		if _, err := url.Parse(spec); err != nil {
			return "", fmt.Errorf("--store %q: %w", spec, err)
		}
	}
	switch strings.ToLower(scheme) {
	case "":
		return "", errNoStore
	case "memory":
		return storeMemory, nil
	case "redis", "rediss", "redis+sentinel", "redis+cluster", "rediss+cluster", "unix":
		return storeRedis, nil
	}
	return "", fmt.Errorf("--store %q: unknown store (want memory or a redis:// URL)", spec)
}

// limitCheck returns the veto on limits of the kind of store spec names,
// without opening it: what `sluice check --store` applies.
func limitCheck(spec string) (func(sluice.Limit) error, error) {
	kind, err := storeKind(spec)
	if err != nil || kind != storeRedis {
		return nil, err
	}
	return redis.CheckLimit, nil
}

// openStore opens the store that spec names (see storeKind): the
// embedded memory store, or a Redis with an in-process memory store beside
// it for --fail local.
func openStore(spec string, o storeOptions) (*openedStore, error) {
	kind, err := storeKind(spec)
	if err != nil {
		return nil, err
	}
	switch kind {
	case storeMemory:
		if o.envoyKeys {
			return nil, usageError("--envoy-redis-keys: Envoy's counters are in Redis; --store is memory")
		}
		if o.sentinelAuth != "" {
			return nil, usageError("--store-sentinel-auth: --store is memory, not a redis+sentinel:// URL")
		}
		if o.perSecond != "" {
			return nil, usageError("--store-per-second: --store is memory, which keeps every limit")
		}
		if o.perSecondSentinelAuth != "" {
			return nil, usageError("--store-per-second-sentinel-auth: --store is memory, with no --store-per-second")
		}
		mem, err := newMemory(o)
		if err != nil {
			return nil, err
		}
		var st sluice.Store = mem
		if o.floodGuard {
			if st, err = floodguard.New(mem, floodguard.Config{}); err != nil {
				return nil, errors.Join(err, mem.Close())
			}
		}
		// The memory store cannot fail, so it is its own local fallback.
		return &openedStore{store: st, local: mem, close: mem.Close}, nil
	default: // storeRedis
		if o.perSecond == "" && o.perSecondSentinelAuth != "" {
			return nil, usageError("--store-per-second-sentinel-auth: there is no --store-per-second")
		}
		if o.perSecond != "" {
			if k, err := storeKind(o.perSecond); err != nil || k != storeRedis {
				return nil, usageError("--store-per-second %q: want a Redis URL", redactURL(o.perSecond))
			}
		}
		mem, err := newMemory(o)
		if err != nil {
			return nil, err
		}
		main, err := openRedis(spec, "--store", o, o.sentinelAuth)
		if err != nil {
			return nil, errors.Join(err, mem.Close())
		}
		opened := &openedStore{store: main.store, local: mem, near: nearCaches{main.near},
			slots: main.rs.Slots(), check: main.rs.CheckLimit,
			close: func() error { return errors.Join(main.close(), mem.Close()) }}
		if o.perSecond == "" {
			return opened, nil
		}
		// Envoy's REDIS_PERSECOND: the limits shorter than a minute keep
		// their states in a Redis of their own, with its own near cache
		// and leases.
		ps, err := openRedis(o.perSecond, "--store-per-second", o, o.perSecondSentinelAuth)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("--store-per-second: %w", err), opened.close())
		}
		closeMain := opened.close
		closeAll := func() error { return errors.Join(ps.close(), closeMain()) }
		rt, err := route.New(ps.store, main.store, route.Config{})
		if err != nil {
			return nil, errors.Join(err, closeAll())
		}
		opened.store, opened.close = rt, closeAll
		opened.near = append(opened.near, ps.near)
		return opened, nil
	}
}

// nearCaches are the near caches of a store, one a Redis.
type nearCaches []*localfirst.Store

// Stats returns the sums of their counts.
func (n nearCaches) Stats() localfirst.Stats {
	var sum localfirst.Stats
	for _, c := range n {
		st := c.Stats()
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
	}
	return sum
}

// redisStack is one Redis and the decorators over it.
type redisStack struct {
	rs    *redis.Store
	near  *localfirst.Store // the near cache and leases over rs
	store sluice.Store      // near, or Envoy's keys over it
}

// close stops the decorators and the Redis client.
func (r redisStack) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return errors.Join(r.near.Close(ctx), r.rs.Close())
}

// openRedis opens the Redis spec names, connecting in the background,
// with the near cache and leases of o over it, and Envoy's keys if o asks;
// sentinelAuth is its sentinels' password, or user:password. flag names
// the flag spec comes from, for errors.
func openRedis(spec, flag string, o storeOptions, sentinelAuth string) (redisStack, error) {
	// A Redis that does not answer yet is no reason not to start: the
	// fail mode decides until it does.
	attempts, logged := 0, ""
	rcfg := redis.DefaultConfig()
	rcfg.TLS = o.tls
	if o.expiryJitter < 0 {
		return redisStack{}, usageError("--store-expiry-jitter %v: want 0 or more", o.expiryJitter)
	}
	rcfg.ExpiryJitter = o.expiryJitter
	if sentinelAuth != "" {
		if !strings.HasPrefix(strings.ToLower(spec), "redis+sentinel://") {
			return redisStack{}, usageError("%s-sentinel-auth: %s %s names no sentinel (want redis+sentinel://)", flag, flag, redactURL(spec))
		}
		user, pass, ok := strings.Cut(sentinelAuth, ":") // Envoy's REDIS_SENTINEL_AUTH form
		if !ok {
			user, pass = "", sentinelAuth
		}
		rcfg.SentinelUsername, rcfg.SentinelPassword = user, pass
	}
	rcfg.ConnectFailed = func(err error) {
		// The first failure, then once a minute, and whenever the cause
		// changes: a first attempt that timed out on a busy machine must
		// not hide for a minute the certificate the next ones refuse.
		if o.log != nil && (attempts%60 == 0 || err.Error() != logged) {
			o.log.Warn("store not connected; deciding by --fail until it is", "store", redactURL(spec), "err", err, "attempts", attempts+1)
			logged = err.Error()
		}
		attempts++
	}
	rs, err := redis.New(spec, rcfg)
	if err != nil {
		return redisStack{}, fmt.Errorf("--store: %w", err)
	}
	// Redis is out of process: a denied client is answered here until
	// its retry time (store/localfirst's near cache, exact), and limits in
	// lease mode are decided from leases.
	lc := o.local
	if lc.NearCacheBytes == 0 {
		lc.NearCacheBytes = -1 // off
	}
	near, err := localfirst.New(rs, lc)
	if err != nil {
		return redisStack{}, errors.Join(err, rs.Close())
	}
	r := redisStack{rs: rs, near: near, store: near}
	if o.envoyKeys {
		// Outermost: Envoy's keys are counted as Envoy counts them, never
		// from a near cache or a lease.
		r.store = envoykeys.New(near, rs.Client, envoykeys.Config{Prefix: o.envoyKeyPrefix, ExpiryJitter: o.expiryJitter})
	}
	return r, nil
}

// newMemory returns a memory store bounded by o.maxMemory and o.maxEntries.
func newMemory(o storeOptions) (*memory.Store, error) {
	mem, err := memory.New(memory.Config{MaxBytes: o.maxMemory, MaxEntries: o.maxEntries})
	if err != nil {
		return nil, fmt.Errorf("memory store: %w", err)
	}
	return mem, nil
}

// defaultMaxMemory is --max-memory's default: memory.Config's, 256 MiB.
const defaultMaxMemory = byteSize(memory.DefaultMaxBytes)

// maxMemoryCap is the largest --max-memory accepted: 1 PiB.
const maxMemoryCap = 1 << 50

// byteSize is a flag value of bytes written as a size: 268435456, 256MiB,
// 1.5GiB or 300MB (humanize.ParseBytes: KiB, MiB, GiB are powers of 1024;
// kB, MB, GB powers of 1000).
type byteSize int64

func (b *byteSize) String() string { return humanize.IBytes(uint64(*b)) }

func (b *byteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	switch {
	case err != nil:
		return fmt.Errorf("want a size such as 256MiB or 1GiB: %w", err)
	case n == 0 || n > maxMemoryCap:
		return fmt.Errorf("%s: want more than 0 and at most 1PiB", s)
	}
	*b = byteSize(n)
	return nil
}

// errNoStore is returned for an empty --store.
var errNoStore = errors.New("--store is empty (want memory)")
