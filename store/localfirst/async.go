package localfirst

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// Syncer is an optional interface of a store that takes back hits a node
// admitted by itself (async mode). store/redis implements it.
type Syncer interface {
	// Leasable reports whether the store takes back hits of l.
	Leasable(l sluice.Limit) bool
	// SyncCounts adds reqs[i].Cost hits admitted in the window that
	// starts at windows[i] (µs on the store's clock) and returns, per
	// request, what the limit counts against its rate now, and the store's
	// time.
	SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error)
}

// asyncOverhead is what an async entry costs besides its key's bytes,
// rounded up.
const asyncOverhead = 224

// asyncTable holds, per key, what a node admits by itself in async mode.
// Bounded in bytes: a key that finds it full is decided by the store.
type asyncTable struct {
	seed   maphash.Seed
	budget int64 // bytes per shard
	share  int64 // Config.AsyncShare × Config.AsyncNodes
	shards [leaseShards]asyncShard

	mu     sync.Mutex // guards offset
	offset time.Duration
	synced bool // offset has been measured
}

type asyncShard struct {
	mu    sync.Mutex
	m     map[string]*asyncEntry
	bytes int64
	_     [40]byte
}

// asyncEntry is one key in async mode. Windows are on the store's clock.
type asyncEntry struct {
	req     sluice.Request // key, group and limit (Cost unused)
	window  int64          // the window allowance and pending are of
	allow   int64          // hits this node may still admit until its next sync
	pending int64          // hits admitted in window, not yet written back
	oldWin  int64          // the window before, and its hits not yet written
	old     int64
	counted int64 // what the store counted at the last sync
	syncing bool  // a sync is in flight: admit nothing until it lands
	seen    time.Time
}

func newAsyncTable(bytes, share int64) *asyncTable {
	a := &asyncTable{seed: maphash.MakeSeed(), budget: max(bytes/leaseShards, 1), share: share}
	for i := range a.shards {
		a.shards[i].m = make(map[string]*asyncEntry)
	}
	return a
}

// storeNow returns the store's clock at local time now, as the last sync
// measured it, in µs.
func (a *asyncTable) storeNow(now time.Time) int64 {
	a.mu.Lock()
	off := a.offset
	a.mu.Unlock()
	return now.Add(off).UnixMicro()
}

// allowance returns what one node may admit between two syncs when the
// store counts counted hits of l: an even share, among nodes × k, of what
// is left, and at least 1 while anything is.
func (a *asyncTable) allowance(l sluice.Limit, counted int64) int64 {
	left := l.Rate - counted
	if left <= 0 {
		return 0
	}
	return max(left/a.share, 1)
}

// takeAsync decides r, a request of a window limit, in async mode: from
// the node's allowance, with no store call.
func (s *Store) takeAsync(ctx context.Context, r sluice.Request, now time.Time) (sluice.Decision, error) {
	a := s.async
	id := r
	id.Cost = 0
	l, cost := r.Limit, r.Cost
	if l.Rate < a.share { // too small a limit to share out: exact
		return s.exact(ctx, r, now)
	}
	p := l.Period.Microseconds()
	at := a.storeNow(now)
	w := at - at%p
	sh := &a.shards[maphash.String(a.seed, r.Key)%leaseShards]
	sh.mu.Lock()
	e := sh.m[r.Key]
	if e == nil {
		size := int64(len(r.Key)) + asyncOverhead
		if sh.bytes+size > a.budget {
			sh.mu.Unlock()
			return s.exact(ctx, r, now)
		}
		e = &asyncEntry{req: id, window: w, allow: a.allowance(l, 0)}
		sh.m[r.Key] = e
		sh.bytes += size
	}
	if e.req != id { // the rules changed: start over (unwritten hits are dropped)
		*e = asyncEntry{req: id, window: w, allow: a.allowance(l, 0)}
	}
	if w > e.window { // a new window: what was pending is the old window's
		e.oldWin, e.old = e.window, e.pending
		e.window, e.pending, e.counted = w, 0, 0
		if !e.syncing {
			e.allow = a.allowance(l, 0)
		}
	}
	e.seen = now
	capa := l.Capacity()
	d := sluice.Decision{Limit: capa, ResetAfter: time.Duration(e.window+p-at) * time.Microsecond}
	if l.Algorithm == sluice.SlidingWindow {
		d.ResetAfter += l.Period
	}
	switch {
	case cost > capa:
		d.RetryAfter = sluice.Never
	case !e.syncing && cost <= e.allow:
		e.allow -= cost
		e.pending += cost
		d.Allowed = true
	default:
		d.RetryAfter = max(min(s.syncEvery, d.ResetAfter), time.Microsecond)
	}
	d.Remaining = min(max(l.Rate-e.counted-e.pending, 0), capa)
	sh.mu.Unlock()
	s.asyncHits.Add(1)
	return d, nil
}

