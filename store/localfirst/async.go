package localfirst

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Syncer is an optional interface of a store that takes back hits a node
// admitted by itself (async mode). store/redis implements it.
type Syncer interface {
	// Syncable reports whether the store takes back hits of l.
	Syncable(l sluice.Limit) bool
	// SyncCounts writes back reqs[i].Cost hits and returns, per request,
	// what the node decides from next, and the store's time (µs): for a
	// window limit the hits were admitted in the window that starts at
	// windows[i] (µs on the store's clock), and the figure is what the
	// limit counts against its rate now; for a bucket limit the hits are
	// debited now whether or not they fit (sluice.Limit.Debit) and the
	// figure is the bucket's level now, a debt included
	// (sluice.Limit.Level).
	SyncCounts(ctx context.Context, reqs []sluice.Request, windows []int64) ([]int64, int64, error)
}

// Heartbeater is an optional interface of a store that counts the servers
// sharing it in async mode. store/redis implements it.
type Heartbeater interface {
	// Heartbeat records that the server id shares the store until ttl
	// from now on the store's clock, forgets the servers whose heartbeat
	// ended, and returns how many are left, id included. A ttl of 0
	// removes id.
	Heartbeat(ctx context.Context, id string, ttl time.Duration) (int64, error)
}

// heartbeatIntervals is how many sync intervals a server stays counted
// after its last heartbeat: generous, since a server counted after it
// stopped only makes the others' shares smaller, while one dropped from
// the count while it still admits (paused past its heartbeat) makes them
// larger.
const heartbeatIntervals = 10

// maxHeartbeat caps a heartbeat's lifetime (store/redis's cap).
const maxHeartbeat = 24 * time.Hour

// heartbeat renews the node's heartbeat in the store and takes the count
// of servers it returns as N. With no Heartbeater it does nothing.
func (s *Store) heartbeat(ctx context.Context) error {
	if s.beater == nil {
		return nil
	}
	n, err := s.beater.Heartbeat(ctx, s.id, min(heartbeatIntervals*s.syncEvery, maxHeartbeat))
	if err != nil {
		return fmt.Errorf("localfirst heartbeat: %w", err)
	}
	s.async.live.Store(max(n, 1))
	return nil
}

// asyncOverhead is what an async entry costs besides its key's bytes,
// rounded up: the entry (296 bytes on 64 bits) and its map slot.
const asyncOverhead = 336

// asyncTable holds, per key, what a node admits by itself in async mode.
// Bounded in bytes: a key that finds it full is decided by the store.
type asyncTable struct {
	seed     maphash.Seed
	budget   int64        // bytes per shard
	k        int64        // Config.AsyncShare
	floor    int64        // Config.AsyncNodes: the fewest servers counted
	live     atomic.Int64 // the servers the last heartbeat counted, 0 before one
	joined   atomic.Bool  // a key went async: the node heartbeats from now on
	interval int64        // Config.SyncInterval, µs
	shards   [leaseShards]asyncShard

	mu       sync.Mutex    // guards offset, offsetAt, synced
	offset   time.Duration // the store's clock less the node's (measure)
	offsetAt time.Time     // the node's clock when offset was last set
	synced   bool          // offset has been measured
}

type asyncShard struct {
	mu    sync.Mutex
	m     map[string]*asyncEntry
	bytes int64
	_     [40]byte
}

// asyncEntry is one key in async mode. Windows and times named at are on
// the store's clock.
type asyncEntry struct {
	req     sluice.Request // key, group and limit (Cost unused)
	window  int64          // the window allowance and pending are of
	allow   int64          // hits this node may still admit until its next sync
	pending int64          // hits admitted (in window), not yet written back
	oldWin  int64          // the window before, and its hits not yet written
	old     int64
	counted int64 // what the store counted at the last sync
	wrote   int64 // hits written beneath the node (Wrote) since the entry was made
	syncing bool  // a sync is in flight
	flying  int64 // the hits of the key's window that the sync in flight writes
	failed  error // the error of the last sync, until one succeeds
	seen    time.Time
	landed  chan struct{} // closed when the sync in flight lands; nil until a request waits for it

	// A bucket limit's (see grant): the level the store reported at its
	// last sync (or at the exact decision that made the entry), in the
	// units of the limit's sluice.Bucket, at the store's time at, which
	// the node's clock read as based; and used, the units of the hits
	// the node admitted since, pending or in flight.
	level, at int64
	based     time.Time
	used      int64
}

