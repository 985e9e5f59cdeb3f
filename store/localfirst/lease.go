package localfirst

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// Sync says how a Store's decisions reach the store it decorates: a
// request's own sluice.Sync, or Config.Sync for sluice.DefaultSync.
type Sync = sluice.Sync

// The sync modes, as a Store decides them.
const (
	// Exact decisions are the store's, but for the near cache's denials:
	// one store call per decision.
	Exact = sluice.Exact
	// Lease decisions come from leases: a node takes part of a hot key's
	// quota from the store in one atomic call (the store debits it),
	// admits from it by itself (a bucket's hits each by its due
	// instant), and gives back what it did not use when the lease ends,
	// where that is exact. Never more than the limit; fewer by at most
	// the leases outstanding (see the package documentation). For the
	// algorithms the store can lease (Leaser.CanLease: all but
	// sliding_log on Redis); the others decide exactly.
	Lease = sluice.Lease
	// Async decisions make no store call: a node admits from an allowance,
	// an even share of what the store counted left at its last sync, and
	// writes its hits back every Config.SyncInterval, over the limit by
	// at most the bound the package documentation states. For the
	// algorithms the store syncs (Syncer.Syncable: all but sliding_log
	// on Redis); the others decide exactly.
	Async = sluice.Async
)

// Leaser is an optional interface of a Stater store that takes back the
// unused hits of leases. store/redis implements it.
type Leaser interface {
	Stater
	// CanLease reports whether the store takes back leases of l.
	CanLease(l sluice.Limit) bool
	// ReturnLeases gives back rets[i].Cost unused hits of a lease whose
	// grant left the key in state grants[i] (as TakeState reported it),
	// where giving them back is exact: a window's hits while the window
	// lasts; a bucket's (token_bucket, leaky_bucket, gcra) while nothing
	// was admitted on the key since the grant, no further back than the
	// store's now. It returns how many it gave back.
	ReturnLeases(ctx context.Context, rets []sluice.Request, grants []sluice.State) (int64, error)
}

// leaseShards is how many independently locked parts the lease table has.
const leaseShards = 32

// leaseOverhead is what a lease entry costs besides its key's bytes,
// rounded up: the entry (472 bytes on 64-bit), its pointer and a map slot
// (the key's string header, the pointer and a byte of hash, about 32
// bytes; TestLeaseOverhead checks the sum).
const leaseOverhead = 520

// leases holds, per key, the lease a node admits from and what sizes the
// next one. It is bounded in bytes: a key that finds it full is decided
// by the store. Safe for concurrent use.
type leases struct {
	seed     maphash.Seed
	budget   int64 // bytes per shard
	lifetime time.Duration
	maxLease int64
	shards   [leaseShards]leaseShard
}

type leaseShard struct {
	mu    sync.Mutex
	m     map[string]*leaseEntry
	bytes int64
	_     [40]byte
}

// leaseEntry is one key's lease. Times are Config.Now's.
type leaseEntry struct {
	req      sluice.Request  // the key, group and limit (Cost unused)
	left     int64           // hits of the lease not yet admitted
	granted  int64           // the lease's size
	window   int64           // start of the window it was taken in, µs on the store's clock (a window limit's)
	grant    sluice.Decision // the store's decision on the grant
	st       sluice.State    // the key's state as the grant left it
	gat      int64           // the grant's instant, µs on the store's clock
	at       time.Time       // when the grant was asked for
	rtt      time.Duration   // how long the grant took to come back
	until    time.Time       // when the lease ends unless the key is still busy
	end      time.Time       // when its window ends, or (a bucket) just past its next hit's due instant: the lease ends then at the latest
	drained  time.Time       // a bucket limit: when the key's bucket, as the store last reported it, is empty
	denied   time.Time       // when the store's last denial of the key ends (the near cache answers it until then)
	seen     time.Time       // the key's latest request
	since    time.Time       // the start of the lifetime count counts in
	count    int64           // the key's hits since since
	size     int64           // the next lease's size; below minLease, no lease
	granting chan struct{}   // while a grant is in flight; closed when it lands
	held     heldCount       // a fixed_window key's count as the node knows the store holds it
}

