// Package localfirst decorates a sluice.Store (store/redis) so that
// decisions leave the request's critical path, each mode with its bound;
// docs/sync-modes.md has the arguments. sliding_log is always decided by
// the store.
//
// Near cache (a Stater store): a key the store denied is answered from
// memory until its retry time, by the algorithm replayed on the state the
// denial left: the store's verdict, exactly. At most Config.NearCacheBytes.
//
// Lease (Config.Sync, or a request's Sync; a Leaser store): a node takes
// part of a hot key's quota in one store call and admits from it. Never
// over the limit (on a bucket, every sequence admitted is one the exact
// algorithm admits); under it by at most the leases outstanding, each at
// most min(Config.MaxLease, capacity / 16), or capacity / 4 on a window
// limit whose window is at most 4 lease lifetimes (a per-second limit).
// Within that, a lease is the key's demand on the node until it ends: its
// hits in a lifetime (sooner, the rate of its first 4), times the share of
// a lifetime left in a window limit's window. A lease whose key stops
// asking ends after a lifetime, a window limit's after a quarter of its
// period at most, and its unused hits go back.
//
// Async (a Syncer store): no store call on a decision but a key's first;
// each node admits from its share and writes its hits back every
// I = Config.SyncInterval. With k = Config.AsyncShare and N the servers
// counted (each heartbeats in the store, a Heartbeater; at least
// Config.AsyncNodes), a node's allowance on a window limit is what is
// left spread over the nodes and the syncs left in the window,
// (rate − counted) / (N × D) with D = min(⌈time left / I⌉ + ¼, k), so a
// hot key fills its limit over the window as exact mode does. A node goes
// on admitting while a sync is in flight, and a request that finds its
// share spent while the count last read leaves room (a bucket's: while at
// most half full) syncs its key at once or waits for the sync in flight,
// and after 4 shares taken by concurrent requests is decided by the
// store: a window key's request is denied only when the store's count has
// no room for it. A window
// admits at most rate + the N nodes' last allowances before the store's
// count reaches the rate: on a window of k intervals or more whose count
// reaches the rate before its last k,
//
//	rate + N × max(⌊rate / (N × k)⌋, 1)
//
// (limits whose first allowance is under a hit are decided exactly); on
// shorter ones, with each node syncing once an interval, at most
// (N − 1) / N × A / 1¼ + N / 2 over, A what the nodes admitted in the
// interval before (about rate × I / period on a hot key). A bucket limit,
// in any interval of length d, at most
//
//	capacity + rate × d / period + max(capacity / k + rate × I / period, N)
//
// while every server counts all those running; within one interval of a
// server joining, the others may still share among fewer.
//
// With the store unreachable, a node admits what its lease, allowance or
// grant still holds, then returns errors for the caller's fail mode. A
// store that comes back empty (a Restorer) is given back the window
// counts the node holds, merged by maximum, once an async sync reads a
// fixed_window count below what the node had read in that window, or a
// lease key's grant or store decision reads one below the hits the node's
// own grants and decisions added in that window (less those its leases
// gave back). The
// store decides by its own clock; the Store measures elapsed time by
// Config.Now.
package localfirst

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Stater is an optional interface of a sluice.Store that can hand back
// the state a decision left. store/redis implements it.
type Stater interface {
	// TakeState decides r as TakeAll does a batch of one, and also
	// returns the key's state after the decision and the instant of the
	// store's clock it decided at, in µs since the Unix epoch. ok is false
	// when the store has no such state for the request (a sliding_log, a
	// request decided without the store); the state and instant are then
	// meaningless.
	TakeState(ctx context.Context, r sluice.Request) (d sluice.Decision, st sluice.State, now int64, ok bool, err error)
}