func newAsyncTable(bytes, floor, k int64, interval time.Duration) *asyncTable {
	a := &asyncTable{seed: maphash.MakeSeed(), budget: max(bytes/leaseShards, 1), k: k,
		floor: floor, interval: interval.Microseconds()}
	for i := range a.shards {
		a.shards[i].m = make(map[string]*asyncEntry)
	}
	return a
}

// nodes returns N, the servers async mode shares among: the most of the
// servers the store last counted (Heartbeater; none counted: 1) and
// Config.AsyncNodes.
func (a *asyncTable) nodes() int64 { return max(a.live.Load(), a.floor) }

// share returns N × k, the parts async mode divides what is left into.
func (a *asyncTable) share() int64 { return a.nodes() * a.k }

// storeNow returns the store's clock at local time now, as the last sync
// measured it, in µs.
func (a *asyncTable) storeNow(now time.Time) int64 {
	a.mu.Lock()
	off := a.offset
	a.mu.Unlock()
	return now.Add(off).UnixMicro()
}

// clockDrift bounds, as 1/clockDrift, how fast the store's clock and a
// node's may drift apart: 1 ms a second, ten times a quartz clock's
// 100 ppm. A reading of the store's clock is trusted, aged by it, until a
// better one comes (measure).
const clockDrift = 1000

// measure takes a reading of the store's clock: at (µs) on it, read by
// the store between before and after on the node's clock. The offset
// (the store's clock less the node's) was then at least at − after and
// at most at − before. The node keeps the latest lower bound it knows,
// at − after, never later than the store's clock: a reading whose round
// trip was long (a node stopped while the answer waited in its socket, a
// store that answered slowly) is low by that trip, and would put the
// node's windows behind the store's by it (after a 3 s stall, it decided
// and wrote back a new window's hits in the window 3 s before, where they
// counted against the ended window's hits, not in the new one), so a
// reading below what the last one says, aged by clockDrift since, leaves
// the offset at that; unless it contradicts it (its upper bound is
// lower: a clock stepped), when it is taken.
func (a *asyncTable) measure(at int64, before, after time.Time) {
	lo := time.Duration(at-after.UnixMicro()) * time.Microsecond
	hi := time.Duration(at-before.UnixMicro()) * time.Microsecond
	a.mu.Lock()
	defer a.mu.Unlock()
	off := lo
	if a.synced {
		if aged := a.offset - max(after.Sub(a.offsetAt), 0)/clockDrift; aged > lo && aged <= hi {
			off = aged
		}
	}
	a.offset, a.offsetAt, a.synced = off, after, true
}

// shard returns the shard that holds key.
func (a *asyncTable) shard(key string) *asyncShard {
	return &a.shards[maphash.String(a.seed, key)%leaseShards]
}

// asyncSize returns what the entry of key costs the table, in bytes.
func asyncSize(key string) int64 {
	return int64(len(key)) + asyncOverhead
}

// drop forgets key's entry. mu is held.
func (sh *asyncShard) drop(key string) {
	delete(sh.m, key)
	sh.bytes -= asyncSize(key)
}

// lookup returns the entry sh holds for r's key, or nil. When the rules
// changed since the entry was made, it is forgotten, to start over (a
// window's unwritten hits are dropped), but while hits of it are still to
// be written under the rule they passed (a sync in flight, or pending
// hits of a bucket limit, old or new) it is kept, and exact reports that
// r is decided by the store. mu is held.
func (sh *asyncShard) lookup(r sluice.Request) (e *asyncEntry, exact bool) {
	id := sluice.Request{Key: r.Key, Group: r.Group, Limit: r.Limit}
	e = sh.m[r.Key]
	if e == nil || sameLimit(e.req, id) {
		return e, false
	}
	if e.syncing || e.pending > 0 && (e.req.Limit.Algorithm.HasBurst() || r.Limit.Algorithm.HasBurst()) {
		return nil, true
	}
	sh.drop(r.Key)
	return nil, false
}