// heldCount is what a node knows the store holds of a fixed_window key in
// the window that starts at win (µs on the store's clock): at least mine,
// the hits its grants and exact decisions added there and those written
// beneath it (Wrote), each counted once acknowledged, less gave, those its
// leases gave back (counted as they go, acknowledged or not); and high,
// the highest count an answer of the store showed there. Other nodes'
// leases given back lower the store's count below high, never below
// mine − gave, which only a store that lost the key counts (a restart
// without persistence, a failover to a replica that lagged): lease
// answers are the node's count, and decide's ledger leaves their falls to
// it (see counted).
type heldCount struct {
	win, mine, gave, high int64
}

// sent is what a call of the key, sent now, compares its answer with
// (counted): the window and the hits of the node's own it was sent on.
func (h *heldCount) sent() heldSent { return heldSent{h.win, h.mine} }

// heldSent is a heldCount as a call was sent on it.
type heldSent struct{ win, mine int64 }

// counted keeps what the store's answer st (ok: it has the state) to a
// call of e's key, sent on h0, tells of its count, cost the hits the call
// added there, and returns the count to put back when the answer shows
// the store lost the key: the count the node knew (high, or its own hits
// if more) plus what the store counted since, n. The store counted the
// call after everything the node had acknowledged when it was sent (h0's
// mine), and it holds those but for what the node gave back since (gave,
// as it goes): a count below that, in the same window, is a loss. An
// answer of a window before the one the node knows is left out. mu is
// held.
func (e *leaseEntry) counted(st sluice.State, ok bool, cost int64, h0 heldSent) (restore int64) {
	if !ok || e.req.Limit.Algorithm != sluice.FixedWindow {
		return 0
	}
	h := &e.held
	w, n, _ := st.Fields()
	switch {
	case w < h.win:
		return 0
	case w > h.win:
		*h = heldCount{win: w}
	}
	if h0.win == w && n < h0.mine-h.gave {
		restore = max(h.high, h.mine-h.gave) + n
		h.high = restore
	}
	h.high = max(h.high, n)
	h.mine += cost
	return restore
}

func newLeases(bytes int64, lifetime time.Duration, maxLease int64) *leases {
	ls := &leases{seed: maphash.MakeSeed(), budget: max(bytes/leaseShards, 1), lifetime: lifetime, maxLease: maxLease}
	for i := range ls.shards {
		ls.shards[i].m = make(map[string]*leaseEntry)
	}
	return ls
}

func (ls *leases) shard(key string) *leaseShard {
	return &ls.shards[maphash.String(ls.seed, key)%leaseShards]
}

// most returns the largest lease of l: MaxLease, and at most a sixteenth
// of the capacity, so that a few nodes' leases leave the store most of a
// quota; a quarter on a window limit whose window is at most
// shortWindow lifetimes. Such a lease ends with its window, which comes
// before a lifetime of history could shrink it, so what it holds unused
// is held for less than a window; a sixteenth of 100 a second is 6 hits,
// and a hot key of a per-second limit went to the store every 6 of them.
func (ls *leases) most(l sluice.Limit) int64 {
	part := int64(16)
	if !l.Algorithm.HasBurst() && l.Period <= shortWindow*ls.lifetime {
		part = 4
	}
	return max(min(ls.maxLease, l.Capacity()/part), 1)
}

// shortWindow is how many lease lifetimes a window limit's window spans at
// most for its leases to be a quarter of its capacity (most): 2 s at the
// default lifetime, so per-second limits.
const shortWindow = 4

