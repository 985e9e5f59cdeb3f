package decide

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice"
)

// ledger is what a Service knows of keys when its store does not decide
// them (the fail mode local): per key, the last decision the store made on
// it (how much of the limit it had counted, and when that count resets),
// this server's share of the limit as it decides it locally, seeded from
// that count, and the hits it admitted locally that the store has not
// counted (pending, written back by Service.Probe; in flight, while the
// store call that carries them has not ended). It holds at most maxBytes,
// keys included. It is safe for concurrent use.
type ledger struct {
	shards  [ledgerShards]ledgerShard
	hash    maphash.Seed
	bytes   int64        // per shard
	nodes   func() int64 // the servers counted, at least 1
	pending atomic.Int64 // entries with pending hits
	flying  atomic.Int64 // entries with hits in flight
	lost    atomic.Int64 // entries whose count the store lost, to put back
	putting atomic.Int64 // entries whose count is being put back (restoring)
	dropped atomic.Int64 // pending hits forgotten: evicted unwritten, or of a limit the rules changed
	expired atomic.Int64 // pending hits of a window that ended before they were written: they count no more
	// epoch counts the changes of what entries say the store holds (a
	// count learned, hits written back, a count put back), in order: a
	// store call sent at an epoch (Load) before an entry's was evaluated
	// by the store perhaps before that change, so its count is no sign of
	// a loss.
	epoch atomic.Int64
	sync  sluice.Sync // the store's mode for sluice.DefaultSync (Config.Sync)

	// idle is closed when hits in flight or written back end (ended,
	// written) while waiters wait for a key to be no longer busy
	// (Service.holdDenial); nil until one waits.
	idleMu  sync.Mutex
	idle    chan struct{}
	waiters atomic.Int64
}

// ledgerShards is the number of shards of a ledger, a power of two.
const ledgerShards = 64

// entrySize is what an entry of r costs: its key's bytes and those of its
// Envoy descriptor (kept for the write-back, which counts its hits under
// Envoy's keys where the store does: store/envoykeys), and ledgerOverhead.
func entrySize(r *sluice.Request) int64 {
	n := int64(len(r.Key)+len(r.Envoy.Domain)) + ledgerOverhead
	for _, e := range r.Envoy.Entries {
		n += int64(len(e.Key)+len(e.Value)) + entryOverhead
	}
	return n
}

// entryOverhead is what an Envoy descriptor's entry costs besides its
// strings' bytes: two string headers.
const entryOverhead = 32

// ledgerOverhead is what an entry costs besides its key's bytes, rounded
// up: the map's slot, the entry and its pointer.
const ledgerOverhead = 256

// learnAbove is the share of a limit, as 1/learnAbove, that a key's count
// must pass before a decision of the store makes it an entry: keys far
// under their limit are left out (an entry already there is kept up to
// date), so a key decided locally without an entry had counted at most
// capacity/learnAbove, which is the part of the bound it adds.
const learnAbove = 20

type ledgerShard struct {
	mu    sync.Mutex
	m     map[string]*ledgerEntry
	bytes int64
}

// ledgerEntry is what a ledger knows of one key. Times are µs since the
// Unix epoch on the Service's clock.
type ledgerEntry struct {
	req   sluice.Request // Key, Group, Limit, Sync, Scope of the key's last request
	used  int64          // hits the store had counted at at (Decision.Limit − Remaining)
	wrote int64          // hits written back to the store since
	at    int64          // when the store decided
	reset int64          // when the store's count is whole again: at + ResetAfter
	// seeded says local is this server's share since the store's last
	// decision on the key; the next local decision seeds it again
	// otherwise.
	seeded   bool
	hasLocal bool         // local is a share this server decided from
	share    sluice.Limit // the limit local follows: req.Limit over the servers counted
	local    sluice.State
	// pending hits were admitted locally, never counted by the store; in
	// window limits in the window that starts at window.
	pending, window int64
	// inflight hits were admitted locally while the store call that
	// carries them goes on.
	inflight int64
	// lost says the store forgot the key's count (a restart without
	// persistence): used is what it should hold, to be put back.
	lost bool
	// sent is when the call of the count learned was sent (µs): the store
	// counted between sent and at.
	sent int64
	// epoch is the ledger's epoch when used, wrote or a count put back
	// last changed; restoring while a put back is in flight.
	epoch     int64
	restoring bool
}

