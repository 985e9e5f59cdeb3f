package server

// This file is the store's composition: which layers go over memory or
// Redis, in which order. It is meant to be replaced whole by store/stack.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/store/envoykeys"
	"github.com/sluicehq/sluice/store/floodguard"
	"github.com/sluicehq/sluice/store/localfirst"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/route"
)

// openedStore is the store that Config.Store names, the in-process store
// that FailLocal falls back to, and how to close both.
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

// The kinds of store StoreConfig.URL names.
const (
	storeMemory = "memory"
	storeRedis  = "redis"
)

// errNoStore is returned for an empty store URL.
var errNoStore = errors.New("--store is empty (want memory)")

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

// LimitCheck returns the veto on limits of the kind of store spec names
// (StoreConfig.URL), without opening it: what `sluice check --store`
// applies. It is nil for a store that applies every valid limit.
func LimitCheck(spec string) (func(sluice.Limit) error, error) {
	kind, err := storeKind(spec)
	if err != nil || kind != storeRedis {
		return nil, err
	}
	return redis.CheckLimit, nil
}

// storeOptions are what the store is opened with besides StoreConfig.
type storeOptions struct {
	log *slog.Logger // warns while a Redis store is not connected
	tls *tls.Config  // rediss://: nil means the system's roots and the URL's host
}

// openStore opens the store that c.URL names (see storeKind): the
// embedded memory store, or a Redis with an in-process memory store beside
// it for FailLocal.
func openStore(c StoreConfig, o storeOptions) (*openedStore, error) {
	kind, err := storeKind(c.URL)
	if err != nil {
		return nil, err
	}
	if kind == storeMemory {
		return openMemoryStore(c)
	}
	if c.PerSecond == "" && c.PerSecondSentinelAuth != "" {
		return nil, configError("--store-per-second-sentinel-auth: there is no --store-per-second")
	}
	if c.PerSecond != "" {
		if k, err := storeKind(c.PerSecond); err != nil || k != storeRedis {
			return nil, configError("--store-per-second %q: want a Redis URL", RedactURL(c.PerSecond))
		}
	}
	mem, err := newMemory(c)
	if err != nil {
		return nil, err
	}
	main, err := openRedis(c.URL, "--store", c, o, c.SentinelAuth)
	if err != nil {
		return nil, errors.Join(err, mem.Close())
	}
	opened := &openedStore{store: main.store, local: mem, near: nearCaches{main.near},
		slots: main.rs.Slots(), check: main.rs.CheckLimit,
		close: func() error { return errors.Join(main.close(), mem.Close()) }}
	if c.PerSecond == "" {
		return opened, nil
	}
	// Envoy's REDIS_PERSECOND: the limits shorter than a minute keep
	// their states in a Redis of their own, with its own near cache
	// and leases.
	ps, err := openRedis(c.PerSecond, "--store-per-second", c, o, c.PerSecondSentinelAuth)
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

// openMemoryStore opens the memory store, refusing the settings of a
// Redis.
func openMemoryStore(c StoreConfig) (*openedStore, error) {
	switch {
	case c.EnvoyKeys:
		return nil, configError("--envoy-redis-keys: Envoy's counters are in Redis; --store is memory")
	case c.SentinelAuth != "":
		return nil, configError("--store-sentinel-auth: --store is memory, not a redis+sentinel:// URL")
	case c.PerSecond != "":
		return nil, configError("--store-per-second: --store is memory, which keeps every limit")
	case c.PerSecondSentinelAuth != "":
		return nil, configError("--store-per-second-sentinel-auth: --store is memory, with no --store-per-second")
	}
	mem, err := newMemory(c)
	if err != nil {
		return nil, err
	}
	var st sluice.Store = mem
	if c.FloodGuard {
		if st, err = floodguard.New(mem, floodguard.Config{}); err != nil {
			return nil, errors.Join(err, mem.Close())
		}
	}
	// The memory store cannot fail, so it is its own local fallback.
	return &openedStore{store: st, local: mem, close: mem.Close}, nil
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
// with the near cache and leases of c over it, and Envoy's keys if c asks;
// sentinelAuth is its sentinels' password, or user:password. flag names
// the setting spec comes from, for errors.
func openRedis(spec, flag string, c StoreConfig, o storeOptions, sentinelAuth string) (redisStack, error) {
	// A Redis that does not answer yet is no reason not to start: the
	// fail mode decides until it does.
	attempts, logged := 0, ""
	rcfg := redis.DefaultConfig()
	rcfg.TLS = o.tls
	if c.ExpiryJitter < 0 {
		return redisStack{}, configError("--store-expiry-jitter %v: want 0 or more", c.ExpiryJitter)
	}
	rcfg.ExpiryJitter = c.ExpiryJitter
	if sentinelAuth != "" {
		if !strings.HasPrefix(strings.ToLower(spec), "redis+sentinel://") {
			return redisStack{}, configError("%s-sentinel-auth: %s %s names no sentinel (want redis+sentinel://)", flag, flag, RedactURL(spec))
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
			o.log.Warn("store not connected; deciding by --fail until it is", "store", RedactURL(spec), "err", err, "attempts", attempts+1)
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
	near, err := localfirst.New(rs, localfirst.Config{
		NearCacheBytes: c.NearCache,               // negative: off
		Sync:           c.Sync, RequestSync: true, // a rule's own sync: wins
		LeaseLifetime: c.LeaseLifetime, MaxLease: int64(c.MaxLease),
		SyncInterval: c.SyncInterval, AsyncNodes: int64(c.AsyncNodes),
	})
	if err != nil {
		return redisStack{}, errors.Join(err, rs.Close())
	}
	r := redisStack{rs: rs, near: near, store: near}
	if c.EnvoyKeys {
		// Outermost: Envoy's keys are counted as Envoy counts them, never
		// from a near cache or a lease.
		r.store = envoykeys.New(near, rs.Client, envoykeys.Config{Prefix: c.EnvoyKeyPrefix, ExpiryJitter: c.ExpiryJitter})
	}
	return r, nil
}

// newMemory returns a memory store bounded by c.MaxMemory and
// c.MaxEntries.
func newMemory(c StoreConfig) (*memory.Store, error) {
	mem, err := memory.New(memory.Config{MaxBytes: c.MaxMemory, MaxEntries: c.MaxEntries})
	if err != nil {
		return nil, fmt.Errorf("memory store: %w", err)
	}
	return mem, nil
}
