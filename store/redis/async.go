package redis

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
)

//go:embed async.lua
var asyncBody string

// asyncSource is async.lua after prelude.lua.
var asyncSource = prelude + asyncBody

// asyncScript runs async.lua: EVALSHA, and EVAL when Redis does not know
// it. It is immutable and shared.
var asyncScript = newLuaScript(asyncSource)

// Syncable reports whether SyncCounts takes back hits of l: every
// algorithm but sliding_log, whose log of hits has no count to add to, and
// a sliding_window of sub-windows (Limit.Precision), whose counts it does
// not keep.
func Syncable(l sluice.Limit) bool { return l.Algorithm != sluice.SlidingLog && l.SubWindows() == 1 }

// Syncable is the package's Syncable, as a method for decorators that find
// it by type assertion.
func (s *Store) Syncable(l sluice.Limit) bool { return Syncable(l) }

// SyncCounts writes back hits admitted without Redis (store/localfirst's
// async mode) and reads what the node decides from next: reqs[i].Cost
// hits of reqs[i].Limit admitted on reqs[i].Key (Cost 0 only reads). It
// returns one figure per request, and the script's time (µs since the
// Unix epoch):
//   - fixed_window, sliding_window: the hits were admitted in the window
//     that starts at windows[i] (µs on the store's clock); the figure is
//     what the limit counts against its rate now (a sliding_window's
//     previous window weighted in), with rate × period (µs) below 2^52;
//   - token_bucket, leaky_bucket, gcra (windows[i] unused): the hits are
//     debited now whether or not they fit (sluice.Limit.Debit: a debt,
//     never a hit dropped), and the figure is the bucket's level now, debt
//     included, in the units of sluice.Limit.Bucket (sluice.Limit.Level),
//     for limits that CheckLimit accepts; a level saturates at 2^52 µs
//     (gcra) or 2^52 × gcd(rate, period) hit·µs, many capacities deep.
//
// A request of any other limit, or of more hits than a capacity's worth
// of 2^52, is an error. The keys of one cluster slot (outside a cluster:
// all keys) go in one atomic script call (async.lua); the calls go
// pipelined.
func (s *Store) SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error) {
	return s.syncCounts(ctx, reqs, windows, false)
}

// RestoreCounts puts back counts Redis lost (a restart without
// persistence, a failover to a replica that lagged), as a node knew them
// (store/localfirst): reqs[i].Cost is what reqs[i].Limit, a
// fixed_window or sliding_window, counted at least on reqs[i].Key in the
// window that starts at windows[i] (µs on the store's clock), the
// current window or a sliding_window's previous one. A count below it is
// raised to it; one at or above it is left alone, so that servers that
// each put back what they knew never add up (a merge by maximum, in
// async.lua). It returns the script's time, µs since the Unix epoch.
// Bucket limits are an error.
func (s *Store) RestoreCounts(ctx context.Context, reqs []sluice.Request, windows []int64) (int64, error) {
	for _, r := range reqs {
		if r.Limit.Algorithm.HasBurst() {
			return 0, fmt.Errorf("redis restore %s: %v is not a window limit", r.Key, r.Limit)
		}
	}
	_, at, err := s.syncCounts(ctx, reqs, windows, true)
	return at, err
}