func newLedger(maxBytes int64, nodes func() int64) *ledger {
	l := &ledger{hash: maphash.MakeSeed(), bytes: max(maxBytes/ledgerShards, 1), nodes: nodes}
	for i := range l.shards {
		l.shards[i].m = make(map[string]*ledgerEntry)
	}
	return l
}

// shardOf returns the index of key's shard.
func (l *ledger) shardOf(key string) int {
	return int(maphash.String(l.hash, key) & (ledgerShards - 1))
}

// usedAt returns what the store's count of e is at now, as far as its last
// decision tells: a bucket drains to 0 by e.reset, a window keeps its
// count until then (a sliding_window's weighs less, so this is an upper
// bound).
func (e *ledgerEntry) usedAt(now int64) int64 {
	switch {
	case now >= e.reset || e.used <= 0:
		return 0
	case !e.req.Limit.Algorithm.HasBurst() || now <= e.at:
		return e.used
	}
	return ceilDiv(e.used*(e.reset-now), e.reset-e.at)
}

// ceilDiv returns ⌈a/b⌉ for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a-1)/b + 1
}

// learn records the store's decisions ds on reqs, made at now, on a call
// sent at epoch sent (l.epoch.Load() before it was sent): the count of each
// key the ledger holds, or whose count passed 1/learnAbove of its limit.
// The local share of each is seeded again at its next local decision. A
// count below what the ledger knew is taken as a loss only for a key
// decided exactly (exact), and only from a call
// sent after the store had acknowledged all the ledger knew of the key: a
// call sent earlier may have been counted before a write-back that was
// acknowledged first (its answer came later on a busy machine); such an
// answer is left out.
func (l *ledger) learn(reqs []sluice.Request, ds []sluice.Decision, now, sent, sentAt int64) {
	for i := range reqs {
		r, d := &reqs[i], ds[i]
		used := d.Limit - d.Remaining
		sh := &l.shards[l.shardOf(r.Key)]
		sh.mu.Lock()
		e := sh.m[r.Key]
		if e == nil && used*learnAbove > d.Limit {
			e = l.insert(sh, *r, now)
		}
		if e != nil {
			if e.req.Limit != r.Limit {
				l.forget(e, *r)
			}
			stale := e.epoch > sent || e.restoring
			switch {
			case stale && used < e.usedAt(now)+e.wrote:
				// An answer that may predate what the ledger knows, and
				// says less: it teaches nothing.
				sh.mu.Unlock()
				continue
			case !stale && l.exact(r.Sync) && forgot(e, used, sentAt, now):
				// What it held when it forgot comes on top of what it
				// counted since (the hits written back included).
				used += e.used
				if d.Allowed && used > r.Limit.Capacity() {
					// The store admitted on a count it forgot: the
					// key is over its limit.
					ds[i].Allowed, ds[i].Remaining, ds[i].RetryAfter = false, 0, d.ResetAfter
				}
				if !e.lost {
					e.lost = true
					l.lost.Add(1)
				}
			}
			e.used, e.wrote, e.at, e.sent, e.reset, e.seeded = used, 0, now, sentAt, now+d.ResetAfter.Microseconds(), false
			e.epoch = l.epoch.Add(1)
		}
		sh.mu.Unlock()
	}
}

// forgot reports whether the store forgot a fixed_window key's count (a
// restart without persistence, a failover to a replica that lagged): in the
// window of e's last count, it now counts used, less than that count and
// the hits this server wrote back since, the limit at most (a store
// reports no count above it), by more than a sixteenth of the limit. The store counted used between sent,
// when its call was sent, and now, when the answer came, and e's count
// between e.sent and e.at: only a window that holds all four is the same,
// whatever the server's clock did meanwhile (a server stopped a while
// reads an answer of a window that has ended since: its count, higher, is
// no sign the next window's count was lost).
func forgot(e *ledgerEntry, used, sent, now int64) bool {
	lim := e.req.Limit
	c := lim.Capacity()
	w := windowOf(lim, now)
	return lim.Algorithm == sluice.FixedWindow && now < e.reset &&
		windowOf(lim, sent) == w && windowOf(lim, e.at) == w && windowOf(lim, e.sent) == w &&
		min(e.used+e.wrote, c)-used > max(c/16, 1)
}