// allowance returns what one node may admit until its next sync, at at
// (the store's time, µs) in l's window that starts at w, when the store
// counts counted hits: an even share among the N nodes of what is left,
// spread over what is left of the window (paces),
//
//	max((rate − counted) / (N × D), 1) while anything is left,
//
// rounded down while D is k (a long window's start, as before pacing) and
// to the nearest hit after, so that a hot key fills its limit over the
// window, about as exact mode admits, however short the window.
func (a *asyncTable) allowance(l sluice.Limit, counted, w, at int64) int64 {
	left := l.Rate - counted
	if left <= 0 {
		return 0
	}
	q := a.paces(l, w, at)
	d := a.nodes() * q
	if q == 4*a.k {
		return max(4*left/d, 1)
	}
	return max((4*left+d/2)/d, 1)
}

// paces returns 4 × D, the divisor of a window limit's allowance at at
// (the store's time, µs) in the window that starts at w: D is the syncs
// left in the window, ⌈(w + period − at) / I⌉ (at least 1), and a quarter
// more when N > 1, at most k. The quarter keeps the nodes' last allowances
// of a window, each read before the others' hits were written, from
// overshooting (one node reads its own); k keeps a long window's first allowances, which a node
// may hold unused while others fill the limit, at most ⌊rate / (N × k)⌋.
func (a *asyncTable) paces(l sluice.Limit, w, at int64) int64 {
	syncs := max((w+l.Period.Microseconds()-at+a.interval-1)/a.interval, 1)
	if a.nodes() == 1 {
		return min(4*syncs, 4*a.k)
	}
	return min(4*syncs+1, 4*a.k)
}

// tooSmall reports whether l, a window limit, is too small to share out
// (it is decided exactly): a node's first allowance of a window would be
// under one hit.
func (a *asyncTable) tooSmall(l sluice.Limit) bool {
	return 4*l.Rate < a.nodes()*a.paces(l, 0, 0)
}

// fits reports whether async mode computes l's arithmetic exactly: for a
// window limit rate × period (µs) below 2^52, as store/redis's
// SyncCounts requires; for a bucket limit a capacity and a refill share
// (grant) each below 2^50 units, so that the deepest debt the bound
// allows, and the levels the node computes, stay far below 2^52. Others
// decide exactly.
func (a *asyncTable) fits(l sluice.Limit) bool {
	b, ok := l.Bucket()
	if !ok {
		return l.Rate <= maxAsyncProduct/l.Period.Microseconds()
	}
	return b.Full <= 1<<50 && a.refill(b) <= 1<<50
}

// refill returns the most units of refill a grant holds: what b drains in
// one sync interval, saturated.
func (a *asyncTable) refill(b sluice.Bucket) int64 {
	if hi, lo := bits.Mul64(uint64(b.Drain), uint64(a.interval)); hi != 0 || lo > 1<<62 {
		return 1 << 62
	}
	return b.Drain * a.interval
}

// grant returns what a node may have admitted, in the units of b, at at
// (the store's time) on a bucket key whose store reported level at e.at:
// its share of what was free then, and its share of what the bucket
// refills since, once a debt has drained, for one sync interval at most:
//
//	⌊max(free, 0) / (N × k)⌋ + ⌊min(max(Drain × (at − e.at) − debt, 0), Drain × SyncInterval) / N⌋
//
// with free = Full − level and debt = max(level − Full, 0); and at least
// one hit while the sync left one free. A grant is at most
//
//	S = max(Full / (N × k) + Drain × SyncInterval / N, Hit)
//
// and at sync time (elapsed 0) at most max(free, 0), which is what the
// bound rests on (see the package documentation). The refill share does not
// stop when the bucket would be full: the nodes' shares grow by Drain a
// µs together, as the bucket drains, so that the limit's rate is
// admitted however much of the bucket stands free.
func (a *asyncTable) grant(e *asyncEntry, b sluice.Bucket, at int64) int64 {
	free := b.Full - e.level
	var g int64
	if free > 0 {
		g = free / a.share()
	}
	if elapsed := at - e.at; elapsed > 0 {
		refilled := a.refill(b) // Drain × SyncInterval
		if elapsed < a.interval {
			refilled = b.Drain * elapsed
		}
		if refilled += min(free, 0); refilled > 0 {
			g += refilled / a.nodes()
		}
	}
	if free >= b.Hit {
		g = max(g, b.Hit)
	}
	return g
}