// demand returns the hits e's key can be expected to ask for on this node
// over what is left of a lease taken at now: its hits in a lifetime (the
// larger of the last sizing, e.size, and the current count's rate once it
// holds minLease hits, over at least a sixteenth of a lifetime) times the
// share of a lifetime the lease can last, until the end of a window
// limit's window on the store's clock as the last grant read it (the
// node's before any). At most most(l); e.size keeps the rate. mu is
// held.
func (ls *leases) demand(e *leaseEntry, now time.Time) int64 {
	l := e.req.Limit
	perLife := float64(e.size)
	if e.count >= minLease {
		el := max(now.Sub(e.since), ls.lifetime/16)
		perLife = max(perLife, float64(e.count)*float64(ls.lifetime)/float64(el))
		e.size = min(int64(perLife), ls.most(l)) // a key gone hot within the lifetime
	}
	share := 1.0
	if !l.Algorithm.HasBurst() {
		sn := now.UnixMicro()
		if e.gat != 0 {
			sn = e.storeNow(now)
		}
		p := l.Period.Microseconds()
		share = min(float64(p-sn%p)/float64(ls.lifetime.Microseconds()), 1)
	}
	return min(int64(math.Ceil(perLife*share)), ls.most(l))
}

// minLease is the smallest lease worth its grant and its return: a key
// that sees fewer hits in a lifetime goes to the store.
const minLease = 4

// observe counts cost hits of e at now and, once a lifetime has passed
// since the count began, sizes the next lease to the hits of that
// lifetime: a lease lasts about a lifetime at the key's local rate. A key
// the store denied (its near cache answering meanwhile) keeps its size
// for its next window. mu is held.
func (ls *leases) observe(e *leaseEntry, now time.Time, cost int64) {
	if now.Sub(e.since) >= ls.lifetime {
		switch {
		case now.Sub(e.since) < 2*ls.lifetime:
			e.size = max(e.size, min(e.count, ls.most(e.req.Limit)))
		case now.Sub(e.denied) >= ls.lifetime: // idle for a lifetime or more: start over
			e.size = 0
		}
		e.since, e.count = now, 0
	}
	e.count += cost
}

// ended reports whether e's lease is over at now: its window has ended,
// or its life (ls.life) has and the key has not been seen for as long (a
// busy key's lease lives on until used up). mu is held.
func (ls *leases) ended(e *leaseEntry, now time.Time) bool {
	return !now.Before(e.end) || (!now.Before(e.until) && now.Sub(e.seen) >= ls.life(e.req.Limit))
}

// life returns how long a lease of l lives on without a request before it
// ends and its unused hits go back: the lifetime, and at most a quarter
// of a window limit's period, so that a node whose key stops asking
// leaves most of a short window's hits to the others (250 ms of a
// per-second limit; the sweep, every half lifetime, gives them back).
func (ls *leases) life(l sluice.Limit) time.Duration {
	if l.Algorithm.HasBurst() {
		return ls.lifetime
	}
	return max(min(ls.lifetime, l.Period/4), time.Millisecond)
}

// minTime returns the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// returning is a lease's unused part on its way back to the store.
type returning struct {
	req   sluice.Request
	grant sluice.State // the key's state as the lease's grant left it
}

// storeNow returns the latest instant of the store's clock that now, on
// the node's, can be: the grant's instant plus the time since the grant
// was asked for, rounded up to µs. The clocks are taken to advance at the
// same rate.
func (e *leaseEntry) storeNow(now time.Time) int64 {
	return e.gat + (max(now.Sub(e.at), 0) + time.Microsecond - 1).Microseconds()
}

// take admits cost hits of e's lease at now if it can, and returns the
// decision. A window's lease admits while it has the hits; a bucket's only
// by the due instant of its next hit (sluice.Limit.LeaseTake, on the
// store's clock as storeNow reads it), and a leaky_bucket's Wait is the
// time until the hit's slot on the store's clock as early as now can be
// on it (the grant's round trip more than storeNow's). mu is held.
func (e *leaseEntry) take(now time.Time, cost int64) (sluice.Decision, bool) {
	l := e.req.Limit
	if !l.Algorithm.HasBurst() {
		e.left -= cost
		return e.decision(now), true
	}
	d, ok := l.LeaseTake(e.st, e.left, e.storeNow(now), cost)
	if !ok {
		return d, false
	}
	e.left -= cost
	e.due()
	if l.Algorithm == sluice.LeakyBucket {
		d.Wait += e.rtt
	}
	return d, true
}

// due sets e.end, for a bucket's lease, to just past the due instant of
// its next hit on the node's clock: the instant storeNow reads it at.
// mu is held.
func (e *leaseEntry) due() {
	if e.left == 0 {
		e.end = e.at
		return
	}
	due, ok := e.req.Limit.LeaseDue(e.st, e.left)
	if !ok || due < e.gat {
		e.end = e.at
		return
	}
	e.end = e.at.Add(time.Duration(due-e.gat)*time.Microsecond + 1)
}

