package localfirst

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// memStore plays Redis for tests that run without one (-short): a Stater,
// Leaser, Syncer and Heartbeater that keeps each key's sluice.State in
// memory and moves it with the sluice package's arithmetic, as the memory
// store does (Limit.TakeMicros) and as store/redis's scripts do in Lua
// (Limit.ReturnLease for lease.lua, Limit.Debit and Limit.Level for
// async.lua's buckets), by one injected clock. Nodes share one memStore
// as servers share one Redis; it is safe for concurrent use.
type memStore struct {
	now func() time.Time

	mu      sync.Mutex
	states  map[string]memState
	servers map[string]int64 // a heartbeat's end, µs
}

// memState is a key's state and the algorithm it is of.
type memState struct {
	alg sluice.Algorithm
	st  sluice.State
}

var (
	_ Leaser      = (*memStore)(nil)
	_ Syncer      = (*memStore)(nil)
	_ Heartbeater = (*memStore)(nil)
)

func newMemStore(now func() time.Time) *memStore {
	return &memStore{now: now, states: make(map[string]memState), servers: make(map[string]int64)}
}

// state returns key's state for l: a fresh one when the key holds another
// algorithm's, as take.lua starts over. mu is held.
func (m *memStore) state(key string, l sluice.Limit) sluice.State {
	s, ok := m.states[key]
	if !ok || s.alg != l.Algorithm {
		return sluice.State{}
	}
	return s.st.Clone()
}

func (m *memStore) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore take: %w", err)
	}
	if len(ds) < len(reqs) {
		return fmt.Errorf("memstore take: %d decisions for %d requests", len(ds), len(reqs))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.take(reqs, ds, m.now().UnixMicro())
	return nil
}

// take decides reqs at at, all or none. mu is held.
func (m *memStore) take(reqs []sluice.Request, ds []sluice.Decision, at int64) {
	next := make(map[string]memState, len(reqs)) // the batch's states, committed if all pass
	all := true
	for i, r := range reqs {
		s, ok := next[r.Key]
		if !ok || s.alg != r.Limit.Algorithm {
			s = memState{r.Limit.Algorithm, m.state(r.Key, r.Limit)}
		}
		ds[i] = r.Limit.TakeMicros(&s.st, at, r.Cost)
		next[r.Key] = s
		all = all && ds[i].Allowed
	}
	if all {
		for k, s := range next {
			m.states[k] = s
		}
	}
}

// TakeState decides r as a batch of one and returns the state it left;
// like store/redis, no state for a sliding_log.
func (m *memStore) TakeState(ctx context.Context, r sluice.Request) (sluice.Decision, sluice.State, int64, bool, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, sluice.State{}, 0, false, fmt.Errorf("memstore take: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var ds [1]sluice.Decision
	at := m.now().UnixMicro()
	m.take([]sluice.Request{r}, ds[:], at)
	if r.Limit.Algorithm == sluice.SlidingLog {
		return ds[0], sluice.State{}, 0, false, nil
	}
	return ds[0], m.state(r.Key, r.Limit), at, true, nil
}

func (m *memStore) CanLease(l sluice.Limit) bool { return l.Algorithm != sluice.SlidingLog }

func (m *memStore) ReturnLeases(ctx context.Context, rets []sluice.Request, grants []sluice.State) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("memstore return: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	at := m.now().UnixMicro()
	var back int64
	for i, r := range rets {
		st := m.state(r.Key, r.Limit)
		back += r.Limit.ReturnLease(&st, grants[i], r.Cost, at)
		m.states[r.Key] = memState{r.Limit.Algorithm, st}
	}
	return back, nil
}

func (m *memStore) Syncable(l sluice.Limit) bool { return l.Algorithm != sluice.SlidingLog }

// SyncCounts adds each request's hits as async.lua does: a window's to the
// window they were admitted in while it still counts (the state first
// moved to now's window by a Take of 0), returning what the limit counts
// now (its rate less what a Take of 0 leaves); a bucket's debited now,
// returning its level.
func (m *memStore) SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, fmt.Errorf("memstore sync: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	at := m.now().UnixMicro()
	counts := make([]int64, len(reqs))
	for i, r := range reqs {
		l := r.Limit
		st := m.state(r.Key, l)
		if _, ok := l.Bucket(); ok {
			l.Debit(&st, at, r.Cost)
			counts[i] = l.Level(st, at)
		} else {
			l.TakeMicros(&st, at, 0)
			t, n, p := st.Fields()
			switch {
			case windows[i] == t:
				n += r.Cost
			case l.Algorithm == sluice.SlidingWindow && windows[i] == t-l.Period.Microseconds():
				p += r.Cost
			}
			st = sluice.StateOf(t, n, p)
			probe := st
			counts[i] = l.Rate - l.TakeMicros(&probe, at, 0).Remaining
		}
		m.states[r.Key] = memState{l.Algorithm, st}
	}
	return counts, at, nil
}

func (m *memStore) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("memstore heartbeat: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	at := m.now().UnixMicro()
	for k, end := range m.servers {
		if end <= at {
			delete(m.servers, k)
		}
	}
	if ttl > 0 {
		m.servers[id] = at + ttl.Microseconds()
	} else {
		delete(m.servers, id)
	}
	return int64(len(m.servers)), nil
}

var _ Restorer = (*memStore)(nil)

// RestoreCounts raises each window key's count in its window to at least
// the request's Cost, as async.lua's merge does: in the current window,
// or a sliding_window's previous one; a window past is ignored.
func (m *memStore) RestoreCounts(ctx context.Context, reqs []sluice.Request, windows []int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("memstore restore: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	at := m.now().UnixMicro()
	for i, r := range reqs {
		l := r.Limit
		if l.Algorithm.HasBurst() {
			return 0, fmt.Errorf("memstore restore: %v is not a window limit", l)
		}
		st := m.state(r.Key, l)
		l.TakeMicros(&st, at, 0)
		t, n, p := st.Fields()
		switch {
		case windows[i] == t:
			n = max(n, r.Cost)
		case l.Algorithm == sluice.SlidingWindow && windows[i] == t-l.Period.Microseconds():
			p = max(p, r.Cost)
		}
		m.states[r.Key] = memState{l.Algorithm, sluice.StateOf(t, n, p)}
	}
	return at, nil
}

// forget drops every key, as Redis restarted without persistence does.
func (m *memStore) forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.states)
}