// takeAsync decides r in async mode: from the node's allowance, with no
// store call, but for the first request on a key the node does not hold,
// which the store decides (startAsync). A window key's request that finds
// the allowance spent while the store's count, as the node last read it,
// leaves room for it is not denied for that: it syncs the key now
// (refresh), or waits for the sync in flight to land (await), and is
// decided again from the allowance that sync gives (after maxRefresh such
// syncs, each of whose shares concurrent requests took first, the store
// decides it); so a client is denied only when the store's count has no
// room for it.
func (s *Store) takeAsync(ctx context.Context, r sluice.Request, now time.Time) (sluice.Decision, error) {
	a := s.async
	bucket := r.Limit.Algorithm.HasBurst()
	if !bucket && a.tooSmall(r.Limit) { // too small a limit to share out: exact
		return s.exact(ctx, r, now)
	}
	sh := a.shard(r.Key)
	local := true // decided with no store call
	for try := 0; ; try++ {
		sh.mu.Lock()
		e, exact := sh.lookup(r)
		if e == nil {
			sh.mu.Unlock()
			if exact || r.Cost == 0 {
				return s.exact(ctx, r, now)
			}
			return s.startAsync(ctx, r, now, sh)
		}
		var d sluice.Decision
		var next step
		if bucket {
			d, next = a.decideBucket(e, r.Cost, now, s.syncEvery)
		} else {
			d, next = a.decideWindow(e, r.Cost, now, s.syncEvery)
		}
		if (next == refresh || next == await) && try == maxRefresh {
			// Concurrent requests took every share this one waited for:
			// the store decides it, as it counts (a denial is its own).
			unwritten := e.pending + e.flying
			sh.mu.Unlock()
			d, err := s.exact(ctx, r, now)
			// The store's count leaves out the node's hits not yet
			// written: Remaining as the node's decisions say it, never
			// higher (decide's ledger takes a rise for a lost count).
			d.Remaining = max(d.Remaining-unwritten, 0)
			return d, err
		}
		switch next {
		case decided:
			sh.mu.Unlock()
			if local {
				s.asyncHits.Add(1)
			}
			return d, nil
		case unreachable:
			err := e.failed
			sh.mu.Unlock()
			return sluice.Decision{}, fmt.Errorf("localfirst async %s: %w", r.Key, err)
		case await:
			landed := e.waiter()
			sh.mu.Unlock()
			select {
			case <-landed:
			case <-ctx.Done():
				return sluice.Decision{}, fmt.Errorf("localfirst async %s: %w", r.Key, ctx.Err())
			}
		case refresh:
			items := e.due(sh, nil)
			sh.mu.Unlock()
			local = false
			_ = s.writeBack(ctx, items) // an error is the entry's failed: the next try returns it
		}
		now = s.now()
	}
}

// maxRefresh is how many times one request syncs its key, or waits for a
// sync of it to land, before the store decides it: each such sync gives
// the node a share of what the store has left, which concurrent requests
// on the key may take first.
const maxRefresh = 4

// step is what a request of an async window key needs next.
type step int

const (
	decided     step = iota // its decision is made
	refresh                 // the allowance is spent, and the store's count leaves room: sync the key now
	await                   // the allowance is spent while a sync of the key is in flight: wait for it
	unreachable             // the allowance is spent and the last sync failed: an error
)

// decideWindow decides a request of cost on e, a window key, at now (the
// node's clock) from the allowance the node holds, which it goes on
// admitting from while a sync is in flight. When the allowance is spent
// it returns the denial and what the request needs before it is decided
// again; a denial with decided is the store's count, as the last sync
// read it, with no room left for cost. every is Config.SyncInterval. mu
// is held.
func (a *asyncTable) decideWindow(e *asyncEntry, cost int64, now time.Time, every time.Duration) (sluice.Decision, step) {
	l := e.req.Limit
	p := l.Period.Microseconds()
	at := a.storeNow(now)
	if w := at - at%p; w > e.window { // a new window: what was pending is the old window's
		e.oldWin, e.old = e.window, e.pending
		e.window, e.pending, e.counted, e.flying = w, 0, 0, 0 // what is in flight is the old window's
		e.allow = a.allowance(l, 0, w, at)
	}
	e.seen = now
	capa := l.Capacity()
	d := sluice.Decision{Limit: capa, ResetAfter: time.Duration(e.window+p-at) * time.Microsecond}
	if l.Algorithm == sluice.SlidingWindow {
		d.ResetAfter += l.Period
	}
	next := decided
	switch {
	case cost > capa:
		d.RetryAfter = sluice.Never
	case cost <= e.allow:
		e.allow -= cost
		e.pending += cost
		d.Allowed = true
	case l.Rate-e.counted-e.pending-e.flying < cost: // no room, as the store last counted: denied, reachable or not
	case e.syncing:
		next = await
	case e.failed != nil:
		next = unreachable
	default: // room, as the store last counted
		next = refresh
	}
	if !d.Allowed && d.RetryAfter == 0 {
		d.RetryAfter = max(min(every, d.ResetAfter), time.Microsecond)
	}
	// The hits of a sync in flight count: Remaining never rises within a
	// window but when the store counts less (decide's ledger takes a fall
	// for a store that lost counts).
	d.Remaining = min(max(l.Rate-e.counted-e.pending-e.flying, 0), capa)
	return d, next
}

