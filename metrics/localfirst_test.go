package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/metrics"
)

func TestNearCache(t *testing.T) {
	reg := prometheus.NewRegistry()
	hits, misses := uint64(7), uint64(3)
	if err := metrics.NearCache(reg, func() uint64 { return hits }, func() uint64 { return misses }); err != nil {
		t.Fatal(err)
	}
	hits = 9
	want := `
# HELP sluice_near_cache_hits_total Requests the near cache answered from a denial the store gave, without a store call.
# TYPE sluice_near_cache_hits_total counter
sluice_near_cache_hits_total 9
# HELP sluice_near_cache_misses_total Requests the near cache had no denial for and sent to the store.
# TYPE sluice_near_cache_misses_total counter
sluice_near_cache_misses_total 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if err := metrics.NearCache(reg, func() uint64 { return 0 }, func() uint64 { return 0 }); err == nil {
		t.Fatal("registering twice: no error")
	}
}

func TestLeases(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := metrics.Leases(reg, func() uint64 { return 40 }, func() uint64 { return 2 }, func() uint64 { return 5 }); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP sluice_lease_decisions_total Requests admitted from a lease of a key's quota, without a store call.
# TYPE sluice_lease_decisions_total counter
sluice_lease_decisions_total 40
# HELP sluice_lease_grants_total Leases of a key's quota taken from the store.
# TYPE sluice_lease_grants_total counter
sluice_lease_grants_total 2
# HELP sluice_local_first_store_calls_total Calls the near cache and lease decorator made to the store: decisions, lease grants and returns.
# TYPE sluice_local_first_store_calls_total counter
sluice_local_first_store_calls_total 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestAsync(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := metrics.Async(reg, func() uint64 { return 12 }); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP sluice_async_decisions_total Requests decided in async mode from a node's allowance, without a store call.
# TYPE sluice_async_decisions_total counter
sluice_async_decisions_total 12
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestAsyncServers(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := metrics.AsyncServers(reg, func() int64 { return 4 }); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP sluice_async_servers Servers async mode shares its limits among: those that heartbeat in the store, at least --async-nodes.
# TYPE sluice_async_servers gauge
sluice_async_servers 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestServers(t *testing.T) {
	reg := prometheus.NewRegistry()
	n := int64(2)
	if err := metrics.Servers(reg, func() int64 { return n }); err != nil {
		t.Fatal(err)
	}
	n = 3 // read at the scrape
	want := `
# HELP sluice_servers Servers sharing the store, counted by their heartbeats in it: the fail mode local decides each limit on its share, 1/N.
# TYPE sluice_servers gauge
sluice_servers 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestWriteBack(t *testing.T) {
	reg := prometheus.NewRegistry()
	hits, ledger, async := uint64(5), uint64(1), uint64(0)
	if err := metrics.WriteBack(reg, func() uint64 { return hits }, func() (uint64, uint64) { return ledger, async }); err != nil {
		t.Fatal(err)
	}
	hits, ledger, async = 12, 2, 3 // read at the scrape
	want := `
# HELP sluice_restored_counts_total Counts of keys put back in a store that lost them (restarted empty) or may have, merged by maximum, by what knew them.
# TYPE sluice_restored_counts_total counter
sluice_restored_counts_total{source="async"} 3
sluice_restored_counts_total{source="fail_local"} 2
# HELP sluice_written_back_hits_total Hits admitted without the store (fail mode local) and written back to it once it answered.
# TYPE sluice_written_back_hits_total counter
sluice_written_back_hits_total 12
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if err := metrics.WriteBack(reg, func() uint64 { return 0 }, func() (uint64, uint64) { return 0, 0 }); err == nil {
		t.Fatal("registering twice: no error")
	}
}

func TestHeldDenials(t *testing.T) {
	reg := prometheus.NewRegistry()
	store, local := uint64(0), uint64(0)
	if err := metrics.HeldDenials(reg, func() (uint64, uint64) { return store, local }); err != nil {
		t.Fatal(err)
	}
	store, local = 7, 2 // read at the scrape
	want := `
# HELP sluice_held_denials_total Local denials (fail mode local) that waited for the store while it answered, by outcome: store (it decided them), local (the denial stood).
# TYPE sluice_held_denials_total counter
sluice_held_denials_total{outcome="local"} 2
sluice_held_denials_total{outcome="store"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if err := metrics.HeldDenials(reg, func() (uint64, uint64) { return 0, 0 }); err == nil {
		t.Fatal("registering twice: no error")
	}
}