// Config configures a Store. The zero value of each field means its
// default.
type Config struct {
	// NearCacheBytes bounds the memory the near cache holds, keys
	// included (default 8 MiB). Negative turns the near cache off.
	NearCacheBytes int64
	// Sync is how decisions reach the store (default Exact), for requests
	// whose own Sync is sluice.DefaultSync or when RequestSync is off.
	Sync Sync
	// RequestSync makes a request's own Sync (a rule's sync), when not
	// sluice.DefaultSync, choose its mode; lease and async mode are then
	// ready whatever Sync is. Default off: Sync decides every request.
	RequestSync bool
	// LeaseLifetime is how long a lease lasts (default 500ms), and longer
	// while its key keeps asking; a lease also ends with its window, and a
	// window limit's whose key stops asking after a quarter of the period
	// at most (250ms of a per-second limit). Its
	// size follows the key's hits in a lifetime (over what is left of a
	// window limit's window, when less); a longer one spares store
	// calls on keys of a slow, steady rate and holds unused quota away
	// from other nodes longer.
	LeaseLifetime time.Duration
	// MaxLease is the most hits one lease carries (default 1000); a lease
	// is also at most a sixteenth of its limit's capacity, or a quarter on
	// a window of at most 4 lease lifetimes.
	MaxLease int64
	// LeaseBytes bounds the memory of the lease table, and that of the
	// async table, keys included (default 8 MiB each); keys that find one
	// full are decided by the store.
	LeaseBytes int64
	// SyncInterval is how often async mode writes a node's hits back and
	// reads the counts (default 100ms); a bucket's grant holds at most
	// its refill over one SyncInterval.
	SyncInterval time.Duration
	// AsyncNodes is the fewest servers async mode shares among (default
	// 1): N is the servers that heartbeat in the store (Heartbeater), at
	// least this. Each node admits between syncs at most
	// (rate − counted) / (N × D) of a window limit, D the syncs left in
	// the window and a quarter, at most AsyncShare; and of a
	// bucket limit at most what was free over N × AsyncShare and 1/N of
	// its refill (see the package documentation). A floor for the
	// interval after servers join, before the others have counted them,
	// and for a store that cannot count (one without Heartbeater).
	AsyncNodes int64
	// AsyncShare is k in that bound (default 50: at most 2% over on a
	// window of k intervals or more). Larger k overshoots less and fills
	// a long window (a bucket's burst) more slowly: there the nodes admit
	// about 1/k of what is left per SyncInterval; in a window's last k
	// intervals they admit what is left spread over the intervals left.
	AsyncShare int64
	// Now is the clock the Store measures time with (default time.Now).
	// Only differences of its readings matter.
	Now func() time.Time
	// Backend is the store whose abilities the near cache, leases and
	// async mode use (Stater, Leaser, Syncer, Heartbeater): store/redis's
	// Store, found once where the layers are composed. Default nil: next,
	// the store the layer decorates. With a layer between them (the
	// regions layer), requests still reach that layer through next's
	// TakeAll; Backend serves those Direct leaves to this layer.
	Backend sluice.Store
	// Direct reports whether a request goes straight to next's TakeAll,
	// never answered from the near cache, a lease or async mode: the
	// requests a layer under this one decides itself (store/regions's
	// Decides). Default nil: none.
	Direct func(sluice.Request) bool
	// Logger says when the layer puts back counts the store lost (an
	// async sync or a lease key's answer found the loss). Default
	// slog.Default().
	Logger *slog.Logger

	// syncByHand leaves async mode's syncs to calls of SyncAsync, for
	// tests whose injected clock a sync loop on real time would race.
	syncByHand bool
}

// DefaultConfig returns the default configuration: what every zero field
// of a Config means.
func DefaultConfig() Config {
	return Config{
		NearCacheBytes: defaultNearCacheBytes, // 8 MiB of denials
		Sync:           Exact,                 // every decision reaches the store
		LeaseLifetime:  defaultLeaseLifetime,  // 500ms
		MaxLease:       defaultMaxLease,       // 1000 hits
		LeaseBytes:     defaultLeaseBytes,     // 8 MiB each for leases and async
		SyncInterval:   defaultSyncInterval,   // 100ms
		AsyncNodes:     defaultAsyncNodes,     // no floor beyond the servers counted
		AsyncShare:     defaultAsyncShare,     // at most 2% over
		Now:            time.Now,
		Logger:         slog.Default(),
		// RequestSync: off; Backend: nil, next; Direct: nil, none
	}
}

