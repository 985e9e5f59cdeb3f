// Package memory is sluice's embedded store: the states of many keys in
// sharded hash tables in this process, bounded in bytes (Config.MaxBytes,
// the garbage collector's headroom included) and optionally in keys.
//
// A Store decides exactly as the sluice.Limit transitions do. When it holds
// as much as its budget allows, it forgets keys to make room: first those
// whose state is as good as fresh (expired: it restricts nothing any more),
// then those unused longest, where a denied request counts as use. Each
// shard counts the keys inserted into it and stamps a key with that count
// at each use; eviction takes keys not used while the last N/2 keys were
// inserted (N: the keys the shard holds), so a key is forgotten only after
// N/2 new keys have entered its shard since its last request, unless more
// than 7/16 of the shard's keys are in use at once. Forgetting a key only
// ever makes its limit more lenient, never stricter: a forgotten key is a
// fresh key. So a flood of distinct keys, such as random IPv6 addresses,
// cannot exhaust memory, and a client over its limit L that keeps sending
// is admitted at most L × (1 + 2F/C) while the flood sends F new keys to a
// store that holds C (on average over the shards, which a keyed hash
// spreads keys over); at most L a window if it sends at least once per C/2
// new keys.
//
// A client of sluice serve (a random IPv6 /64 under one limit) costs about
// 128 bytes of live data and 288 bytes of MaxBytes: the default 256 MiB
// holds about 930,000 (cmd/sluice TestRSS measures it).
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/coarseclock"
)

// Config configures a Store. A zero field means its default, so Config{}
// is the default configuration; DefaultConfig spells the defaults out.
type Config struct {
	// MaxBytes is the most memory, in bytes, that the store's keys make
	// the process hold (default 256 MiB), its garbage collector's headroom
	// included: Go lets the heap grow to 1 + GOGC/100 times its live data
	// between collections (twice at the default GOGC=100), and spans,
	// fragmentation and the runtime's own structures add about an eighth,
	// so the store keeps its live data, as it accounts for it, within 7/8
	// of MaxBytes divided by 1 + GOGC/100 (GOGC read from the runtime when
	// New is called): 7/16 of MaxBytes at GOGC=100. What it accounts
	// for is what it allocates: each key at its length rounded up as Go's
	// allocator does, the slot and index word of each entry, and the logs
	// of sliding_log states (16 bytes per admitted request in the window).
	// A random IPv6 client of decide costs about 288 bytes of the budget,
	// so the default holds about 930,000 (see the package doc). The
	// budget is divided evenly among the shards; a key that alone takes
	// more than a shard's part is not kept, and so decides as a fresh key.
	MaxBytes int64
	// MaxEntries is the most keys the store holds, whatever their size
	// (default 0: no limit but MaxBytes). It is divided evenly among the
	// shards, so a shard may start evicting a little before the store as a
	// whole is full. The store evicts as soon as either bound is reached.
	MaxEntries int
	// Shards is the number of independently locked parts the keys are
	// spread over, a power of two. More shards let more cores decide at
	// once. The default is 16 × GOMAXPROCS rounded up to a power of two,
	// lowered while a shard would get less than 64 KiB of MaxBytes or
	// fewer than 16 of MaxEntries.
	Shards int
	// Now is the clock the store decides by. Nil (the default) means the
	// store's coarse clock: a goroutine that reads the system clock every
	// ClockResolution, which makes a decision much cheaper than reading
	// the system clock for each. Tests pass a fake clock here.
	Now func() time.Time
	// ClockResolution is how often the coarse clock reads the system clock
	// (default 1ms): a decision sees a time at most about this much, plus
	// scheduling delay, behind the real time, and never earlier than a time
	// seen before. Unused when Now is set.
	ClockResolution time.Duration
}

// DefaultMaxBytes is MaxBytes's default, 256 MiB.
const DefaultMaxBytes = defaultMaxBytes

// The defaults of Config's fields.
const (
	defaultMaxBytes        = 256 << 20        // MaxBytes: 256 MiB
	defaultClockResolution = time.Millisecond // ClockResolution
	minShardBytes          = 64 << 10         // the least MaxBytes a default shard gets
	minShardEntries        = 16               // the least MaxEntries a default shard gets
)

// DefaultConfig returns the default configuration: Config{} with each
// default written out.
func DefaultConfig() Config {
	return Config{
		MaxBytes:        defaultMaxBytes,
		MaxEntries:      0, // no limit but MaxBytes
		Shards:          defaultShards(defaultMaxBytes, 0),
		Now:             nil, // the coarse clock
		ClockResolution: defaultClockResolution,
	}
}

// defaultShards returns the default number of shards for a store of
// maxBytes and maxEntries (0: no entry limit).
func defaultShards(maxBytes int64, maxEntries int) int {
	n := 16 << bits.Len(uint(runtime.GOMAXPROCS(0)-1))
	for n > 1 && (maxBytes/int64(n) < minShardBytes || maxEntries > 0 && maxEntries/n < minShardEntries) {
		n /= 2
	}
	return n
}

// liveBytes returns how much live data a budget of maxBytes allows: 7/8 of
// its share of the heap that the garbage collector lets grow to gcFactor,
// since spans, fragmentation and the runtime's own structures take about
// an eighth more (measured: cmd/sluice TestRSS).
func liveBytes(maxBytes int64) int64 {
	f := gcFactor() * 8
	return maxBytes/f*700 + maxBytes%f*700/f
}