// decision returns what a window's lease decides on a request it admits
// at now.
func (e *leaseEntry) decision(now time.Time) sluice.Decision {
	capa := e.req.Limit.Capacity()
	return sluice.Decision{
		Allowed:    true,
		Limit:      capa,
		Remaining:  min(max(e.grant.Remaining+e.left, 0), capa),
		ResetAfter: max(e.grant.ResetAfter-now.Sub(e.at), 0),
	}
}

// end ends e's lease at now if it has one, adjusting the next size to
// how it was used, and returns its unused part, if any. mu is held.
func (ls *leases) end(e *leaseEntry, now time.Time) (returning, bool) {
	if e.granted == 0 {
		return returning{}, false
	}
	switch {
	case e.left <= e.granted/4 && now.Before(e.until): // used up early: a hot key
		e.size = min(2*e.size, ls.most(e.req.Limit))
	case 2*e.left > e.granted: // mostly unused
		e.size /= 2
	}
	r := returning{e.req, e.st}
	r.req.Cost = e.left
	e.left, e.granted = 0, 0
	if e.window == e.held.win && e.req.Limit.Algorithm == sluice.FixedWindow {
		e.held.gave += r.req.Cost
	}
	return r, r.req.Cost > 0
}

// usable returns how many hits a lease of e's bucket limit taken at now
// can expect to admit by their due instants (sluice.Limit.LeaseDue): the
// i-th is due about drained − now + i × T after the grant (T = period /
// rate; the store's bucket is last known to be empty at drained, and the
// grant's slots start then or later), and the key's hits come about every
// lifetime / size, or faster as counted in the current lifetime once it
// has seen minLease hits. A key whose local rate is at least the limit's
// uses any lease in time; a slower one only what the bucket's backlog
// gives it time for. mu is held.
func (ls *leases) usable(e *leaseEntry, now time.Time) int64 {
	l := e.req.Limit
	// intervals in ns: the key's between hits, the limit's T
	gap := float64(ls.lifetime) / float64(max(e.size, 1))
	if el := now.Sub(e.since); e.count >= minLease && float64(el)/float64(e.count-1) < gap {
		gap = float64(el) / float64(e.count-1) // count hits, count − 1 gaps
	}
	T := float64(l.Period) / float64(l.Rate)
	if gap <= T {
		return math.MaxInt64
	}
	slack := float64(max(e.drained.Sub(now), 0))
	return int64(min(slack/(gap-T), float64(math.MaxInt32))) + 1
}

// seen keeps what the store's decision d on a request of e's key sent at
// sent tells the next lease: when a bucket limit's bucket is empty
// (usable), and until when a denial holds (observe). e is the key's
// entry, or nil.
func (s *Store) seen(sh *leaseShard, key string, e *leaseEntry, d sluice.Decision, err error, sent time.Time) {
	if e == nil || err != nil || d.Allowed && !e.req.Limit.Algorithm.HasBurst() {
		return
	}
	sh.mu.Lock()
	if sh.m[key] == e {
		e.seenLocked(d, sent)
	}
	sh.mu.Unlock()
}

// seenLocked is seen with mu held.
func (e *leaseEntry) seenLocked(d sluice.Decision, sent time.Time) {
	if e.req.Limit.Algorithm.HasBurst() {
		e.drained = sent.Add(d.ResetAfter)
	}
	if !d.Allowed {
		e.denied = sent.Add(d.RetryAfter)
	}
}

// takeLease decides r, a request of a leasable limit, in lease mode. A
// request that finds a grant of its key in flight waits for it, once.
func (s *Store) takeLease(ctx context.Context, r sluice.Request, now time.Time) (sluice.Decision, error) {
	for wait := true; ; wait = false {
		d, inFlight, err := s.tryLease(ctx, r, now, wait)
		if inFlight == nil {
			return d, err
		}
		select {
		case <-inFlight:
		case <-ctx.Done():
			return sluice.Decision{}, fmt.Errorf("localfirst take %s: %w", r.Key, ctx.Err())
		}
		now = s.now()
	}
}

