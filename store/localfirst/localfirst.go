// Package localfirst decorates a sluice.Store so that decisions leave the
// request's critical path where that costs no exactness.
//
// The near cache: when the store denies a key and says when a request of
// that cost could pass again (Decision.RetryAfter), the Store answers that
// key's requests of that cost or more from memory until then, without a
// store call. It keeps the state the store's decision left (see Stater)
// and replays the algorithm's transition on it at the later instant, so
// its answers are those the store would give: a denial, with the same
// Remaining, ResetAfter and RetryAfter. While a key is denied no node can
// admit a request of the cost the denial covers, so the state cannot move
// under the cache; a smaller cost admitted on another node can (a
// descriptor of mixed costs), and then a cached denial's Remaining may
// be higher than the store's by what that node took, never its verdict.
// The cache is bounded in bytes (Config.NearCacheBytes) and counts its
// hits (Stats).
//
// Clocks: the store decides by its clock (Redis's TIME); the cache
// measures the time since the store's answer with Config.Now's monotonic
// readings and adds it to the store's instant, starting from the moment
// the request was sent, which is no later than the store's decision: a
// cached denial ends no later than the store's, and its durations may be
// longer than the store's by at most the round trip. With one clock for
// both (tests), the answers are identical.
package localfirst

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Stater is an optional interface of a sluice.Store that can hand back
// the state a Take left. store/redis implements it.
type Stater interface {
	// TakeState is Take that also returns the key's state after the
	// decision and the instant of the store's clock it decided at, in µs
	// since the Unix epoch. ok is false when the store has no such state
	// for the request (a sliding_log, a request decided without the
	// store); the state and instant are then meaningless.
	TakeState(ctx context.Context, key string, l sluice.Limit, cost int64) (d sluice.Decision, st sluice.State, now int64, ok bool, err error)
}

// Config configures a Store. The zero value of each field means its
// default.
type Config struct {
	// NearCacheBytes bounds the memory the near cache holds, keys
	// included (default 8 MiB). Negative turns the near cache off.
	NearCacheBytes int64
	// Now is the clock the near cache measures time with (default
	// time.Now). Only differences of its readings matter.
	Now func() time.Time
}

// defaultNearCacheBytes is NearCacheBytes's default: 8 MiB, about 40,000
// denied keys of 30 bytes.
const defaultNearCacheBytes = 8 << 20

// Store is a sluice.Store that decorates another with the near cache. It
// is safe for concurrent use and starts no goroutines.
type Store struct {
	next   sluice.Store
	stater Stater // next's, or nil: then no near cache
	now    func() time.Time
	near   *nearCache // nil when off

	hits   atomic.Uint64
	misses atomic.Uint64
}

var _ sluice.Store = (*Store)(nil)

// New returns next decorated as cfg says. The near cache needs next to be
// a Stater; over any other store it stays off and every call goes to next.
func New(next sluice.Store, cfg Config) (*Store, error) {
	if next == nil {
		return nil, fmt.Errorf("localfirst: no store")
	}
	if cfg.NearCacheBytes == 0 {
		cfg.NearCacheBytes = defaultNearCacheBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Store{next: next, now: cfg.Now}
	if st, ok := next.(Stater); ok && cfg.NearCacheBytes > 0 {
		s.stater = st
		s.near = newNearCache(cfg.NearCacheBytes)
	}
	return s, nil
}

// Stats are a Store's counters since New.
type Stats struct {
	// NearHits counts requests the near cache answered.
	NearHits uint64
	// NearMisses counts requests the near cache could not answer and sent
	// to the store.
	NearMisses uint64
	// NearEntries and NearBytes are what the near cache holds now.
	NearEntries int
	NearBytes   int64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{NearHits: s.hits.Load(), NearMisses: s.misses.Load()}
	if s.near != nil {
		st.NearEntries, st.NearBytes = s.near.size()
	}
	return st
}

// Take applies cost hits of l to key: cost 0 only reports. It implements
// sluice.Store.
func (s *Store) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if s.near == nil {
		return s.next.Take(ctx, key, l, cost)
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, fmt.Errorf("localfirst take %s: %w", key, err)
	}
	sent := s.now()
	if d, ok := s.near.lookup(key, l, cost, sent); ok {
		s.hits.Add(1)
		return d, nil
	}
	s.misses.Add(1)
	d, st, at, ok, err := s.stater.TakeState(ctx, key, l, cost)
	if err != nil {
		return d, err
	}
	s.learn(key, l, cost, d, st, at, ok, sent)
	return d, nil
}

// learn keeps what a store's decision on key says: a denial with its state
// goes into the near cache, an admission ends what the cache held.
func (s *Store) learn(key string, l sluice.Limit, cost int64, d sluice.Decision, st sluice.State, at int64, ok bool, sent time.Time) {
	switch {
	case d.Allowed:
		if cost > 0 {
			s.near.drop(key)
		}
	case ok && cost > 0 && d.RetryAfter > 0 && d.RetryAfter != sluice.Never:
		s.near.put(key, &nearEntry{limit: l, cost: cost, state: st, at: at, sent: sent, until: sent.Add(d.RetryAfter)})
	}
}

// TakeAll applies every request if all of them are allowed and none of
// them otherwise, writing request i's decision to ds[i]. It implements
// sluice.Store. A batch of one request is a Take; a batch whose every
// request the near cache holds a denial for is answered from it; any
// other batch goes to the store.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if s.near == nil {
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
		ds[0], err = s.Take(ctx, reqs[0].Key, reqs[0].Limit, reqs[0].Cost)
		return err
	}
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
	if err := s.next.TakeAll(ctx, reqs, ds); err != nil {
		return err
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

// NonBlocking reports whether the decorated store never blocks (see
// decide.NonBlocking): the near cache does not change that.
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