// The defaults of Config's fields.
const (
	// defaultNearCacheBytes is NearCacheBytes's default: 8 MiB, about
	// 40,000 denied keys of 30 bytes.
	defaultNearCacheBytes = 8 << 20
	// defaultLeaseLifetime is LeaseLifetime's default: within the 100 ms
	// to 1 s that keeps a dead node's unused leases short-lived.
	defaultLeaseLifetime = 500 * time.Millisecond
	// defaultMaxLease is MaxLease's default.
	defaultMaxLease = 1000
	// defaultLeaseBytes is LeaseBytes's default: 8 MiB, about 15,000 leased
	// keys of 30 bytes.
	defaultLeaseBytes = 8 << 20
	// defaultSyncInterval is SyncInterval's default.
	defaultSyncInterval = 100 * time.Millisecond
	// defaultAsyncNodes is AsyncNodes's default: no floor beyond the
	// servers counted.
	defaultAsyncNodes = 1
	// defaultAsyncShare is AsyncShare's default: overshoot at most 2%.
	defaultAsyncShare = 50
)

// Store is a sluice.Store that decorates another with the near cache and,
// in lease mode, leases. It is safe for concurrent use. In lease mode it
// runs one goroutine that returns ended leases; Close stops it.
type Store struct {
	next        sluice.Store
	stater      Stater                    // Config.Backend's, or nil: then neither near cache nor leases
	direct      func(sluice.Request) bool // Config.Direct, or nil
	leaser      Leaser                    // next's in lease mode, or nil
	now         func() time.Time
	sync        Sync
	requestSync bool       // Config.RequestSync
	near        *nearCache // nil when off
	leases      *leases    // nil unless lease mode
	async       *asyncTable
	syncer      Syncer      // next's when async mode may be used, or nil
	beater      Heartbeater // next's when async mode may be used, or nil
	restorer    Restorer    // next's, or nil: counts the store lost stay lost
	lostCounts  atomic.Bool // the store was seen to have lost counts since the last restore
	restored    atomic.Uint64
	id          string // this node's ID among the servers that heartbeat
	log         *slog.Logger

	syncEvery time.Duration
	asyncHits atomic.Uint64

	hits, misses atomic.Uint64 // the near cache's
	leaseHits    atomic.Uint64
	grants       atomic.Uint64
	returned     atomic.Uint64
	returnErrors atomic.Uint64
	calls        atomic.Uint64

	pendMu sync.Mutex
	pend   []returning // unused hits to return at the next sweep

	stop      chan struct{}
	done      chan struct{} // the lease sweeper's
	asyncDone chan struct{} // the async sync loop's
	once      sync.Once
}

var (
	_ sluice.Store        = (*Store)(nil)
	_ sluice.LimitChecker = (*Store)(nil)
)

// New returns next decorated as cfg says. The near cache needs next to be
// a Stater and lease mode a Leaser; over any other store they stay off
// and every call goes to next.
func New(next sluice.Store, cfg Config) (*Store, error) {
	if next == nil {
		return nil, errors.New("localfirst: no store")
	}
	if cfg.Sync > Async {
		return nil, fmt.Errorf("localfirst: unknown sync mode %d", cfg.Sync)
	}
	if cfg.LeaseLifetime < 0 || cfg.MaxLease < 0 || cfg.LeaseBytes < 0 || cfg.SyncInterval < 0 || cfg.AsyncNodes < 0 || cfg.AsyncShare < 0 {
		return nil, errors.New("localfirst: LeaseLifetime, MaxLease, LeaseBytes, SyncInterval, AsyncNodes and AsyncShare must not be negative")
	}
	d := DefaultConfig()
	setDefault(&cfg.SyncInterval, d.SyncInterval)
	setDefault(&cfg.AsyncNodes, d.AsyncNodes)
	setDefault(&cfg.AsyncShare, d.AsyncShare)
	setDefault(&cfg.NearCacheBytes, d.NearCacheBytes)
	setDefault(&cfg.LeaseLifetime, d.LeaseLifetime)
	setDefault(&cfg.MaxLease, d.MaxLease)
	setDefault(&cfg.LeaseBytes, d.LeaseBytes)
	if cfg.Now == nil {
		cfg.Now = d.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = d.Logger
	}
	s := &Store{next: next, now: cfg.Now, sync: cfg.Sync, requestSync: cfg.RequestSync, syncEvery: cfg.SyncInterval,
		direct: cfg.Direct, log: cfg.Logger}
	backend := cfg.Backend
	if backend == nil {
		backend = next
	}
	st, ok := backend.(Stater)
	if !ok {
		return s, nil
	}
	s.stater = st
	s.restorer, _ = next.(Restorer)
	if cfg.NearCacheBytes > 0 {
		s.near = newNearCache(cfg.NearCacheBytes)
	}
	s.stop = make(chan struct{})
	if le, ok := backend.(Leaser); ok && (cfg.Sync == Lease || cfg.RequestSync) {
		s.leaser = le
		s.leases = newLeases(cfg.LeaseBytes, cfg.LeaseLifetime, cfg.MaxLease)
		s.done = make(chan struct{})
		go s.sweep(s.stop, s.done)
	}
	if sy, ok := backend.(Syncer); ok && (cfg.Sync == Async || cfg.RequestSync) {
		s.syncer = sy
		s.async = newAsyncTable(cfg.LeaseBytes, cfg.AsyncNodes, cfg.AsyncShare, cfg.SyncInterval)
		if hb, ok := backend.(Heartbeater); ok {
			s.beater, s.id = hb, rand.Text()
		}
		s.asyncDone = make(chan struct{})
		if cfg.syncByHand {
			close(s.asyncDone)
		} else {
			go s.syncLoop(s.stop, s.asyncDone)
		}
	}
	return s, nil
}

