package redis

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/sluicehq/sluice"
)

//go:embed lease.lua
var leaseBody string

// leaseSource is lease.lua after prelude.lua.
var leaseSource = prelude + leaseBody

// leaseScript runs lease.lua: EVALSHA, and EVAL when Redis does not know
// it. It is immutable and shared.
var leaseScript = newLuaScript(leaseSource)

// CanLease reports whether ReturnLeases takes back the unused hits of a
// lease of l: every algorithm but sliding_log and a sliding_window of
// sub-windows (Limit.Precision) (see lease.lua).
func CanLease(l sluice.Limit) bool {
	return l.Algorithm <= sluice.GCRA && l.Algorithm != sluice.SlidingLog && l.SubWindows() == 1
}

// CanLease is the package's CanLease, as a method for decorators that find
// it by type assertion.
func (s *Store) CanLease(l sluice.Limit) bool { return CanLease(l) }

// returnSize is the size of lease.lua's record of one return: the limit as
// take.lua reads it, the state the grant left (t, n) and the hits.
const returnSize = limitSize + 3*8

// returnRecord returns lease.lua's record of the return of r.Cost unused
// hits of a lease of r.Limit whose grant left the state grant, or false
// when nothing can come back (see ReturnLeases).
func returnRecord(r sluice.Request, grant sluice.State) ([]byte, bool, error) {
	if !CanLease(r.Limit) || r.Cost <= 0 || r.Cost > r.Limit.Capacity() {
		return nil, false, nil // no lease is larger than the capacity
	}
	if _, ok := local(r.Limit, r.Cost); ok {
		return nil, false, nil // a limit decided without Redis took no lease
	}
	v, err := encodeLimit(r.Limit)
	if err != nil {
		return nil, false, err
	}
	t, n, _ := grant.Fields()
	if g := float(v[1+8*3:]); g > 0 { // token_bucket, leaky_bucket: the level as stored, over g
		if n%g != 0 {
			return nil, false, nil
		}
		n /= g
	}
	if t < 0 || t > maxExact || n < 0 || n > maxExact {
		return nil, false, fmt.Errorf("a state of %d, %d: %w", t, n, ErrInexact)
	}
	b := make([]byte, 0, returnSize)
	b = append(b, v[:]...)
	for _, x := range [3]int64{t, n, r.Cost} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(x)))
	}
	return b, true, nil
}

// ReturnLeases gives back the unused hits of leases, where that is exact,
// and returns how many it gave back. A lease is a Take of several hits
// that a node admits by itself (store/localfirst's lease mode); rets[i].Cost
// of its hits are unused, and grants[i] is the key's state as the lease's
// grant left it (as TakeState reports it). Windows (fixed_window,
// sliding_window) take the hits back as if never taken while the window
// lasts; buckets (token_bucket, leaky_bucket, gcra) only while nothing was
// admitted on the key since the grant, and no further back than now (see
// lease.lua for why). Nothing comes back for a sliding_log, a lease whose
// state cannot be the key's, or more hits than the capacity. The keys of
// one cluster slot (outside a cluster: all keys) go in one atomic script
// call (lease.lua); the calls go pipelined.
func (s *Store) ReturnLeases(ctx context.Context, rets []sluice.Request, grants []sluice.State) (int64, error) {
	if len(grants) < len(rets) {
		return 0, fmt.Errorf("redis return: %d grants for %d returns", len(grants), len(rets))
	}
	var names []string
	var recs [][]byte
	for i, r := range rets {
		b, ok, err := returnRecord(r, grants[i])
		if err != nil {
			return 0, fmt.Errorf("redis return %s: %w", r.Key, err)
		}
		if ok {
			names, recs = append(names, s.name(r.Key, r.Group)), append(recs, b)
		}
	}
	if len(names) == 0 {
		return 0, nil
	}
	_, execs := s.slotExecs(names, recs)
	now, err := s.now()
	if err != nil {
		return 0, fmt.Errorf("redis return: %w", err)
	}
	for i := range execs {
		execs[i].Args = append(execs[i].Args, now)
	}
	if err := s.connected(); err != nil {
		return 0, fmt.Errorf("redis return: %w", err)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var given int64
	for i, res := range leaseScript.execMulti(ctx, s.client, execs...) {
		n, err := res.AsInt64()
		if err != nil {
			return given, fmt.Errorf("redis return %s: %w", execs[i].Keys[0], full(err))
		}
		given += n
	}
	return given, nil
}