// exact reports whether requests of sync are decided exactly
// (Config.Sync), so that their answers are the store's count: only a fall
// in those is taken for a count the store lost. A lease or async key's
// answers are a node's count (store/localfirst): a lease's, what the
// store counted at its grant less what the lease has not admitted yet;
// async's, what the store counted at the node's last sync, on the store's
// clock as the node reads it, plus the node's hits since. They leave out
// the hits this ledger wrote back beneath the node, other nodes' hits,
// and what other nodes' leases gave back, until the node's next grant or
// sync, so a fall in them is no sign of a loss. The node finds a loss
// itself, from the store's own count at a grant or a sync below what it
// knows the store holds, and puts back what it holds. Taken for a loss, a
// fall made the ledger put back its count on top of the node's: 377 of an
// hourly limit of 300 once the ledger had written back 128 hits (async,
// the weather suite's host stall, one server: a client was denied 99
// hits under its limit for the rest of the hour); in lease mode, keys of
// a per-second limit found lost once a second after the host stall, their
// counts doubled, and clients under their limit denied (17 of 2,000 on
// one server, 5 on three).
func (l *ledger) exact(sync sluice.Sync) bool {
	if sync == sluice.DefaultSync {
		sync = l.sync
	}
	return sync == sluice.DefaultSync || sync == sluice.Exact
}

// insert adds an entry for r to sh, evicting others when sh is full, and
// returns it. sh is locked.
func (l *ledger) insert(sh *ledgerShard, r sluice.Request, now int64) *ledgerEntry {
	size := entrySize(&r)
	l.evict(sh, now, size)
	r.Cost = 0
	r.Envoy.Entries = slices.Clone(r.Envoy.Entries) // the caller's request may be reused
	e := &ledgerEntry{req: r}
	sh.m[r.Key] = e
	sh.bytes += size
	return e
}

// evict drops entries of sh until size more bytes fit: first those that
// say nothing any more (their count reset, nothing pending or in flight),
// then any, their pending hits counted in dropped. sh is locked.
func (l *ledger) evict(sh *ledgerShard, now, size int64) {
	for pass := 0; pass < 2 && sh.bytes+size > l.bytes; pass++ {
		for k, e := range sh.m { // in random order
			if sh.bytes+size <= l.bytes {
				return
			}
			if pass == 0 && (now < e.reset || e.pending != 0 || e.inflight != 0) {
				continue
			}
			l.remove(sh, k, e)
		}
	}
}

// remove drops e, under key k, from sh. sh is locked.
func (l *ledger) remove(sh *ledgerShard, k string, e *ledgerEntry) {
	if e.lost {
		l.lost.Add(-1)
	}
	if e.restoring {
		l.putting.Add(-1)
	}
	if e.pending != 0 {
		l.dropped.Add(e.pending)
		l.pending.Add(-1)
	}
	if e.inflight != 0 {
		l.flying.Add(-1)
	}
	delete(sh.m, k)
	sh.bytes -= entrySize(&e.req)
}

// forget makes e an entry of r, whose limit is not e's (the rules
// changed): what e knew is of another limit. The lock of e's shard is
// held.
func (l *ledger) forget(e *ledgerEntry, r sluice.Request) {
	if e.pending != 0 {
		l.dropped.Add(e.pending)
		l.pending.Add(-1)
	}
	if e.lost {
		l.lost.Add(-1)
	}
	if e.restoring {
		l.putting.Add(-1)
	}
	r.Cost, r.Envoy = 0, e.req.Envoy // of the same key, and its size counted
	*e = ledgerEntry{req: r, inflight: e.inflight}
}

// busy reports whether a key of reqs has hits admitted locally while a
// store call that carries them (or writes them back) goes on, or a count
// the store lost that is not put back yet. Such a key is decided locally
// until the call ends, or the count is put back, so that the store counts
// those hits before it decides anew on the key (pending hits, which no
// call carries yet, are written back at once instead: Service.kick), and
// no decision of the store on a count it forgot admits past the limit.
func (l *ledger) busy(reqs []sluice.Request) bool {
	if l.flying.Load() == 0 && l.lost.Load() == 0 && l.putting.Load() == 0 {
		return false
	}
	return l.anyEntry(reqs, func(e *ledgerEntry) bool { return e.inflight != 0 || e.losing() })
}

