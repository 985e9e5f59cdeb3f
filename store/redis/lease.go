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

//go:embed lease.lua
var leaseSource string

// leaseScript runs lease.lua: EVALSHA, and EVAL when Redis does not know
// it. It is immutable and shared.
var leaseScript = rueidis.NewLuaScript(leaseSource)

// Leasable reports whether ReturnLeases gives back the unused hits of a
// lease of l: fixed_window and sliding_window, whose counts add up.
func Leasable(l sluice.Limit) bool {
	return l.Algorithm == sluice.FixedWindow || l.Algorithm == sluice.SlidingWindow
}

// Leasable is the package's Leasable, as a method for decorators that find
// it by type assertion.
func (s *Store) Leasable(l sluice.Limit) bool { return Leasable(l) }

// ReturnLeases gives back the unused hits of leases, as if they had never
// been taken, and returns how many it gave back. A lease is a Take of
// several hits that a node admits by itself (store/localfirst's lease
// mode); rets[i].Cost of its hits are unused, and windows[i] is the start
// of the window it was taken in, in µs since the Unix epoch on the
// store's clock (as TakeState reports it). A return whose window has
// passed gives nothing back (those hits no longer count), nor does one of
// an algorithm that Leasable refuses. The keys of one cluster slot
// (outside a cluster: all keys) go in one atomic script call (lease.lua);
// the calls go pipelined.
func (s *Store) ReturnLeases(ctx context.Context, rets []sluice.Request, windows []int64) (int64, error) {
	if len(windows) < len(rets) {
		return 0, fmt.Errorf("redis return: %d windows for %d returns", len(windows), len(rets))
	}
	var names []string
	var recs [][]byte
	for i, r := range rets {
		window := windows[i]
		if !Leasable(r.Limit) || r.Cost <= 0 {
			continue
		}
		if err := CheckLimit(r.Limit); err != nil {
			return 0, fmt.Errorf("redis return %s: %w", r.Key, err)
		}
		if r.Cost > maxExact || window < 0 || window > maxExact {
			return 0, fmt.Errorf("redis return %s: %d hits in window %d: %w", r.Key, r.Cost, window, ErrInexact)
		}
		b := make([]byte, 1+3*8)
		b[0] = byte(r.Limit.Algorithm)
		binary.LittleEndian.PutUint64(b[1:], math.Float64bits(float64(window)))
		binary.LittleEndian.PutUint64(b[9:], math.Float64bits(float64(r.Limit.Period.Microseconds())))
		binary.LittleEndian.PutUint64(b[17:], math.Float64bits(float64(r.Cost)))
		names, recs = append(names, s.name(r.Key, r.Group)), append(recs, b)
	}
	if len(names) == 0 {
		return 0, nil
	}
	var execs []rueidis.LuaExec
	for _, idx := range s.bySlot(names, indices(len(names))) {
		keys, blob := make([]string, len(idx)), make([]byte, 0, len(idx)*(1+3*8))
		for k, i := range idx {
			keys[k], blob = names[i], append(blob, recs[i]...)
		}
		execs = append(execs, rueidis.LuaExec{Keys: keys, Args: []string{string(blob)}})
	}
	if len(execs) == 0 {
		return 0, nil
	}
	now, err := s.now()
	if err != nil {
		return 0, fmt.Errorf("redis return: %w", err)
	}
	for i := range execs {
		execs[i].Args = append(execs[i].Args, now)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
	}
	var given int64
	for i, res := range leaseScript.ExecMulti(ctx, s.client, execs...) {
		n, err := res.AsInt64()
		if err != nil {
			return given, fmt.Errorf("redis return %s: %w", execs[i].Keys[0], err)
		}
		given += n
	}
	return given, nil
}

// Leasable is Store.Leasable: see there.
func (b *Background) Leasable(l sluice.Limit) bool { return Leasable(l) }

// ReturnLeases is Store.ReturnLeases on the connected store, or fails as
// Take does while there is none.
func (b *Background) ReturnLeases(ctx context.Context, rets []sluice.Request, windows []int64) (int64, error) {
	if s := b.store.Load(); s != nil {
		return s.ReturnLeases(ctx, rets, windows)
	}
	return 0, fmt.Errorf("redis return: %w", b.notYet())
}