// sameLimit reports whether a and b are requests of one key, group and
// limit: what an entry of the lease or async table stands for.
func sameLimit(a, b sluice.Request) bool {
	return a.Key == b.Key && a.Group == b.Group && a.Limit == b.Limit
}

// tryLease is takeLease's one attempt: when wait is set and a grant of the
// key is in flight, it returns that grant's channel instead of deciding.
// It decides from the lease the node holds, or says what the request
// needs (leaseStep); asks the store for a lease (grantLease); and keeps
// what the store granted (landGrant).
func (s *Store) tryLease(ctx context.Context, r sluice.Request, now time.Time, wait bool) (sluice.Decision, chan struct{}, error) {
	sh := s.leases.shard(r.Key)
	sh.mu.Lock()
	st := s.leaseStep(sh, r, now, wait)
	if st.e != nil {
		st.h0 = st.e.held.sent()
	}
	sh.mu.Unlock()
	switch st.next {
	case leased:
		s.leaseHits.Add(1)
		return st.d, nil, nil
	case leaseWait:
		return sluice.Decision{}, st.inFlight, nil
	case leaseExact:
		s.giveBack(ctx, st.back)
		d, err := s.exactHeld(ctx, r, now, sh, st.e, st.h0)
		s.seen(sh, r.Key, st.e, d, err, now)
		return d, nil, err
	}
	s.giveBack(ctx, st.back)
	g := s.grantLease(ctx, r, st.want)
	out, granted, restore := s.landGrant(sh, st.e, r, now, g, st.h0)
	key, l := r.Key, r.Limit
	if restore > 0 {
		s.putBack(ctx)
		if g.d.Allowed && restore > l.Capacity() {
			// Over its limit with what the store lost: a denial, and no
			// lease (landGrant). The grant's hits are in the count put
			// back.
			return overLimit(g.d), nil, nil
		}
		g.d.Remaining = max(min(g.d.Remaining, l.Capacity()-restore), 0)
	}
	switch {
	case g.err != nil:
		return sluice.Decision{}, nil, g.err
	case granted:
		if s.near != nil { // a denial this node knew of is over
			s.near.drop(key)
		}
		return out, nil, nil
	case g.d.Allowed && g.want > r.Cost && g.ok:
		// granted, but the key's entry moved on meanwhile (the rules
		// changed): the surplus goes back
		s.giveBack(ctx, []returning{{sluice.Request{Key: key, Group: r.Group, Limit: l, Cost: g.want - r.Cost}, g.st}})
	case !g.d.Allowed && g.want > r.Cost && !g.ok:
		// no state to answer this request from
		d, err := s.exact(ctx, r, now)
		return d, nil, err
	}
	s.learn(r, g.d, g.st, g.at, g.ok, now)
	return g.d, nil, nil
}

// leaseNext is what a request of a lease key needs after leaseStep.
type leaseNext int

const (
	leased     leaseNext = iota // admitted from the node's lease
	leaseWait                   // a grant of the key is in flight: wait for it
	leaseExact                  // decided by the store, no lease
	leaseGrant                  // a lease of want hits is asked for (the entry's granting is set)
)

// leaseStepped is leaseStep's answer.
type leaseStepped struct {
	next     leaseNext
	d        sluice.Decision // leased's decision
	inFlight chan struct{}   // leaseWait's grant
	e        *leaseEntry     // the key's entry, nil when the table is full
	back     []returning     // a lease that ended, to give back first
	want     int64           // leaseGrant's size
	h0       heldSent        // what the store's answer is checked against (counted)
}