// every calls f every interval, each call within timeout, until stop is
// closed; then it closes done. f's errors are dropped: f counts them.
func every(stop <-chan struct{}, done chan<- struct{}, interval, timeout time.Duration, f func(context.Context) error) {
	defer close(done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			_ = f(ctx)
			cancel()
		}
	}
}

// Close returns every lease's unused hits to the store and writes back
// async mode's hits, within ctx's time, and stops the Store's goroutines;
// it does not close the decorated store. It is safe to call more than
// once.
func (s *Store) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		if s.stop == nil {
			return
		}
		close(s.stop)
		if s.done != nil {
			<-s.done
			err = s.returnLeases(ctx, true)
		}
		if s.asyncDone != nil {
			<-s.asyncDone
			err = errors.Join(err, s.syncAsync(ctx, false))
			if s.beater != nil && s.async.live.Load() > 0 { // no longer counted: its hits are written
				_, berr := s.beater.Heartbeat(ctx, s.id, 0)
				err = errors.Join(err, berr)
			}
		}
	})
	return err
}

// Stats are a Store's counters since New.
type Stats struct {
	// NearHits counts requests the near cache answered.
	NearHits uint64
	// NearMisses counts requests the near cache could not answer.
	NearMisses uint64
	// NearEntries and NearBytes are what the near cache holds now.
	NearEntries int
	NearBytes   int64
	// LeaseHits counts requests admitted from a lease without a store
	// call.
	LeaseHits uint64
	// AsyncDecisions counts requests decided in async mode, without a
	// store call.
	AsyncDecisions uint64
	// Grants counts leases taken; Returned the hits given back;
	// ReturnErrors the returns that failed (their hits stay taken).
	Grants, Returned, ReturnErrors uint64
	// StoreCalls counts the calls made to the decorated store: decisions,
	// grants and returns.
	StoreCalls uint64
	// Restored counts the counts of keys written back to a store that
	// had lost them (Restorer).
	Restored uint64
	// AsyncServers is N, the servers async mode shares its limits among
	// now: the most of those the store counts (Heartbeater) and
	// Config.AsyncNodes; 1 when async mode is off.
	AsyncServers int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{
		NearHits: s.hits.Load(), NearMisses: s.misses.Load(),
		LeaseHits: s.leaseHits.Load(), AsyncDecisions: s.asyncHits.Load(), Grants: s.grants.Load(),
		Returned: s.returned.Load(), ReturnErrors: s.returnErrors.Load(),
		StoreCalls: s.calls.Load(), Restored: s.restored.Load(), AsyncServers: 1,
	}
	if s.async != nil {
		st.AsyncServers = s.async.nodes()
	}
	if s.near != nil {
		st.NearEntries, st.NearBytes = s.near.size()
	}
	return st
}