// syncCounts is SyncCounts, or RestoreCounts if merge.
func (s *Store) syncCounts(ctx context.Context, reqs []sluice.Request, windows []int64, merge bool) ([]int64, int64, error) {
	if len(windows) < len(reqs) {
		return nil, 0, fmt.Errorf("redis sync: %d windows for %d requests", len(windows), len(reqs))
	}
	if len(reqs) == 0 {
		return nil, 0, nil
	}
	now, err := s.now()
	if err != nil {
		return nil, 0, fmt.Errorf("redis sync: %w", err)
	}
	names, recs, scale, err := s.syncRecords(reqs, windows)
	if err != nil {
		return nil, 0, err
	}
	groups, execs := s.slotExecs(names, recs)
	for g := range execs {
		execs[g].Args = append(execs[g].Args, now, s.marginArg())
		if merge {
			execs[g].Args = append(execs[g].Args, "1")
		}
	}
	if err := s.connected(); err != nil {
		return nil, 0, fmt.Errorf("redis sync: %w", err)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	counts := make([]int64, len(reqs))
	var at int64
	for g, res := range asyncScript.execMulti(ctx, s.client, execs...) {
		vs, err := res.AsIntSlice()
		if err != nil {
			return nil, 0, fmt.Errorf("redis sync: %w", full(err))
		}
		if len(vs) != 1+len(groups[g]) {
			return nil, 0, fmt.Errorf("redis sync: the script returned %d values for %d keys", len(vs), len(groups[g]))
		}
		at = max(at, vs[0])
		for k, i := range groups[g] {
			counts[i] = scaled(vs[1+k], scale[i])
		}
	}
	return counts, at, nil
}

// syncRecords returns the names of reqs' keys, their async.lua records,
// and the unit of each bucket's level in the script, in sluice's units.
func (s *Store) syncRecords(reqs []sluice.Request, windows []int64) (names []string, recs [][]byte, scale []int64, err error) {
	names, recs, scale = make([]string, len(reqs)), make([][]byte, len(reqs)), make([]int64, len(reqs))
	for i, r := range reqs {
		b, err := syncRecord(r, windows[i])
		if err != nil {
			return nil, nil, nil, fmt.Errorf("redis sync %s: %w", r.Key, err)
		}
		names[i], recs[i], scale[i] = s.name(r.Key, r.Group), b, 1
		if a := r.Limit.Algorithm; a == sluice.TokenBucket || a == sluice.LeakyBucket {
			scale[i] = gcd(r.Limit.Rate, r.Limit.Period.Microseconds())
		}
	}
	return names, recs, scale, nil
}

// scaled returns v, a figure of async.lua, times its unit: saturated far
// past any level the decorator computes with.
func scaled(v, unit int64) int64 {
	if v > math.MaxInt64/4/unit {
		return math.MaxInt64 / 4
	}
	return v * unit
}

// syncRecord returns async.lua's record of r, hits admitted in the window
// that starts at window (window limits only).
func syncRecord(r sluice.Request, window int64) ([]byte, error) {
	l := r.Limit
	p := l.Period.Microseconds()
	switch {
	case !Syncable(l) || l.Rate <= 0 || p <= 0:
		return nil, fmt.Errorf("%v cannot be written back", l)
	case r.Cost < 0 || r.Cost > maxExact:
		return nil, fmt.Errorf("%d hits: %w", r.Cost, ErrInexact)
	case l.Algorithm.HasBurst():
		v, err := encodeLimit(l)
		if err != nil {
			return nil, err
		}
		// The script adds cost × b (the hit's weight): at most 2^52.
		hit := float(v[9:]) // b: period/g, or T for gcra
		if l.Algorithm == sluice.GCRA {
			hit = float(v[1:])
		}
		if r.Cost > maxExact/max(hit, 1) {
			return nil, fmt.Errorf("%d hits of %v: %w", r.Cost, l, ErrInexact)
		}
		return binary.LittleEndian.AppendUint64(v[:], math.Float64bits(float64(r.Cost))), nil
	case l.Rate > maxExact/p || window < 0 || window > maxExact:
		return nil, ErrInexact
	}
	b := make([]byte, 1+4*8)
	b[0] = byte(l.Algorithm)
	for j, v := range []int64{l.Rate, p, window, r.Cost} {
		binary.LittleEndian.PutUint64(b[1+8*j:], math.Float64bits(float64(v)))
	}
	return b, nil
}

// slotExecs returns script calls of recs, the records of the keys names:
// one call a cluster slot (outside a cluster: one), whose first argument
// is the records of its keys one after the other, and the indices of
// names each call holds (bySlot).
func (s *Store) slotExecs(names []string, recs [][]byte) ([][]int, []rueidis.LuaExec) {
	groups := s.bySlot(names, indices(len(names)))
	execs := make([]rueidis.LuaExec, len(groups))
	for g, idx := range groups {
		keys, size := make([]string, len(idx)), 0
		for k, i := range idx {
			keys[k], size = names[i], size+len(recs[i])
		}
		blob := make([]byte, 0, size)
		for _, i := range idx {
			blob = append(blob, recs[i]...)
		}
		execs[g] = rueidis.LuaExec{Keys: keys, Args: []string{string(blob)}}
	}
	return groups, execs
}

// bySlot returns idx, indices of names, grouped by the cluster slot of
// their names, in order of first appearance; outside a cluster, one group
// of all.
func (s *Store) bySlot(names []string, idx []int) [][]int {
	if !s.cluster {
		return [][]int{idx}
	}
	var groups [][]int
	at := make(map[uint16]int)
	for _, i := range idx {
		sl := s.slot(names[i])
		g, ok := at[sl]
		if !ok {
			g = len(groups)
			at[sl] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// indices returns the indices 0 to n-1.
func indices(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}
