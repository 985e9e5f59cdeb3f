// Package persecond sends the limits of short periods to a store of their
// own, as Envoy ratelimit's REDIS_PERSECOND keeps its per-second counters
// in a Redis of their own: a limit whose period is below Config.Below (a
// minute) is the short store's, every other the long store's.
//
// A TakeAll whose requests are all one store's is that store's TakeAll,
// atomic as it is. A TakeAll that spans both stores cannot be one atomic
// step: the short store decides its requests first, and then the long
// store its own, so that a request the long store denies has taken hits
// of the short limits, which their short period soon forgets (and never
// the other way round). When the short store denies, the long store's
// requests are decided in a TakeAll that is sure to be denied, as a whole
// and consuming nothing (see denial), so that every decision is still
// what its store would have decided, as TakeAll promises.
package persecond

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// Config configures a Store. The zero Config means its defaults.
type Config struct {
	// Below is the period under which a limit is short (default a
	// minute: Envoy's limits of unit second, with any multiplier below
	// 60, go to the short store; Envoy sends a 60-second limit there too).
	Below time.Duration
}

// DefaultConfig returns the default configuration: what the zero Config
// means.
func DefaultConfig() Config {
	return Config{
		Below: time.Minute, // Envoy's REDIS_PERSECOND: its limits of unit second
	}
}

// Store sends each request to the short or the long store by its
// limit's period. It is safe for concurrent use if both stores are. It
// closes neither store.
type Store struct {
	short, long sluice.Store
	below       time.Duration
}

var _ sluice.Store = (*Store)(nil)

// New returns a Store over short and long.
func New(short, long sluice.Store, cfg Config) (*Store, error) {
	if short == nil || long == nil {
		return nil, errors.New("persecond: a store is nil")
	}
	if cfg.Below == 0 {
		cfg.Below = DefaultConfig().Below
	}
	if cfg.Below < 0 {
		return nil, fmt.Errorf("persecond: Below %v is negative", cfg.Below)
	}
	return &Store{short: short, long: long, below: cfg.Below}, nil
}

// Short reports whether l's states are kept in the short store.
func (s *Store) Short(l sluice.Limit) bool { return l.Period < s.below }

// TakeAll decides reqs in their stores (see the package's documentation
// for a batch that spans both). It implements sluice.Store.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if len(ds) < len(reqs) {
		return fmt.Errorf("persecond take all: %d decisions for %d requests", len(ds), len(reqs))
	}
	n := 0
	for _, r := range reqs {
		if s.Short(r.Limit) {
			n++
		}
	}
	switch n {
	case 0:
		return s.long.TakeAll(ctx, reqs, ds)
	case len(reqs):
		return s.short.TakeAll(ctx, reqs, ds)
	}
	// Both stores: the short requests first, in order, then the long
	// ones, with a room for the denial.
	sub := make([]sluice.Request, 0, len(reqs)+1)
	idx := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if s.Short(r.Limit) {
			sub, idx = append(sub, r), append(idx, i)
		}
	}
	for i, r := range reqs {
		if !s.Short(r.Limit) {
			sub, idx = append(sub, r), append(idx, i)
		}
	}
	out := make([]sluice.Decision, len(sub)+1)
	if err := s.short.TakeAll(ctx, sub[:n], out[:n]); err != nil {
		return err
	}
	long := sub[n:]
	for _, d := range out[:n] {
		if !d.Allowed {
			long = append(long, denial(long[0].Group))
			break
		}
	}
	if err := s.long.TakeAll(ctx, long, out[n:]); err != nil {
		return err
	}
	for k, i := range idx {
		ds[i] = out[k]
	}
	return nil
}

// denialKey is the key of the request denial makes. No state is ever
// kept under it: every request on it is denied, and a denied request
// consumes nothing.
const denialKey = "\x00route: a request no limit admits"

// denial returns a request that every store denies, whatever its state,
// and that consumes nothing: its cost is above its limit's capacity
// (sluice.Never). Added to a TakeAll it makes the whole batch denied, so
// that the others report what they would have decided and take nothing.
// It has group's placement, so that a batch on one cluster slot stays on
// it. Its limit is a gcra, which no store counts Envoy's way.
func denial(group string) sluice.Request {
	return sluice.Request{Key: denialKey, Group: group, Cost: 2,
		Limit: sluice.Limit{Algorithm: sluice.GCRA, Rate: 1, Period: time.Second}}
}