// leaseStep decides r at now from the lease the node holds on its key,
// or says what it needs: a key seen once goes to the store; with wait, a
// grant in flight is waited for; a key whose demand calls for a lease
// asks for one (and its entry's granting is set), and one whose does not
// goes to the store. sh holds r's key; mu is held.
func (s *Store) leaseStep(sh *leaseShard, r sluice.Request, now time.Time, wait bool) leaseStepped {
	ls := s.leases
	key, l, cost := r.Key, r.Limit, r.Cost
	id := sluice.Request{Key: r.Key, Group: r.Group, Limit: r.Limit} // the entry's request
	e := sh.m[key]
	if e == nil {
		size := int64(len(key)) + leaseOverhead
		if sh.bytes+size <= ls.budget || sh.evict(now, ls.lifetime, size, ls.budget) {
			sh.m[key] = &leaseEntry{req: id, seen: now, since: now, count: cost}
			sh.bytes += size
		}
		return leaseStepped{next: leaseExact, e: sh.m[key]} // a key seen once goes to the store
	}
	if !sameLimit(e.req, id) { // the rules changed: a new lease of the new limit
		if back, ok := ls.end(e, now); ok {
			s.pending(back)
		}
		e.req, e.size, e.held = id, 0, heldCount{}
	}
	ls.observe(e, now, cost)
	if e.granted > 0 && e.left >= cost && !ls.ended(e, now) {
		if d, ok := e.take(now, cost); ok {
			if !now.Before(e.until) { // busy: a lifetime more
				e.until = minTime(now.Add(ls.life(l)), e.end)
			}
			e.seen = now
			return leaseStepped{next: leased, d: d, e: e}
		}
	}
	if e.granting != nil && wait {
		return leaseStepped{next: leaseWait, inFlight: e.granting, e: e}
	}
	st := leaseStepped{next: leaseGrant, e: e}
	if b, ok := ls.end(e, now); ok {
		st.back = append(st.back, b)
	}
	e.seen = now
	st.want = max(ls.demand(e, now), cost)
	if l.Algorithm.HasBurst() {
		st.want = min(st.want, ls.usable(e, now))
	}
	if e.granting != nil || st.want < minLease {
		st.next = leaseExact
		return st
	}
	e.granting = make(chan struct{})
	return st
}

// granted is the store's answer to a lease asked for: its decision on
// want hits, the state it left, its instant (µs), whether it has the
// state, and its error.
type granted struct {
	want  int64
	d     sluice.Decision
	st    sluice.State
	at    int64
	ok    bool
	err   error
	back0 time.Time // when the answer came back, by the node's clock
}

// grantLease asks the store for a lease of want hits for r. When the
// store has less left than want, it decides r alone at the same instant
// from the state the denial left, and a window's lease then takes what is
// left, a bucket's half of it.
func (s *Store) grantLease(ctx context.Context, r sluice.Request, want int64) granted {
	l, cost := r.Limit, r.Cost
	g := r
	g.Cost = want
	d, st, at, ok, err := s.stater.TakeState(ctx, g)
	s.calls.Add(1)
	if err == nil && !d.Allowed && ok && want > cost {
		// The store has less than the lease left. What it decides on this
		// request alone, at the same instant: a denial leaves the state as
		// it was, so a replay on it is the store's own answer.
		alone := st
		if da := l.TakeMicros(&alone, at, cost); !da.Allowed {
			d = da
		} else {
			// A window's lease takes what is left: its key asked for more
			// on this node, and the window ends soon. A bucket's takes
			// half, so that other nodes find some before it refills.
			g.Cost = max(cost, d.Remaining)
			if l.Algorithm.HasBurst() {
				g.Cost = max(cost, d.Remaining/2)
			}
			want = g.Cost
			d, st, at, ok, err = s.stater.TakeState(ctx, g)
			s.calls.Add(1)
		}
	}
	return granted{want: want, d: d, st: st, at: at, ok: ok, err: err, back0: s.now()}
}