// waiter returns a channel that is closed when e's sync in flight lands.
// mu is held.
func (e *asyncEntry) waiter() <-chan struct{} {
	if e.landed == nil {
		e.landed = make(chan struct{})
	}
	return e.landed
}

// decideBucket decides a request of cost on e, a bucket key, at now (the
// node's clock): the limit's own transition on the level as the node
// knows it (the store's at its last sync, drained since, plus the node's
// hits since), which admits whatever the node's grant covers, and goes on
// doing so while a sync is in flight. A request the bucket as the node
// knows it has no room for is denied (decided); one the grant does not
// cover returns the denial and what it needs before it is decided again,
// as decideWindow's: a sync of the key (refresh), the sync in flight
// (await), or, the last one failed, an error (unreachable). A
// leaky_bucket's Wait counts the water the node knows of: short by what
// other nodes admitted since the last sync. every is Config.SyncInterval.
// mu is held.
func (a *asyncTable) decideBucket(e *asyncEntry, cost int64, now time.Time, every time.Duration) (sluice.Decision, step) {
	l := e.req.Limit
	b, _ := l.Bucket()
	at := a.storeNow(now)
	e.seen = now
	view := b.Drained(e.level, at-e.at) + e.used
	st := l.BucketState(view, at)
	d := l.TakeMicros(&st, at, cost)
	g := a.grant(e, b, at)
	switch {
	case cost == 0: // admitted, whatever debt the level carries (the store's Take of 0 would deny it)
		d.Allowed, d.RetryAfter, d.Wait = true, 0, 0
		return d, decided
	case !d.Allowed: // no room in the bucket as the node knows it
		return d, decided
	case e.used+cost*b.Hit <= g:
		e.used += cost * b.Hit
		e.pending += cost
		return d, decided
	}
	// room, but not in this node's grant
	st = l.BucketState(view, at)
	d = l.TakeMicros(&st, at, 0)
	d.Allowed = false
	d.RetryAfter = every
	if need := e.used + cost*b.Hit - g; need > 0 && need <= a.refill(b)/a.nodes() {
		d.RetryAfter = min(d.RetryAfter, time.Duration((need*a.nodes()+b.Drain-1)/b.Drain)*time.Microsecond)
	}
	d.RetryAfter = max(d.RetryAfter, time.Microsecond)
	switch {
	case 2*view > b.Full:
		// More than half full as the node knows it: a client at its limit,
		// whose bucket refills by the hit; syncing it at every refill
		// would cost a store call a hit. It waits for its grant.
		return d, decided
	case e.syncing:
		return d, await
	case e.failed != nil:
		return d, unreachable
	}
	return d, refresh
}

