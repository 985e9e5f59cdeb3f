package regions

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice"
)

// The abilities of a Redis store that the layers over this one use
// (store/near, store/lease, store/async): a Store passes them on to the
// store it wraps for requests of scope region. A request of scope global
// is decided here, exactly in its region: never from a near cache's
// state, never leased, never written back.

type stater interface {
	TakeState(ctx context.Context, r sluice.Request) (sluice.Decision, sluice.State, int64, bool, error)
}

type leaser interface {
	CanLease(l sluice.Limit) bool
	ReturnLeases(ctx context.Context, rets []sluice.Request, grants []sluice.State) (int64, error)
}

type syncer interface {
	Syncable(l sluice.Limit) bool
	SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error)
}

type heartbeater interface {
	Heartbeat(ctx context.Context, id string, ttl time.Duration) (int64, error)
}

// errGlobal is returned for a request of scope global given to an ability
// that only requests of scope region use.
var errGlobal = errors.New("regions: a request of scope global is decided exactly, not leased nor written back")

// isGlobal reports whether the layer decides r (not the store it wraps).
func isGlobal(r sluice.Request) bool { return r.Scope == sluice.GlobalScope && global(r.Limit) }

// TakeState is the wrapped store's for a request of scope region. A
// request of scope global is decided as TakeAll decides it, with no state
// to hand back (ok false): its cap moves every round, so no decision of
// it stands for a later one.
func (s *Store) TakeState(ctx context.Context, r sluice.Request) (sluice.Decision, sluice.State, int64, bool, error) {
	st, ok := s.inner.(stater)
	if ok && !isGlobal(r) {
		return st.TakeState(ctx, r)
	}
	var d [1]sluice.Decision
	err := s.TakeAll(ctx, []sluice.Request{r}, d[:])
	return d[0], sluice.State{}, 0, false, err
}

// CanLease is the wrapped store's, false when it leases nothing.
func (s *Store) CanLease(l sluice.Limit) bool {
	le, ok := s.inner.(leaser)
	return ok && le.CanLease(l)
}

// ReturnLeases is the wrapped store's, for requests of scope region.
func (s *Store) ReturnLeases(ctx context.Context, rets []sluice.Request, grants []sluice.State) (int64, error) {
	le, ok := s.inner.(leaser)
	if !ok {
		return 0, errors.New("regions: the store takes no leases back")
	}
	for _, r := range rets {
		if isGlobal(r) {
			return 0, errGlobal
		}
	}
	return le.ReturnLeases(ctx, rets, grants)
}

// Syncable is the wrapped store's, false when it takes nothing back.
func (s *Store) Syncable(l sluice.Limit) bool {
	sy, ok := s.inner.(syncer)
	return ok && sy.Syncable(l)
}

// SyncCounts is the wrapped store's, for requests of scope region.
func (s *Store) SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error) {
	sy, ok := s.inner.(syncer)
	if !ok {
		return nil, 0, errors.New("regions: the store takes no hits back")
	}
	for _, r := range reqs {
		if isGlobal(r) {
			return nil, 0, errGlobal
		}
	}
	return sy.SyncCounts(ctx, reqs, windows)
}

// Heartbeat is the wrapped store's count of the servers that share it
// (store/localfirst's async mode, of this region).
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int64, error) {
	h, ok := s.inner.(heartbeater)
	if !ok {
		return 0, errors.New("regions: the store counts no servers")
	}
	return h.Heartbeat(ctx, id, ttl)
}
