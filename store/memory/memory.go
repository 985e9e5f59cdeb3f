// Package memory is sluice's embedded store: the states of many keys in
// sharded hash tables in this process, bounded by an entry budget.
//
// A Store decides exactly as the sluice.Limit transitions do. When it holds
// as many keys as its budget allows, it forgets keys to make room: first
// those whose state is as good as fresh (expired), then those least
// recently used (approximately, by a CLOCK sweep). Forgetting a key only
// ever makes its limit more lenient, never stricter: a forgotten key is a
// fresh key. So a flood of distinct keys, such as random IPv6 addresses,
// cannot exhaust memory, and costs at worst some leniency for the keys it
// pushes out.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Config configures a Store. Start from DefaultConfig.
type Config struct {
	// MaxEntries is the most keys the store holds (default 1<<20). It is
	// divided evenly among the shards, so a shard may start evicting a
	// little before the store as a whole is full. A key such as
	// "user:123456" costs about 100 bytes of heap under every algorithm
	// but sliding_log, whose log adds 16 bytes per admitted request still
	// in the window: the default bounds the store at about 100 MiB.
	MaxEntries int
	// Shards is the number of independently locked parts the keys are
	// spread over, a power of two. More shards let more cores decide at
	// once. The default is 16 × GOMAXPROCS rounded up to a power of two.
	Shards int
	// Now is the clock the store decides by. Nil means the store's coarse
	// clock: a goroutine that reads the system clock every ClockResolution,
	// which makes a decision much cheaper than reading the system clock for
	// each. Tests pass a fake clock here.
	Now func() time.Time
	// ClockResolution is how often the coarse clock reads the system clock
	// (default 1ms): a decision sees a time at most about this much, plus
	// scheduling delay, behind the real time, and never earlier than a time
	// seen before. Unused when Now is set.
	ClockResolution time.Duration
}

// DefaultConfig returns the default configuration.
func DefaultConfig() Config {
	return Config{
		MaxEntries:      1 << 20,
		Shards:          16 << bits.Len(uint(runtime.GOMAXPROCS(0)-1)),
		Now:             nil,
		ClockResolution: time.Millisecond,
	}
}

// ErrClosed is returned by the methods of a Store that has been closed.
var ErrClosed = errors.New("memory store closed")

// Store keeps the states of rate-limited keys in memory. It is safe for
// concurrent use. A decision on a key the store holds allocates nothing.
//
// A context that is done when Take or TakeAll is called makes them return
// its error without applying anything; once they run they do not block.
type Store struct {
	shards []shard
	mask   uint64
	seed   maphash.Seed
	nowFn  func() time.Time
	clock  *coarseClock // nil when nowFn is set
	closed atomic.Bool
}

var _ sluice.Store = (*Store)(nil)

// New returns a store configured by cfg. Unless cfg.Now is set, it starts
// the coarse clock's goroutine, which Close stops.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.MaxEntries < 1:
		return nil, fmt.Errorf("memory store: MaxEntries must be at least 1, got %d", cfg.MaxEntries)
	case cfg.Shards < 1 || cfg.Shards&(cfg.Shards-1) != 0:
		return nil, fmt.Errorf("memory store: Shards must be a power of two, got %d", cfg.Shards)
	case cfg.Shards > cfg.MaxEntries:
		return nil, fmt.Errorf("memory store: %d shards for %d entries: want at most one shard per entry", cfg.Shards, cfg.MaxEntries)
	case cfg.MaxEntries/cfg.Shards > math.MaxUint32/2:
		return nil, fmt.Errorf("memory store: %d entries per shard are too many", cfg.MaxEntries/cfg.Shards)
	case cfg.Now == nil && cfg.ClockResolution <= 0:
		return nil, fmt.Errorf("memory store: ClockResolution must be positive, got %v", cfg.ClockResolution)
	}
	s := &Store{
		shards: make([]shard, cfg.Shards),
		mask:   uint64(cfg.Shards - 1),
		seed:   maphash.MakeSeed(),
		nowFn:  cfg.Now,
	}
	budget := uint32(cfg.MaxEntries / cfg.Shards)
	for i := range s.shards {
		s.shards[i].seed = s.seed
		s.shards[i].budget = budget
	}
	if cfg.Now == nil {
		s.clock = newCoarseClock(cfg.ClockResolution)
	}
	return s, nil
}

// Close stops the store's clock. The store's methods return ErrClosed
// afterwards. Close is safe to call more than once.
func (s *Store) Close() error {
	s.closed.Store(true)
	if s.clock != nil {
		s.clock.close()
	}
	return nil
}

// NonBlocking reports true: the store's calls never wait on I/O, so a
// caller need not arm a timeout around them (decide.NonBlocking).
func (s *Store) NonBlocking() bool { return true }

// now returns the store's time in µs since the Unix epoch. It is small
// enough to be inlined.
func (s *Store) now() int64 {
	if c := s.clock; c != nil {
		return c.now()
	}
	return s.callNow()
}

// callNow returns the time of the clock from the configuration, in µs.
func (s *Store) callNow() int64 { return s.nowFn().UnixMicro() }

// hash returns key's hash: its lower bits choose the shard, its upper half
// is the key's tag in the shard's index.
func (s *Store) hash(key string) uint64 { return maphash.String(s.seed, key) }

// check returns the error that keeps a call from running, if any.
func (s *Store) check(ctx context.Context) error {
	err := ctx.Err()
	if err == nil && s.closed.Load() {
		err = ErrClosed
	}
	return err
}

// Take applies cost hits of l to key at the store's time; cost 0 only
// reports. A key last used under another algorithm starts afresh.
func (s *Store) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil || s.closed.Load() { // s.check, inlined
		return sluice.Decision{}, fmt.Errorf("memory take %q: %w", key, s.check(ctx))
	}
	now := s.now()
	h := s.hash(key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	i, ok := sh.lookup(h, key)
	if !ok {
		d := sh.takeNew(h, key, l, cost, now)
		sh.mu.Unlock()
		return d, nil
	}
	// The path of a key the store holds, written out here: every call
	// level costs a copy of the Decision.
	e := sh.at(i)
	if e.alg != l.Algorithm { // the key starts afresh
		e.state, e.alg = sluice.State{}, l.Algorithm
	}
	d := l.TakeMicros(&e.state, now, cost)
	e.expiry = expiry(now, d.ResetAfter)
	e.ref = true
	sh.mu.Unlock()
	return d, nil
}