// startAsync decides r, the first request on a key the node does not
// hold, by the store, and holds the key from what the store's decision
// says, if the table has room: a bucket's level, or what a window limit
// counts (its rate less what remains), from which the first allowance is
// shared out. So a node that forgot an idle key starts again from the
// store's count, never from a fresh share of the whole limit.
func (s *Store) startAsync(ctx context.Context, r sluice.Request, now time.Time, sh *asyncShard) (sluice.Decision, error) {
	a := s.async
	a.joined.Store(true)
	if a.live.Load() == 0 {
		// Counted among the servers before the node admits by itself: the
		// others count it at their next sync. A failure leaves N at
		// Config.AsyncNodes until the next sync's heartbeat.
		_ = s.heartbeat(ctx)
	}
	s.calls.Add(1)
	before := s.now()
	d, st, at, ok, err := s.stater.TakeState(ctx, r)
	if err != nil {
		return d, err
	}
	s.learn(r, d, st, at, ok, now)
	if !ok {
		return d, nil
	}
	after := s.now()
	a.measure(at, before, after)
	l := r.Limit
	id := sluice.Request{Key: r.Key, Group: r.Group, Limit: r.Limit}
	e := &asyncEntry{req: id, seen: now, based: after}
	if l.Algorithm.HasBurst() {
		e.level, e.at = l.Level(st, at), at
	} else {
		p := l.Period.Microseconds()
		e.window, e.counted = at-at%p, l.Rate-d.Remaining
		e.allow = a.allowance(l, e.counted, e.window, at)
	}
	size := asyncSize(r.Key)
	sh.mu.Lock()
	if sh.bytes+size > a.budget {
		a.evict(sh, after, s.syncEvery, size)
	}
	if sh.m[r.Key] == nil && sh.bytes+size <= a.budget {
		sh.m[r.Key] = e
		sh.bytes += size
	}
	sh.mu.Unlock()
	return d, nil
}

// idle reports whether the node may forget e at now: nothing of it to
// write, no sync in flight, not seen for two sync intervals, and, for a
// window limit, its window over. A window key is kept through its window
// so that a client who comes back in it is decided from the share the
// node holds, with no store call; forgotten sooner (evict, when the table
// is full), it comes back through the store's count (startAsync), never
// with a fresh share. mu is held.
func (a *asyncTable) idle(e *asyncEntry, now time.Time, every time.Duration) bool {
	if !quiet(e, now, every) {
		return false
	}
	if e.req.Limit.Algorithm.HasBurst() {
		return true
	}
	return a.storeNow(now) >= e.window+e.req.Limit.Period.Microseconds()
}

// quiet reports whether e has nothing to write, no sync in flight, and
// has not been seen for two sync intervals at now. mu is held.
func quiet(e *asyncEntry, now time.Time, every time.Duration) bool {
	return !e.syncing && e.pending == 0 && e.old == 0 && now.Sub(e.seen) > 2*every
}

// evict makes room for size bytes in sh, a full shard, by forgetting keys
// with nothing to write that have not been seen for two sync intervals,
// windows not yet over included. mu is held.
func (a *asyncTable) evict(sh *asyncShard, now time.Time, every time.Duration, size int64) {
	for k, e := range sh.m {
		if sh.bytes+size <= a.budget {
			return
		}
		if quiet(e, now, every) {
			sh.drop(k)
		}
	}
}

// SyncAsync writes back every key's hits admitted in async mode since the
// last sync, in one pipelined call, and sets the next allowance of those
// keys and of keys whose allowance ran out from the counts the store
// returns, after renewing the node's heartbeat, whose count of servers
// the new shares divide by. The Store calls it every
// Config.SyncInterval by itself; tests call it to sync at an instant of
// their clock. While a key's sync is in flight, the node goes on
// admitting from the allowance or grant it holds, and what it admits
// meanwhile counts against the next.
func (s *Store) SyncAsync(ctx context.Context) error { return s.syncAsync(ctx, true) }

// syncAsync is SyncAsync, renewing the heartbeat if beat (not when the
// Store closes): the keys to sync (collect), the heartbeat, then the
// write and what it lands (writeBack).
func (s *Store) syncAsync(ctx context.Context, beat bool) error {
	a := s.async
	if a == nil {
		return nil
	}
	items := a.collect(s.now(), s.syncEvery)
	// The count before the shares given below, which are of it.
	var beatErr error
	if beat && a.joined.Load() { // a server with no async key counts for nothing
		beatErr = s.heartbeat(ctx)
	}
	if len(items) == 0 {
		return beatErr
	}
	if err := s.writeBack(ctx, items); err != nil {
		return errors.Join(errors.New("localfirst: async sync failed"), err, beatErr)
	}
	return errors.Join(beatErr, s.restoreIfLost(ctx))
}

// syncItem is what a sync writes of one key: the hits of its window, or
// of the window before (old), and reads: the key's count now (not old).
type syncItem struct {
	e      *asyncEntry
	sh     *asyncShard
	window int64
	hits   int64
	old    bool
	// counted and wrote are the entry's when the sync was sent: its read
	// of the store may come before hits written beneath the node since
	// (land).
	counted, wrote int64
}

