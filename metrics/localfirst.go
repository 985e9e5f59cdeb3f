package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// NearCache registers on reg the counters of a near cache
// (store/localfirst): sluice_near_cache_hits_total, the requests it
// answered without the store, and sluice_near_cache_misses_total, those
// it sent on. hits and misses are read at each scrape.
func NearCache(reg prometheus.Registerer, hits, misses func() uint64) error {
	return registerAll(reg, "near cache metrics",
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_near_cache_hits_total",
			Help: "Requests the near cache answered from a denial the store gave, without a store call.",
		}, func() float64 { return float64(hits()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_near_cache_misses_total",
			Help: "Requests the near cache had no denial for and sent to the store.",
		}, func() float64 { return float64(misses()) }),
	)
}

// Leases registers on reg the counters of lease mode (store/localfirst):
// sluice_lease_decisions_total, the requests admitted from a lease
// without a store call, sluice_lease_grants_total, the leases taken, and
// sluice_local_first_store_calls_total, every call the decorator made to
// its store (decisions, grants, returns). They are read at each scrape.
func Leases(reg prometheus.Registerer, hits, grants, calls func() uint64) error {
	return registerAll(reg, "lease metrics",
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_lease_decisions_total",
			Help: "Requests admitted from a lease of a key's quota, without a store call.",
		}, func() float64 { return float64(hits()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_lease_grants_total",
			Help: "Leases of a key's quota taken from the store.",
		}, func() float64 { return float64(grants()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_local_first_store_calls_total",
			Help: "Calls the near cache and lease decorator made to the store: decisions, lease grants and returns.",
		}, func() float64 { return float64(calls()) }),
	)
}

// Async registers on reg the counter of async mode (store/localfirst):
// sluice_async_decisions_total, the requests decided from a node's
// allowance without a store call, read at each scrape.
func Async(reg prometheus.Registerer, decisions func() uint64) error {
	c := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sluice_async_decisions_total",
		Help: "Requests decided in async mode from a node's allowance, without a store call.",
	}, func() float64 { return float64(decisions()) })
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("register async metrics: %w", err)
	}
	return nil
}

// AsyncServers registers on reg the gauge sluice_async_servers: N, the
// servers async mode shares its limits among (store/localfirst's
// Stats.AsyncServers: those that heartbeat in the store, at least
// --async-nodes; 1 on one node), read at each scrape.
func AsyncServers(reg prometheus.Registerer, servers func() int64) error {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_async_servers",
		Help: "Servers async mode shares its limits among: those that heartbeat in the store, at least --async-nodes.",
	}, func() float64 { return float64(servers()) })
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register async servers metric: %w", err)
	}
	return nil
}

// Servers registers on reg the gauge sluice_servers: how many servers
// share the store as their heartbeats in it count them (store/stack's
// Servers, the last count read while the store does not answer; at least
// 1), which the fail mode local divides each limit by, read at each
// scrape.
func Servers(reg prometheus.Registerer, servers func() int64) error {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_servers",
		Help: "Servers sharing the store, counted by their heartbeats in it: the fail mode local decides each limit on its share, 1/N.",
	}, func() float64 { return float64(servers()) })
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register servers metric: %w", err)
	}
	return nil
}

// WriteBack registers on reg the counters of what a server puts back in
// the store after deciding without it (store/stack): the hits the fail
// mode local admitted without the store and wrote back to it once it
// answered, sluice_written_back_hits_total, and the counts put back in a
// Redis that lost them (restarted empty, a failover to a replica that
// lagged) or may have (it answers again after failing), merged by maximum,
// sluice_restored_counts_total, by source: "fail_local" (the
// fail mode local's ledger) and "async" (the local-first layer's: what
// its async keys, leases and near cache held, once an async sync or a
// lease key's answer found the loss). They
// are read at each scrape.
func WriteBack(reg prometheus.Registerer, hits func() uint64, restored func() (ledger, async uint64)) error {
	fromLedger, fromAsync := counterPair("sluice_restored_counts_total",
		"Counts of keys put back in a store that lost them (restarted empty) or may have, merged by maximum, by what knew them.",
		"source", "fail_local", "async", restored)
	return registerAll(reg, "write-back metrics",
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_written_back_hits_total",
			Help: "Hits admitted without the store (fail mode local) and written back to it once it answered.",
		}, func() float64 { return float64(hits()) }),
		fromLedger, fromAsync,
	)
}

// HeldDenials registers on reg sluice_held_denials_total, read at each
// scrape from held: the local denials of the fail mode local that waited
// for the store while it answered (a key kept local by the server's own
// calls in flight or by its settling, or after a pause a call that timed
// out; docs/stores.md), by outcome: "store", the store decided them then;
// "local", the local denial stood.
func HeldDenials(reg prometheus.Registerer, held func() (store, local uint64)) error {
	store, local := counterPair("sluice_held_denials_total",
		"Local denials (fail mode local) that waited for the store while it answered, by outcome: store (it decided them), local (the denial stood).",
		"outcome", "store", "local", held)
	return registerAll(reg, "held denials metric", store, local)
}

// counterPair returns the two series of the counter name, read at each
// scrape from values: label a's, the first value, and label b's, the
// second.
func counterPair(name, help, label, a, b string, values func() (uint64, uint64)) (prometheus.Collector, prometheus.Collector) {
	first := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{label: a}},
		func() float64 { v, _ := values(); return float64(v) })
	second := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{label: b}},
		func() float64 { _, v := values(); return float64(v) })
	return first, second
}

// registerAll registers cs on reg, and names what (the metrics of a part)
// in the error of the first that fails.
func registerAll(reg prometheus.Registerer, what string, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register %s: %w", what, err)
		}
	}
	return nil
}