// anyEntry reports whether the entry of a key of reqs is one has reports,
// each read under its shard's lock.
func (l *ledger) anyEntry(reqs []sluice.Request, has func(e *ledgerEntry) bool) bool {
	for i := range reqs {
		sh := &l.shards[l.shardOf(reqs[i].Key)]
		sh.mu.Lock()
		e := sh.m[reqs[i].Key]
		b := e != nil && has(e)
		sh.mu.Unlock()
		if b {
			return true
		}
	}
	return false
}

// losing reports whether the store lost e's count, not yet put back.
func (e *ledgerEntry) losing() bool { return e.lost || e.restoring }

// idleCh returns a channel that is closed the next time hits in flight or
// written back end, for a waiter counted in waiters.
func (l *ledger) idleCh() <-chan struct{} {
	l.idleMu.Lock()
	defer l.idleMu.Unlock()
	if l.idle == nil {
		l.idle = make(chan struct{})
	}
	return l.idle
}

// wake closes the channel idleCh returned, if anyone waits.
func (l *ledger) wake() {
	if l.waiters.Load() == 0 {
		return
	}
	l.idleMu.Lock()
	if l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
	l.idleMu.Unlock()
}

// losing reports whether a key of reqs has a count the store lost, not
// yet put back (lost, or restoring).
func (l *ledger) losing(reqs []sluice.Request) bool {
	if l.lost.Load() == 0 && l.putting.Load() == 0 {
		return false
	}
	return l.anyEntry(reqs, (*ledgerEntry).losing)
}

// shareOf returns l over n servers: rate and burst divided, rounded up.
func shareOf(l sluice.Limit, n int64) sluice.Limit {
	if n <= 1 {
		return l
	}
	l.Rate = ceilDiv(l.Rate, n)
	if l.Burst > 0 {
		l.Burst = ceilDiv(l.Burst, n)
	}
	return l
}

// windowOf returns the start of the window of limit lim that holds now,
// or 0 for a bucket limit, whose hits belong to no window.
func windowOf(lim sluice.Limit, now int64) int64 {
	if lim.Algorithm.HasBurst() {
		return 0
	}
	p := lim.Period.Microseconds()
	if p <= 0 {
		return 0
	}
	m := now % p
	if m < 0 {
		m += p
	}
	return now - m
}

// seed sets e's local share from the store's last count of it, the
// servers counted now, and the hits of this server the store has not
// counted yet. A share this server already decided from, of the same
// limit, is kept when it has less left: hits admitted here that a count
// read before they reached the store does not hold are never forgotten.
// The lock of e's shard is held.
func (l *ledger) seed(e *ledgerEntry, now int64) {
	n := max(l.nodes(), 1)
	share, st := shareOf(e.req.Limit, n), sluice.State{}
	hits := ceilDiv(e.usedAt(now), n) + e.inflight
	if e.pending != 0 && (e.window == windowOf(e.req.Limit, now)) {
		hits += e.pending
	}
	if hits = min(hits, share.Capacity()); hits > 0 {
		share.TakeMicros(&st, now, hits)
	}
	if e.hasLocal && e.share == share {
		old, seeded := e.local.Clone(), st.Clone()
		if share.TakeMicros(&old, now, 0).Remaining < share.TakeMicros(&seeded, now, 0).Remaining {
			st = e.local
		}
	}
	e.share, e.local, e.seeded, e.hasLocal = share, st, true, true
}