// collect returns, for a sync at now (the node's clock), every key with
// hits to write or a count to read (stale), marking their syncs in
// flight, and forgets the idle keys. every is Config.SyncInterval.
func (a *asyncTable) collect(now time.Time, every time.Duration) []syncItem {
	var items []syncItem
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			switch {
			case e.syncing:
			case a.idle(e, now, every):
				sh.drop(k) // forgotten
			case stale(e):
				items = e.due(sh, items)
			}
		}
		sh.mu.Unlock()
	}
	return items
}

// stale reports whether a periodic sync writes e: it has hits to write,
// or it was asked for since its count was read and holds no allowance (a
// bucket key: whatever its grant). mu is held.
func stale(e *asyncEntry) bool {
	switch {
	case e.pending > 0 || e.old > 0:
		return true
	case !e.seen.After(e.based): // nobody asked since the count was read
		return false
	}
	return e.req.Limit.Algorithm.HasBurst() || e.allow == 0
}

// due appends to items what a sync of e writes and reads, and marks it in
// flight. sh holds e; mu is held.
func (e *asyncEntry) due(sh *asyncShard, items []syncItem) []syncItem {
	if e.old > 0 {
		items = append(items, syncItem{e: e, sh: sh, window: e.oldWin, hits: e.old, old: true})
		e.old = 0
	}
	items = append(items, syncItem{e: e, sh: sh, window: e.window, hits: e.pending, counted: e.counted, wrote: e.wrote})
	e.pending, e.flying, e.syncing = 0, e.pending, true
	return items
}

// writeBack writes items' hits to the store and reads their keys' counts
// in one call, then lands the reply on each key (land). An error is the
// store's; it is also each key's until a sync of it succeeds.
func (s *Store) writeBack(ctx context.Context, items []syncItem) error {
	reqs, windows := make([]sluice.Request, len(items)), make([]int64, len(items))
	for i, it := range items {
		reqs[i] = it.e.req
		reqs[i].Cost = it.hits
		windows[i] = it.window
	}
	s.calls.Add(1)
	before := s.now()
	counts, at, err := s.syncer.SyncCounts(ctx, reqs, windows)
	after := s.now()
	a := s.async
	if err == nil {
		// The store's clock, no later than it is, so that a node never
		// sees more refill than there was.
		a.measure(at, before, after)
	} else {
		s.returnErrors.Add(1)
	}
	for i, it := range items {
		if it.old {
			continue
		}
		var count int64
		if err == nil {
			count = counts[i]
		}
		it.sh.mu.Lock()
		if a.land(it, count, at, after, err) {
			s.lost()
		}
		it.sh.mu.Unlock()
	}
	return err
}

// land sets what the node decides it.e from next, once the sync of it
// that wrote it.hits is back: with count (a window's count or a bucket's
// level) read at the store's time at, which the node's clock read as
// after, or with the sync's error err. The hits admitted while the sync
// was in flight count against the new allowance or grant. Requests
// waiting for the sync (await) are woken. It reports whether the store
// lost counts: a fixed_window key's count below what the node read of it
// at its last sync in the same window (the store's clock still in it)
// plus the hits this sync wrote,
// which only a store that forgot it returns (a sliding_window's count
// falls as the window slides; a bucket's level, as it drains); the node
// then decides from what it knew, and the sync puts it back (restore).
// mu is held.
func (a *asyncTable) land(it syncItem, count, at int64, after time.Time, err error) (lost bool) {
	e := it.e
	e.syncing, e.failed, e.flying = false, err, 0
	if e.landed != nil {
		close(e.landed)
		e.landed = nil
	}
	l := e.req.Limit
	switch {
	case l.Algorithm.HasBurst() && err != nil:
		// The hits stay to be written at the next sync, still counted
		// against the grant of the last one that succeeded.
		e.pending += it.hits
	case l.Algorithm.HasBurst():
		// The hits written are in the level now; those admitted while
		// the sync was in flight stay pending, against the new grant.
		b, _ := l.Bucket()
		e.level, e.at, e.based = count, at, after
		e.used = max(e.used-it.hits*b.Hit, 0)
	case err != nil && e.window == it.window:
		// The hits stay to be written at the next sync; the node admits
		// what its allowance still holds, then returns the error.
		e.pending += it.hits
	case err != nil:
		e.old += it.hits // the window turned meanwhile
	case e.window == it.window:
		p := l.Period.Microseconds()
		// What the store held when the sync was sent and the hits it
		// wrote: a count below them is a loss. Hits written beneath the
		// node since (Wrote) are left out of the check, as the read may
		// come before them: counted in it, they made a read that came
		// first look like a loss, and the node put back every count it
		// held (43-45 keys after each host stall of the weather suite,
		// one server), counting them twice; they count in what the
		// node knows the store holds whether the read has them or not.
		known := it.counted + it.hits
		if l.Algorithm == sluice.FixedWindow && at-at%p == it.window && count < known {
			count, lost = known, true
		}
		if since := e.wrote - it.wrote; since > 0 {
			count = max(count, known+since)
		}
		e.counted, e.based = count, after
		e.allow = max(a.allowance(l, count, e.window, at)-e.pending, 0)
	default: // the window turned while the sync was in flight: a fresh share
		e.allow = max(a.allowance(l, 0, e.window, max(at, e.window))-e.pending, 0)
	}
	return lost
}