// landGrant keeps in e, r's entry, the lease g the store granted at the
// node's now, or what its denial says, ends the grant in flight, and
// returns r's decision from the lease and whether there is one: none when
// the store denied, erred or had no state, or when e moved on to other
// rules meanwhile.
func (s *Store) landGrant(sh *leaseShard, e *leaseEntry, r sluice.Request, now time.Time, g granted, h0 heldSent) (_ sluice.Decision, _ bool, restore int64) {
	ls, l := s.leases, r.Limit
	id := sluice.Request{Key: r.Key, Group: r.Group, Limit: r.Limit}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	close(e.granting)
	e.granting = nil
	if g.err == nil {
		e.seenLocked(g.d, now)
	}
	if g.err == nil && sameLimit(e.req, id) {
		var cost int64
		if g.d.Allowed {
			cost = g.want
		}
		if restore = e.counted(g.st, g.ok, cost, h0); restore > 0 {
			if restore > l.Capacity() {
				return sluice.Decision{}, false, restore // no lease: over the limit
			}
			g.d.Remaining = min(g.d.Remaining, l.Capacity()-restore)
		}
	}
	if g.err != nil || !g.d.Allowed || !g.ok || g.want <= r.Cost || !sameLimit(e.req, id) {
		if g.err == nil && !g.d.Allowed && l.Algorithm.HasBurst() {
			// a drained bucket refills slowly; a window's next one is whole
			e.size = max(e.size/2, 1)
		}
		return sluice.Decision{}, false, restore
	}
	e.granted, e.left, e.grant, e.st, e.gat, e.at, e.rtt = g.want, g.want-r.Cost, g.d, g.st, g.at, now, g.back0.Sub(now)
	var out sluice.Decision
	if l.Algorithm.HasBurst() {
		// the request is the lease's first hit, at the grant's instant
		var ok bool
		if out, ok = l.LeaseTake(g.st, g.want, g.at, r.Cost); !ok {
			out = g.d // a state no bucket of l leaves: the grant's own decision
		}
		e.window = 0
		e.due()
	} else {
		p := l.Period.Microseconds()
		e.window = g.at - g.at%p
		e.end = now.Add(time.Duration(e.window+p-g.at) * time.Microsecond)
		out = e.decision(now)
	}
	e.until = minTime(now.Add(ls.life(l)), e.end)
	s.grants.Add(1)
	return out, true, restore
}

// exact decides r by the store, through the near cache.
func (s *Store) exact(ctx context.Context, r sluice.Request, now time.Time) (sluice.Decision, error) {
	s.calls.Add(1)
	d, st, at, ok, err := s.stater.TakeState(ctx, r)
	if err != nil {
		return d, err
	}
	s.learn(r, d, st, at, ok, now)
	return d, nil
}

// exactHeld decides r by the store, as exact does, and keeps in e, r's
// entry in sh (or nil), what the answer tells of the key's count, sent on
// h0 (counted): an answer that shows the store lost the key puts back what
// the node holds at once, and is a denial if the count with what was lost
// is over the limit.
func (s *Store) exactHeld(ctx context.Context, r sluice.Request, now time.Time, sh *leaseShard, e *leaseEntry, h0 heldSent) (sluice.Decision, error) {
	if e == nil {
		return s.exact(ctx, r, now)
	}
	s.calls.Add(1)
	d, st, at, ok, err := s.stater.TakeState(ctx, r)
	if err != nil {
		return d, err
	}
	var cost, restore int64
	if d.Allowed {
		cost = r.Cost
	}
	sh.mu.Lock()
	if sh.m[r.Key] == e && sameLimit(e.req, sluice.Request{Key: r.Key, Group: r.Group, Limit: r.Limit}) {
		restore = e.counted(st, ok, cost, h0)
	}
	sh.mu.Unlock()
	if restore > 0 {
		s.putBack(ctx)
		if c := r.Limit.Capacity(); d.Allowed && restore > c {
			d, ok = overLimit(d), false // the state says nothing of the count lost
		} else {
			d.Remaining = max(min(d.Remaining, c-restore), 0)
		}
	}
	s.learn(r, d, st, at, ok, now)
	return d, nil
}

// overLimit returns d, a store's admission on a count it lost, as the
// denial it is once what it lost is counted: nothing left until the
// window's end.
func overLimit(d sluice.Decision) sluice.Decision {
	d.Allowed, d.Remaining, d.RetryAfter = false, 0, d.ResetAfter
	return d
}

// putBack puts back, merged by maximum, every count the node holds
// (restore), the store having lost some: at once, within
// putBackTimeout; one that fails is tried again at the next sweep.
func (s *Store) putBack(ctx context.Context) {
	s.lost()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), putBackTimeout)
	defer cancel()
	_ = s.restoreIfLost(ctx)
}