// take decides reqs locally at now into ds, all or none, as TakeAll does:
// each key against this server's share of its limit, seeded from what the
// store last counted. The decisions report the share as the limit. An
// admitted hit is in flight when inflight (a store call carries it), else
// pending when record (a store to write it back to), else forgotten.
func (l *ledger) take(reqs []sluice.Request, ds []sluice.Decision, now int64, inflight, record bool) bool {
	idx := make([]int, 0, 4)
	for i := range reqs {
		idx = append(idx, l.shardOf(reqs[i].Key))
	}
	locked := lockShards(l, idx)
	defer func() {
		for _, i := range locked {
			l.shards[i].mu.Unlock()
		}
	}()
	entries := make([]*ledgerEntry, len(reqs))
	states := make([]sluice.State, len(reqs))
	allowed := true
	for i := range reqs {
		r := &reqs[i]
		sh := &l.shards[idx[i]]
		e := sh.m[r.Key]
		if e == nil {
			e = l.insert(sh, *r, now)
		}
		if e.req.Limit != r.Limit {
			l.forget(e, *r)
		}
		if !e.seeded {
			l.seed(e, now)
		}
		st := e.local
		for j := range i { // the same key twice in one call
			if entries[j] == e {
				st = states[j]
			}
		}
		st = st.Clone()
		ds[i] = e.share.TakeMicros(&st, now, r.Cost)
		entries[i], states[i] = e, st
		allowed = allowed && ds[i].Allowed
	}
	if !allowed {
		return false
	}
	for i, e := range entries {
		e.local = states[i]
		cost := reqs[i].Cost
		switch {
		case inflight:
			if e.inflight == 0 && cost > 0 {
				l.flying.Add(1)
			}
			e.inflight += cost
		case record:
			l.addPending(e, cost, now)
		}
	}
	return true
}

// addPending adds cost hits admitted at now to e's pending hits. Those of
// a window that has ended are dropped: they no longer count against the
// limit. The lock of e's shard is held.
func (l *ledger) addPending(e *ledgerEntry, cost, now int64) {
	if cost <= 0 {
		return
	}
	w := windowOf(e.req.Limit, now)
	if e.pending != 0 && e.window != w {
		l.expired.Add(e.pending)
		e.pending = 0
		l.pending.Add(-1)
	}
	if e.pending == 0 {
		l.pending.Add(1)
	}
	e.pending += cost
	e.window = w
}

// lockShards locks the distinct shards of idx in ascending order and
// returns them.
func lockShards(l *ledger, idx []int) []int {
	var set [ledgerShards]bool
	for _, i := range idx {
		set[i] = true
	}
	locked := make([]int, 0, len(idx))
	for i, ok := range set {
		if ok {
			l.shards[i].mu.Lock()
			locked = append(locked, i)
		}
	}
	return locked
}

// ended settles the hits of reqs admitted locally while the store call
// that carried them went on, now that it has ended at now: with err nil
// the store counted what it allowed (ds), and the rest, admitted here, is
// pending when record; with an error every hit is pending when record.
func (l *ledger) ended(reqs []sluice.Request, ds []sluice.Decision, err error, now, sent, sentAt int64, record bool) {
	defer l.wake()
	stored := err == nil
	for i := range reqs {
		stored = stored && ds[i].Allowed
	}
	for i := range reqs {
		r := &reqs[i]
		sh := &l.shards[l.shardOf(r.Key)]
		sh.mu.Lock()
		e := sh.m[r.Key]
		if e == nil && !stored && record {
			e = l.insert(sh, *r, now)
		}
		if e != nil {
			if e.inflight > 0 && e.inflight <= r.Cost {
				l.flying.Add(-1)
			}
			e.inflight = max(e.inflight-r.Cost, 0)
			if !stored && record {
				l.addPending(e, r.Cost, now)
			}
		}
		sh.mu.Unlock()
	}
	if err == nil {
		l.learn(reqs, ds, now, sent, sentAt)
	}
}

// drain takes every pending hit out of the ledger, as requests of Cost
// the hits with the start of their windows (0 for a bucket limit), for a
// write-back; they are in flight until written puts them back, as pending
// if the write-back failed. Pending hits of a window that has ended are
// dropped: they count no more.
func (l *ledger) drain(now int64) (reqs []sluice.Request, windows []int64) {
	if l.pending.Load() == 0 {
		return nil, nil
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if e.pending == 0 {
				continue
			}
			if w := windowOf(e.req.Limit, now); e.window != w {
				l.expired.Add(e.pending)
			} else {
				r := e.req
				r.Cost = e.pending
				reqs, windows = append(reqs, r), append(windows, e.window)
				if e.inflight == 0 {
					l.flying.Add(1)
				}
				e.inflight += e.pending
			}
			e.pending = 0
			l.pending.Add(-1)
		}
		sh.mu.Unlock()
	}
	return reqs, windows
}