// gcFactor returns the factor, in percent, by which Go's heap may exceed
// its live data before a collection: 100 + GOGC, or 100 when collection
// is off or its setting unknown.
func gcFactor() int64 {
	sample := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 100
	}
	gogc := sample[0].Value.Uint64()
	if gogc > 10_000 { // a setting that makes no sense for a bound
		gogc = 10_000
	}
	return 100 + int64(gogc)
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
	clock  *coarseclock.Clock // nil when nowFn is set
	closed atomic.Bool
}

var (
	_ sluice.Store                    = (*Store)(nil)
	_ interface{ NonBlocking() bool } = (*Store)(nil) // decide.NonBlocking
)

// New returns a store configured by cfg. Unless cfg.Now is set, it starts
// the coarse clock's goroutine, which Close stops.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.MaxBytes < 0:
		return nil, fmt.Errorf("memory store: MaxBytes must be positive (or 0 for the default), got %d", cfg.MaxBytes)
	case cfg.MaxEntries < 0:
		return nil, fmt.Errorf("memory store: MaxEntries must be positive (or 0 for no limit), got %d", cfg.MaxEntries)
	case cfg.Shards < 0 || cfg.Shards&(cfg.Shards-1) != 0:
		return nil, fmt.Errorf("memory store: Shards must be a power of two (or 0 for the default), got %d", cfg.Shards)
	case cfg.ClockResolution < 0:
		return nil, fmt.Errorf("memory store: ClockResolution must be positive (or 0 for the default), got %v", cfg.ClockResolution)
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = defaultMaxBytes
	}
	if cfg.Shards == 0 {
		cfg.Shards = defaultShards(cfg.MaxBytes, cfg.MaxEntries)
	}
	if cfg.ClockResolution == 0 {
		cfg.ClockResolution = defaultClockResolution
	}
	live := liveBytes(cfg.MaxBytes)
	switch {
	case cfg.MaxEntries > 0 && cfg.Shards > cfg.MaxEntries:
		return nil, fmt.Errorf("memory store: %d shards for %d entries: want at most one shard per entry", cfg.Shards, cfg.MaxEntries)
	case cfg.MaxEntries/cfg.Shards > math.MaxUint32/2:
		return nil, fmt.Errorf("memory store: %d entries per shard are too many", cfg.MaxEntries/cfg.Shards)
	case live/int64(cfg.Shards) < 2*pageBytes:
		return nil, fmt.Errorf("memory store: MaxBytes %d over %d shards leaves a shard less than %d bytes of live data: raise MaxBytes or lower Shards", cfg.MaxBytes, cfg.Shards, 2*pageBytes)
	}
	s := &Store{
		shards: make([]shard, cfg.Shards),
		mask:   uint64(cfg.Shards - 1),
		seed:   maphash.MakeSeed(),
		nowFn:  cfg.Now,
	}
	budget := uint32(math.MaxUint32 / 2)
	if cfg.MaxEntries > 0 {
		budget = uint32(cfg.MaxEntries / cfg.Shards)
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.seed = s.seed
		sh.budget = budget
		sh.maxBytes = live / int64(cfg.Shards)
	}
	if cfg.Now == nil {
		s.clock = coarseclock.New(cfg.ClockResolution)
	}
	return s, nil
}

// Close stops the store's clock. The store's methods return ErrClosed
// afterwards. Close is safe to call more than once.
func (s *Store) Close() error {
	s.closed.Store(true)
	if s.clock != nil {
		s.clock.Close()
	}
	return nil
}

// Usage returns how many keys the store holds and how many bytes of live
// data it accounts for (see Config.MaxBytes: the process holds up to
// 1 + GOGC/100 times that).
func (s *Store) Usage() (keys int, bytes int64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		keys += int(sh.count)
		bytes += sh.bytes
		sh.mu.Unlock()
	}
	return keys, bytes
}

// NonBlocking reports true: the store's calls never wait on I/O, so a
// caller need not arm a timeout around them (decide.NonBlocking).
func (s *Store) NonBlocking() bool { return true }

// now returns the store's time in µs since the Unix epoch. It is small
// enough to be inlined.
func (s *Store) now() int64 {
	if c := s.clock; c != nil {
		return c.Now()
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

// take is TakeAll of one request: cost hits of l to key at the store's
// time, the state written back allowed or denied, as the Limit transition
// leaves it. A key last used under another algorithm starts afresh.
func (s *Store) take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
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
	if e.meta&0xff != uint32(l.Algorithm)+1 { // the key starts afresh
		sh.relog(-e.state.HeapBytes(), now)
		e.state = sluice.State{}
	}
	if l.Algorithm == sluice.SlidingLog { // the one state whose size changes
		d := sh.takeLog(e, l, now, cost)
		sh.mu.Unlock()
		return d, nil
	}
	d := l.TakeMicros(&e.state, now, cost)
	e.expiry = expiry(now, d.ResetAfter)
	e.meta = meta(l.Algorithm, sh.tick) // used, allowed or denied
	sh.mu.Unlock()
	return d, nil
}
