package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/store/stack"
)

// errNoStore is returned for an empty store URL.
var errNoStore = errors.New("--store is empty (want memory)")

// LimitCheck returns the veto on limits of the kind of store rawURL names
// (Config.Store.URL), without opening it: what `sluice check --store`
// applies. It is nil for a store that applies every valid limit.
func LimitCheck(rawURL string) (func(sluice.Limit) error, error) {
	if rawURL == "" {
		return nil, errNoStore
	}
	check, err := stack.LimitCheck(rawURL)
	return check, storeError(err)
}

// SyncInterval returns how often async mode syncs with d, Config.Store's
// SyncInterval (--sync-interval): d, or its default when 0.
func SyncInterval(d time.Duration) time.Duration {
	if d <= 0 {
		return stack.DefaultConfig().SyncInterval
	}
	return d
}

// RegionRound returns the regions layer's round and share with d and k,
// Config.Store's RegionSyncInterval and RegionShare (--region-sync-interval,
// --region-share): each, or its default when 0.
func RegionRound(d time.Duration, k int64) (time.Duration, int64) {
	return stack.RegionRound(d, k)
}

// storeFlags are the flags of stack.Config's fields, by which a refusal
// names them.
var storeFlags = map[string]string{
	"URL": "--store", "SentinelAuth": "--store-sentinel-auth", "PerSecond": "--store-per-second",
	"PerSecondSentinelAuth": "--store-per-second-sentinel-auth", "ExpiryJitter": "--store-expiry-jitter",
	"EnvoyKeys": "--envoy-redis-keys", "Region": "--region", "Peers": "--peer-region",
	"LeaseLifetime": "--lease-lifetime", "MaxLease": "--max-lease", "SyncInterval": "--sync-interval", "AsyncNodes": "--async-nodes",
}

// storeError returns err, a *stack.ConfigError as a *ConfigError naming
// each field by its flag (Config.Store's field where it has none).
func storeError(err error) error {
	var se *stack.ConfigError
	if !errors.As(err, &se) {
		return err
	}
	return configError("%s", se.Text(func(field string) string {
		if flag, ok := storeFlags[field]; ok {
			return flag
		}
		return "Store." + field
	}))
}

// openStore opens the store c.Store names, composed by store/stack, with
// the TLS of c.StoreTLS and its logs to log, each call of it told to
// watchers, and counts its local-first layers' work on reg.
func openStore(c Config, log *slog.Logger, reg prometheus.Registerer, watchers ...stack.Watcher) (*stack.Stack, error) {
	sc := c.Store
	// The metric series named by request values take their part of
	// --max-memory (openMetrics gives it them).
	mm := maxMemory(c)
	sc.MaxMemory = mm - metrics.DetailedShare(mm)
	tc, err := c.StoreTLS.config(sc.URL)
	if err != nil {
		return nil, err
	}
	sc.TLS, sc.Logger, sc.Watchers = tc, log, watchers
	st, err := stack.New(sc)
	if err != nil {
		return nil, storeError(err)
	}
	if err := errors.Join(stackMetrics(st, reg), regionsMetrics(st, reg)); err != nil {
		return nil, errors.Join(err, closeStore(st))
	}
	return st, nil
}

// maxMemory is c's --max-memory, its default when unset.
func maxMemory(c Config) int64 {
	if c.Store.MaxMemory > 0 {
		return c.Store.MaxMemory
	}
	return stack.DefaultConfig().MaxMemory
}

// stackMetrics registers on reg the counters of st's near caches, leases,
// async decisions, hits written back and counts put back, if it has
// local-first layers (a Redis store), the servers async mode counts (1
// without) and those the fail mode local divides limits by.
func stackMetrics(st *stack.Stack, reg prometheus.Registerer) error {
	if err := metrics.AsyncServers(reg, func() int64 { return st.Stats().AsyncServers }); err != nil {
		return err
	}
	if err := metrics.Servers(reg, st.Servers); err != nil {
		return err
	}
	if !st.HasLocalFirst() {
		return nil
	}
	hits := func() uint64 { return st.Stats().NearHits }
	misses := func() uint64 { return st.Stats().NearMisses }
	if err := metrics.NearCache(reg, hits, misses); err != nil {
		return err
	}
	leased := func() uint64 { return st.Stats().LeaseHits }
	grants := func() uint64 { return st.Stats().Grants }
	calls := func() uint64 { return st.Stats().StoreCalls }
	if err := metrics.Leases(reg, leased, grants, calls); err != nil {
		return err
	}
	if err := metrics.WriteBack(reg, st.WrittenBack, st.RestoredCounts); err != nil {
		return err
	}
	return metrics.Async(reg, func() uint64 { return st.Stats().AsyncDecisions })
}

// closeStore closes st, giving its leases back and writing its async hits
// for at most a second.
func closeStore(st *stack.Stack) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := st.Close(ctx); err != nil {
		return fmt.Errorf("close the store: %w", err)
	}
	return nil
}