// unwritten returns the hits admitted locally that the store has not
// counted and no store call carries (pending), and the keys that hold them.
func (l *ledger) unwritten() (hits, keys int64) {
	if l.pending.Load() == 0 {
		return 0, 0
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if e.pending != 0 {
				hits += e.pending
				keys++
			}
		}
		sh.mu.Unlock()
	}
	return hits, keys
}

// written ends the write-back of the hits drain took out: ok says the
// store has them; otherwise they are pending again.
func (l *ledger) written(reqs []sluice.Request, windows []int64, now int64, ok bool) {
	defer l.wake()
	for i := range reqs {
		r := &reqs[i]
		sh := &l.shards[l.shardOf(r.Key)]
		sh.mu.Lock()
		e := sh.m[r.Key]
		switch {
		case e == nil && ok:
		case e == nil:
			l.dropped.Add(r.Cost) // evicted meanwhile
		default:
			if e.inflight > 0 && e.inflight <= r.Cost {
				l.flying.Add(-1)
			}
			e.inflight = max(e.inflight-r.Cost, 0)
			if ok {
				if e.req.Limit == r.Limit && now < e.reset {
					e.wrote += r.Cost // the store holds them now
					e.epoch = l.epoch.Add(1)
				}
				break
			}
			if e.req.Limit != r.Limit {
				l.dropped.Add(r.Cost)
				break
			}
			if e.pending != 0 && e.window != windows[i] {
				l.expired.Add(r.Cost)
				break
			}
			if e.pending == 0 {
				l.pending.Add(1)
			}
			e.pending += r.Cost
			e.window = windows[i]
		}
		sh.mu.Unlock()
	}
}

// suspect marks as lost, to be put back, the count of every key whose
// fixed window has not ended at now (µs): a store that answers again
// after failing may have restarted empty, and the counts put back merge
// by maximum, so one it kept is left as it is. An async key's count is
// its node's, at most what the store counted and the node's hits not yet
// synced; a lease key's may hold hits a lease gave back since, at most a
// lease, within the under-admission lease mode states. Service.Probe
// calls it when the store answers again, so that what it forgot is put
// back before it decides anew; a loss learn finds (a restart the breaker
// did not see) is put back once found.
func (l *ledger) suspect(now int64) {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			lim := e.req.Limit
			if e.lost || e.used+e.wrote <= 0 || now >= e.reset || lim.Algorithm != sluice.FixedWindow {
				continue
			}
			e.lost = true
			l.lost.Add(1)
		}
		sh.mu.Unlock()
	}
}

// lostCounts takes out the counts the store lost, as requests of Cost the
// count to put back (its last count and the hits written back since: a
// write-back that reached a store back empty before the count was put
// back is otherwise hidden by the merge by maximum, and lost), with the
// start of their windows on the store's clock
// (from when the count resets there, half a period before it, aligned:
// robust to clocks apart by less than half a period); restored puts back
// those a restore failed to write.
func (l *ledger) lostCounts(now int64) (reqs []sluice.Request, windows []int64) {
	if l.lost.Load() == 0 {
		return nil, nil
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if !e.lost {
				continue
			}
			e.lost = false
			l.lost.Add(-1)
			p := e.req.Limit.Period.Microseconds()
			if now >= e.reset || p <= 0 {
				continue // the window ended: nothing to put back
			}
			w := e.reset - p/2
			w -= w % p
			r := e.req
			r.Cost = e.used + e.wrote
			reqs, windows = append(reqs, r), append(windows, w)
			if !e.restoring {
				e.restoring = true // until restored: answers until then may lack it
				l.putting.Add(1)
			}
		}
		sh.mu.Unlock()
	}
	return reqs, windows
}

// restored ends a restore of the counts lostCounts took out: if it
// failed, they are to be put back again. Either way a store call sent
// before it ended may not show it (see learn).
func (l *ledger) restored(reqs []sluice.Request, ok bool) {
	for i := range reqs {
		sh := &l.shards[l.shardOf(reqs[i].Key)]
		sh.mu.Lock()
		if e := sh.m[reqs[i].Key]; e != nil {
			if e.restoring {
				e.restoring = false
				l.putting.Add(-1)
			}
			e.epoch = l.epoch.Add(1)
			if !ok && !e.lost && e.req.Limit == reqs[i].Limit {
				e.lost = true
				l.lost.Add(1)
			}
		}
		sh.mu.Unlock()
	}
}