// take decides r: from the near cache, a lease, or the store.
func (s *Store) take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if s.stater == nil || s.direct != nil && s.direct(r) {
		s.calls.Add(1)
		var ds [1]sluice.Decision
		err := s.next.TakeAll(ctx, []sluice.Request{r}, ds[:])
		return ds[0], err
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, fmt.Errorf("localfirst take %s: %w", r.Key, err)
	}
	now := s.now()
	if s.near != nil {
		if d, ok := s.near.lookup(r.Key, r.Limit, r.Cost, now); ok {
			s.hits.Add(1)
			return d, nil
		}
		s.misses.Add(1)
	}
	if s.leases != nil || s.async != nil {
		switch m := s.syncFor(r); {
		case r.Cost > 0 && m == Lease && s.leases != nil && s.leaser.CanLease(r.Limit):
			return s.takeLease(ctx, r, now)
		case m == Async && s.async != nil && s.syncer.Syncable(r.Limit) && s.async.fits(r.Limit):
			// A cost of 0 too: the store's count may stand over the
			// rate by the bound, where its Take of 0 would deny.
			return s.takeAsync(ctx, r, now)
		}
	}
	return s.exact(ctx, r, now)
}

// maxAsyncProduct bounds rate × period (µs) of a limit in async mode, as
// store/redis's SyncCounts does: larger ones decide exactly.
const maxAsyncProduct = 1 << 52

// syncFor returns r's mode.
func (s *Store) syncFor(r sluice.Request) Sync {
	if s.requestSync && r.Sync != sluice.DefaultSync {
		return r.Sync
	}
	return s.sync
}

// learn keeps what a store's decision on r says: a denial with its state
// goes into the near cache, an admission ends what the cache held.
func (s *Store) learn(r sluice.Request, d sluice.Decision, st sluice.State, at int64, ok bool, sent time.Time) {
	switch {
	case s.near == nil:
	case d.Allowed:
		if r.Cost > 0 {
			s.near.drop(r.Key)
		}
	case ok && r.Cost > 0 && d.RetryAfter > 0 && d.RetryAfter != sluice.Never:
		s.near.put(r.Key, &nearEntry{group: r.Group, limit: r.Limit, cost: r.Cost, state: st, at: at, sent: sent, until: sent.Add(d.RetryAfter)})
	}
}

// TakeAll applies every request if all of them are allowed and none of
// them otherwise, writing request i's decision to ds[i]. It implements
// sluice.Store. A batch of one request is decided as Take decides; a
// batch whose every request the near cache holds a denial for is
// answered from it; any other batch goes to the store.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if s.stater == nil {
		s.calls.Add(1)
		return s.next.TakeAll(ctx, reqs, ds)
	}
	if len(ds) < len(reqs) {
		return fmt.Errorf("localfirst take all: %d decisions for %d requests", len(ds), len(reqs))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("localfirst take all: %w", err)
	}
	if len(reqs) == 1 {
		var err error
		ds[0], err = s.take(ctx, reqs[0])
		return err
	}
	if s.near != nil {
		now := s.now()
		cached := len(reqs) > 0
		for i, r := range reqs {
			if ds[i], cached = s.near.lookup(r.Key, r.Limit, r.Cost, now); !cached {
				break
			}
		}
		if cached {
			s.hits.Add(uint64(len(reqs)))
			return nil
		}
		s.misses.Add(uint64(len(reqs)))
	}
	s.calls.Add(1)
	if err := s.next.TakeAll(ctx, reqs, ds); err != nil {
		return err
	}
	if s.near == nil {
		return nil
	}
	for i := range reqs {
		if !ds[i].Allowed {
			return nil // the batch consumed nothing
		}
	}
	for _, r := range reqs { // all were admitted: their keys' states moved
		if r.Cost > 0 {
			s.near.drop(r.Key)
		}
	}
	return nil
}

// CheckLimit implements sluice.LimitChecker: the decorated store's veto,
// if it has one.
func (s *Store) CheckLimit(l sluice.Limit) error {
	if c, ok := s.next.(sluice.LimitChecker); ok {
		return c.CheckLimit(l)
	}
	return nil
}

// NonBlocking reports whether the decorated store never blocks (see
// decide.NonBlocking): the near cache and leases do not change that.
func (s *Store) NonBlocking() bool {
	nb, ok := s.next.(interface{ NonBlocking() bool })
	return ok && nb.NonBlocking()
}

// Ready reports whether the decorated store can decide (see
// decide.Ready); a store without Ready always can.
func (s *Store) Ready() bool {
	r, ok := s.next.(interface{ Ready() bool })
	return !ok || r.Ready()
}

// setDefault sets *v to def when it is zero.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
