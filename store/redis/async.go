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
var asyncSource string

// asyncScript runs async.lua: EVALSHA, and EVAL when Redis does not know
// it. It is immutable and shared.
var asyncScript = rueidis.NewLuaScript(asyncSource)

// SyncCounts writes back hits admitted without Redis (store/localfirst's
// async mode) and reads the counts to decide from next: reqs[i].Cost hits
// of reqs[i].Limit admitted on reqs[i].Key in the window that starts at
// windows[i] (µs on the store's clock; Cost 0 only reads). It returns,
// per request, what the limit counts against its rate now (a
// sliding_window's previous window weighted in), and the script's time
// (µs since the Unix epoch). Only the algorithms that Leasable accepts,
// with rate × period (µs) below 2^52; a request of any other is an error.
// The keys of one cluster slot (outside a cluster: all keys) go in one
// atomic script call (async.lua); the calls go pipelined.
func (s *Store) SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error) {
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
	names := make([]string, len(reqs))
	recs := make([][]byte, len(reqs))
	for i, r := range reqs {
		p := r.Limit.Period.Microseconds()
		switch {
		case !Leasable(r.Limit) || r.Limit.Rate <= 0 || p <= 0:
			return nil, 0, fmt.Errorf("redis sync %s: %v is not a window limit", r.Key, r.Limit)
		case r.Limit.Rate > maxExact/p || r.Cost < 0 || r.Cost > maxExact || windows[i] < 0 || windows[i] > maxExact:
			return nil, 0, fmt.Errorf("redis sync %s: %w", r.Key, ErrInexact)
		}
		b := make([]byte, 1+4*8)
		b[0] = byte(r.Limit.Algorithm)
		for j, v := range []int64{r.Limit.Rate, p, windows[i], r.Cost} {
			binary.LittleEndian.PutUint64(b[1+8*j:], math.Float64bits(float64(v)))
		}
		names[i], recs[i] = s.name(r.Key, r.Group), b
	}
	groups := s.bySlot(names, indices(len(names)))
	execs := make([]rueidis.LuaExec, len(groups))
	for g, idx := range groups {
		keys, blob := make([]string, len(idx)), make([]byte, 0, len(idx)*(1+4*8))
		for k, i := range idx {
			keys[k], blob = names[i], append(blob, recs[i]...)
		}
		execs[g] = rueidis.LuaExec{Keys: keys, Args: []string{string(blob), now, s.margin}}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
	}
	counts := make([]int64, len(reqs))
	var at int64
	for g, res := range asyncScript.ExecMulti(ctx, s.client, execs...) {
		vs, err := res.AsIntSlice()
		if err != nil {
			return nil, 0, fmt.Errorf("redis sync: %w", err)
		}
		if len(vs) != 1+len(groups[g]) {
			return nil, 0, fmt.Errorf("redis sync: the script returned %d values for %d keys", len(vs), len(groups[g]))
		}
		at = max(at, vs[0])
		for k, i := range groups[g] {
			counts[i] = vs[1+k]
		}
	}
	return counts, at, nil
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

// SyncCounts is Store.SyncCounts on the connected store, or fails as Take
// does while there is none.
func (b *Background) SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error) {
	if s := b.store.Load(); s != nil {
		return s.SyncCounts(ctx, reqs, windows)
	}
	return nil, 0, fmt.Errorf("redis sync: %w", b.notYet())
}