// SyncAsync writes back every key's hits admitted in async mode since the
// last sync, in one pipelined call, and sets the next allowance of those
// keys and of keys whose allowance ran out from the counts the store
// returns. The Store calls it every
// Config.SyncInterval by itself; tests call it to sync at an instant of
// their clock. While a key's sync is in flight, the node admits nothing
// on it.
func (s *Store) SyncAsync(ctx context.Context) error {
	a := s.async
	if a == nil {
		return nil
	}
	type item struct {
		e      *asyncEntry
		sh     *asyncShard
		key    string
		window int64
		hits   int64
		old    bool
	}
	now := s.now()
	var items []item
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.syncing {
				continue
			}
			if e.pending == 0 && e.old == 0 && now.Sub(e.seen) > 2*s.syncEvery {
				delete(sh.m, k) // idle: forgotten
				sh.bytes -= int64(len(k)) + asyncOverhead
				continue
			}
			if e.pending == 0 && e.old == 0 && e.allow > 0 {
				continue // nothing to write, a share left
			}
			if e.old > 0 {
				items = append(items, item{e, sh, k, e.oldWin, e.old, true})
				e.old = 0
			}
			items = append(items, item{e, sh, k, e.window, e.pending, false})
			e.pending, e.allow, e.syncing = 0, 0, true
		}
		sh.mu.Unlock()
	}
	if len(items) == 0 {
		return nil
	}
	reqs, windows := make([]sluice.Request, len(items)), make([]int64, len(items))
	for i, it := range items {
		reqs[i] = it.e.req
		reqs[i].Cost = it.hits
		windows[i] = it.window
	}
	s.calls.Add(1)
	counts, at, err := s.syncer.SyncCounts(ctx, reqs, windows)
	if err == nil {
		a.mu.Lock()
		a.offset, a.synced = time.Duration(at-now.UnixMicro())*time.Microsecond, true
		a.mu.Unlock()
	}
	for i, it := range items {
		if it.old {
			continue
		}
		it.sh.mu.Lock()
		e := it.e
		e.syncing = false
		switch {
		case err != nil && e.window == it.window:
			// The hits stay to be written at the next sync; the node
			// admits nothing more on the key until one succeeds.
			e.pending += it.hits
		case err != nil:
			e.old += it.hits // the window turned meanwhile
		case e.window == it.window:
			e.counted = counts[i]
			e.allow = a.allowance(e.req.Limit, counts[i])
		default: // the window turned while the sync was in flight: a fresh share
			e.allow = a.allowance(e.req.Limit, 0)
		}
		it.sh.mu.Unlock()
	}
	if err != nil {
		s.returnErrors.Add(1)
		return errors.Join(errors.New("localfirst: async sync failed"), err)
	}
	return nil
}

// syncLoop calls SyncAsync every interval until stop is closed.
func (s *Store) syncLoop(stop <-chan struct{}, done chan<- struct{}) {
	every(stop, done, s.syncEvery, max(s.syncEvery, time.Second), s.SyncAsync) // errors counted in Stats.ReturnErrors
}