// putBackTimeout bounds a put back that a request waits for.
const putBackTimeout = time.Second

// evict makes room for size bytes in a full shard by forgetting keys
// without a lease that have not been seen for a lifetime, at random, and
// reports whether it did. mu is held.
func (sh *leaseShard) evict(now time.Time, lifetime time.Duration, size, budget int64) bool {
	for k, e := range sh.m {
		if sh.bytes+size <= budget {
			break
		}
		if e.granted == 0 && e.granting == nil && now.Sub(e.seen) >= lifetime {
			delete(sh.m, k)
			sh.bytes -= int64(len(k)) + leaseOverhead
		}
	}
	return sh.bytes+size <= budget
}

// pending queues r for the next ReturnExpired.
func (s *Store) pending(r returning) {
	s.pendMu.Lock()
	s.pend = append(s.pend, r)
	s.pendMu.Unlock()
}

// giveBack returns leases' unused hits to the store. A return that fails
// leaves them taken: fewer admitted, never more.
func (s *Store) giveBack(ctx context.Context, back []returning) {
	if len(back) == 0 {
		return
	}
	reqs, grants := make([]sluice.Request, len(back)), make([]sluice.State, len(back))
	for i, r := range back {
		reqs[i], grants[i] = r.req, r.grant
	}
	s.calls.Add(1)
	n, err := s.leaser.ReturnLeases(context.WithoutCancel(ctx), reqs, grants)
	s.returned.Add(uint64(max(n, 0)))
	if err != nil {
		s.returnErrors.Add(1)
	}
}

// ReturnExpired gives back to the store the unused hits of every lease
// that has ended by now, and forgets keys not seen for two lifetimes. The
// Store calls it every half lifetime by itself; tests call it to end
// leases at an instant of their clock. With all set, it ends every lease,
// ended or not (Close does).
func (s *Store) ReturnExpired(ctx context.Context) error {
	return s.returnLeases(ctx, false)
}

func (s *Store) returnLeases(ctx context.Context, all bool) error {
	if s.leases == nil {
		return nil
	}
	now := s.now()
	s.pendMu.Lock()
	back := s.pend
	s.pend = nil
	s.pendMu.Unlock()
	ls := s.leases
	for i := range ls.shards {
		sh := &ls.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.granting != nil {
				continue
			}
			if e.granted > 0 && (all || ls.ended(e, now)) {
				if r, ok := ls.end(e, now); ok {
					back = append(back, r)
				}
			}
			if e.granted == 0 && now.Sub(e.seen) >= 2*ls.lifetime {
				delete(sh.m, k)
				sh.bytes -= int64(len(k)) + leaseOverhead
			}
		}
		sh.mu.Unlock()
	}
	before := s.returnErrors.Load()
	s.giveBack(ctx, back)
	if s.returnErrors.Load() != before {
		return fmt.Errorf("localfirst: returning %d leases failed", len(back))
	}
	return s.restoreIfLost(ctx) // a put back that failed (putBack)
}

// sweep calls ReturnExpired every half lifetime until stop is closed.
func (s *Store) sweep(stop <-chan struct{}, done chan<- struct{}) {
	every(stop, done, max(s.leases.lifetime/2, time.Millisecond), max(s.leases.lifetime, time.Second), s.ReturnExpired) // errors counted in Stats.ReturnErrors
}

// wroteLeases counts, in the heldCount of each fixed_window lease key of
// reqs the node holds in the window windows[i], the reqs[i].Cost hits
// written to the store beneath it (Wrote): the store holds them, and a
// count below them there is a loss.
func (s *Store) wroteLeases(reqs []sluice.Request, windows []int64) {
	if s.leases == nil {
		return
	}
	for i, r := range reqs {
		if r.Cost <= 0 || r.Limit.Algorithm != sluice.FixedWindow {
			continue
		}
		sh := s.leases.shard(r.Key)
		sh.mu.Lock()
		if e := sh.m[r.Key]; e != nil && sameLimit(e.req, r) && e.held.win == windows[i] {
			e.held.mine += r.Cost
		}
		sh.mu.Unlock()
	}
}