// Wrote tells the node that hits were written to the store beneath it
// (decide's ledger writing back what its server admitted without the
// store, through store/stack's WriteBack): reqs[i].Cost hits of
// reqs[i].Limit on reqs[i].Key, which the store counts in the window that
// starts at windows[i] (µs). An async window key the node holds in that
// window counts them in what the store counted, as its next sync would
// read them: its decisions say so at once, and if the store loses them (a
// restart empty) its next sync finds the loss and puts them back with the
// rest (restore). Before, the node's count left them out until its next
// sync, and it put back only what it had read: a Redis restarted at once
// after such a write-back forgot them for good (the weather suite's
// restart at once on three servers, once decide's ledger no longer put
// back async keys' counts: 364 admitted of a limit of 300, bound 318).
// A fixed_window lease key the node holds in that window counts them
// among the hits the store holds of its own (heldCount), below which a
// count is a loss. Other keys are left alone. A sync of the key that
// read the store after the write and landed before this call counted
// them already: the node then counts them twice until its next sync (a
// lower allowance), never the store.
func (s *Store) Wrote(reqs []sluice.Request, windows []int64) {
	s.wroteLeases(reqs, windows)
	a := s.async
	if a == nil {
		return
	}
	for i, r := range reqs {
		if r.Cost <= 0 || r.Limit.Algorithm.HasBurst() {
			continue
		}
		sh := a.shard(r.Key)
		sh.mu.Lock()
		if e := sh.m[r.Key]; e != nil && sameLimit(e.req, r) && e.window == windows[i] {
			e.counted += r.Cost
			e.wrote += r.Cost
		}
		sh.mu.Unlock()
	}
}

// SyncKeys syncs now every async window key of reqs the node holds (but
// those whose sync is in flight): their hits written, their counts read.
// store/stack's WriteBack calls it before it writes hits of reqs beneath
// the node (then Wrote): if the store restarted empty, the sync finds the
// loss and puts back the counts the node holds, merged by maximum, before
// those hits are added, which would otherwise raise the empty count past
// what the node knew and hide the loss (three servers on a Redis
// restarted at once admitted up to 353 of a limit of 300, bound 318).
func (s *Store) SyncKeys(ctx context.Context, reqs []sluice.Request) error {
	a := s.async
	if a == nil {
		return nil
	}
	var items []syncItem
	for _, r := range reqs {
		if r.Limit.Algorithm.HasBurst() {
			continue
		}
		sh := a.shard(r.Key)
		sh.mu.Lock()
		if e := sh.m[r.Key]; e != nil && sameLimit(e.req, r) && !e.syncing {
			items = e.due(sh, items)
		}
		sh.mu.Unlock()
	}
	if len(items) == 0 {
		return nil
	}
	if err := s.writeBack(ctx, items); err != nil {
		return err
	}
	return s.restoreIfLost(ctx)
}

// syncLoop calls SyncAsync every interval until stop is closed.
func (s *Store) syncLoop(stop <-chan struct{}, done chan<- struct{}) {
	every(stop, done, s.syncEvery, max(s.syncEvery, time.Second), s.SyncAsync) // errors counted in Stats.ReturnErrors
}
