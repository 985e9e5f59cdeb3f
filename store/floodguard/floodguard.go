// Package floodguard is a doorkeeper in front of a store (the memory
// store, typically): a key seen for the first time takes no entry in the
// store until it is seen again, so that a flood of one-shot keys (random
// IPv6 addresses, say) cannot push the real clients out of a bounded
// store. Two Bloom filters remember the keys seen: the current one, and
// the one before the last rotation.
//
// What it costs in exactness, exactly: a request whose key is in neither
// filter is decided as the key's first request (sluice.Limit.Take on a
// zero State: admitted unless its cost exceeds the limit's capacity) and
// not counted; its key then goes into the current filter. A key stays in
// the filters until the second rotation after it was last seen, and
// rotations are at least Config.Interval apart, so a key gets at most one
// uncounted request per Interval: a client of a limit of R per period P is
// admitted at most R + ceil(P/Interval) + 1 times in any window of P
// (the window algorithms; the buckets likewise gain at most one hit per
// Interval). A Bloom filter's false positive makes a new key go to the
// store at once, as without the guard: it costs protection, not
// exactness.
package floodguard

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Config configures a Store. A zero field means its default.
type Config struct {
	// Capacity is how many keys a filter takes before the filters rotate
	// (at most every Interval). Default 1,000,000: two filters of 2 MiB
	// at the default FalsePositive (9.6 Mbit rounded up to 2^24).
	Capacity int
	// FalsePositive is a full filter's rate of false positives, between 0
	// and 0.5. Default 0.01.
	FalsePositive float64
	// Interval is the least time between two rotations: the bound on
	// uncounted requests is one per key per Interval. Past Capacity
	// before Interval has passed, the current filter keeps filling and its
	// false positives grow (more new keys reach the store), never its
	// misses. Default 1 minute.
	Interval time.Duration
	// Now is the clock of Interval and of the decisions of uncounted
	// requests. Default time.Now.
	Now func() time.Time
}

// DefaultConfig returns the defaults of every field.
func DefaultConfig() Config {
	return Config{
		Capacity:      1_000_000,   // keys per filter; 2 MiB each at 1%
		FalsePositive: 0.01,        // 1% of new keys reach the store at once
		Interval:      time.Minute, // at most one uncounted request per key a minute
		Now:           time.Now,
	}
}

// MaxCapacity caps Config.Capacity: filters of 2 GiB at 1%.
const MaxCapacity = 1 << 30

// Store is a sluice.Store that keeps the keys it has not seen before out of
// the store it wraps. It is safe for concurrent use.
type Store struct {
	next sluice.Store
	cfg  Config
	seed maphash.Seed
	bits uint64 // per filter, a power of two
	k    int    // hashes per key

	mu       sync.Mutex // held to rotate
	cur      atomic.Pointer[filter]
	prev     atomic.Pointer[filter]
	rotated  time.Time
	uncount  atomic.Uint64
	rotation atomic.Uint64
}

var _ sluice.Store = (*Store)(nil)

// filter is a Bloom filter whose bits are set with atomic operations.
type filter struct {
	words []atomic.Uint64
	n     atomic.Int64 // keys added
}

// New returns a Store in front of next.
func New(next sluice.Store, cfg Config) (*Store, error) {
	d := DefaultConfig()
	if cfg.Capacity == 0 {
		cfg.Capacity = d.Capacity
	}
	if cfg.FalsePositive == 0 {
		cfg.FalsePositive = d.FalsePositive
	}
	if cfg.Interval == 0 {
		cfg.Interval = d.Interval
	}
	if cfg.Now == nil {
		cfg.Now = d.Now
	}
	switch {
	case next == nil:
		return nil, errors.New("floodguard: no store")
	case cfg.Capacity < 1 || cfg.Capacity > MaxCapacity:
		return nil, fmt.Errorf("floodguard: capacity %d: want 1 to %d", cfg.Capacity, MaxCapacity)
	case !(cfg.FalsePositive > 0 && cfg.FalsePositive <= 0.5):
		return nil, fmt.Errorf("floodguard: false positive rate %v: want more than 0, at most 0.5", cfg.FalsePositive)
	case cfg.Interval < 0:
		return nil, fmt.Errorf("floodguard: interval %v is negative", cfg.Interval)
	}
	// The optimal Bloom filter: m = -n ln p / ln² 2 bits, k = m/n ln 2
	// hashes; m rounded up to a power of two.
	m := -float64(cfg.Capacity) * math.Log(cfg.FalsePositive) / (math.Ln2 * math.Ln2)
	bits := uint64(64)
	for float64(bits) < m {
		bits <<= 1
	}
	s := &Store{next: next, cfg: cfg, seed: maphash.MakeSeed(), bits: bits,
		k: max(1, int(math.Round(m/float64(cfg.Capacity)*math.Ln2))), rotated: cfg.Now()}
	s.cur.Store(s.newFilter())
	s.prev.Store(s.newFilter())
	return s, nil
}

func (s *Store) newFilter() *filter { return &filter{words: make([]atomic.Uint64, s.bits/64)} }

// Bytes returns the memory of the filters: two, each of a power of two
// bits.
func (s *Store) Bytes() int64 { return 2 * int64(s.bits/8) }

// Stats are a Store's counts since it was made.
type Stats struct {
	Uncounted uint64 // requests decided as a key's first and not counted
	Rotations uint64
}

// Stats returns the counts.
func (s *Store) Stats() Stats {
	return Stats{Uncounted: s.uncount.Load(), Rotations: s.rotation.Load()}
}

// has reports whether f may hold the key of hash h.
func (s *Store) has(f *filter, h uint64) bool {
	h1, h2 := h, h>>32|1
	for i := range s.k {
		b := (h1 + uint64(i)*h2) & (s.bits - 1)
		if f.words[b/64].Load()&(1<<(b%64)) == 0 {
			return false
		}
	}
	return true
}

func (s *Store) add(f *filter, h uint64) {
	h1, h2 := h, h>>32|1
	for i := range s.k {
		b := (h1 + uint64(i)*h2) & (s.bits - 1)
		if w := &f.words[b/64]; w.Load()&(1<<(b%64)) == 0 {
			w.Or(1 << (b % 64))
		}
	}
	f.n.Add(1)
}

// seen reports whether key was seen before (in either filter), and
// remembers it in the current filter either way; with record false (a
// cost-0 look) it only reports.
func (s *Store) seen(key string, record bool) bool {
	h := maphash.String(s.seed, key)
	cur := s.cur.Load()
	if s.has(cur, h) {
		return true
	}
	old := s.has(s.prev.Load(), h)
	if !record {
		return old
	}
	s.add(cur, h)
	if cur.n.Load() >= int64(s.cfg.Capacity) {
		s.rotate(cur)
	}
	return old
}

// rotate makes a new current filter of cur, the previous one forgotten,
// if Interval has passed since the last rotation.
func (s *Store) rotate(cur *filter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	if s.cur.Load() != cur || now.Sub(s.rotated) < s.cfg.Interval {
		return
	}
	s.prev.Store(cur)
	s.cur.Store(s.newFilter())
	s.rotated = now
	s.rotation.Add(1)
}

// asFirst returns the decision on cost hits of l as a key's first
// request: l's transition on a zero State.
func (s *Store) asFirst(l sluice.Limit, cost int64) sluice.Decision {
	var st sluice.State
	return l.Take(&st, s.cfg.Now(), cost)
}

// TakeAll decides reqs as the wrapped store's TakeAll would, except that
// the requests of new keys are decided as their keys' first and not
// counted. A new key given twice goes to the store (its second request
// must see the first's hits). When a new key's request is denied (its cost
// exceeds the capacity), the store's requests take nothing.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	var fresh uint64 // bit i: reqs[i] is of a new key (first 64 requests)
	for i := range reqs {
		if i >= 64 || reqs[i].Cost <= 0 || dup(reqs, i) {
			continue
		}
		if !s.seen(reqs[i].Key, true) {
			fresh |= 1 << i
		}
	}
	if fresh == 0 {
		return s.next.TakeAll(ctx, reqs, ds)
	}
	ok := true
	for i := range reqs {
		if fresh&(1<<i) != 0 {
			ds[i] = s.asFirst(reqs[i].Limit, reqs[i].Cost)
			ok = ok && ds[i].Allowed
		}
	}
	rest := make([]sluice.Request, 0, len(reqs))
	idx := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if fresh&(1<<i) == 0 {
			if !ok {
				r.Cost = 0 // a new key's request is denied: take nothing
			}
			rest, idx = append(rest, r), append(idx, i)
		}
	}
	if len(rest) > 0 {
		sub := make([]sluice.Decision, len(rest))
		if err := s.next.TakeAll(ctx, rest, sub); err != nil {
			return err
		}
		for j, i := range idx {
			ds[i] = sub[j]
			ok = ok && sub[j].Allowed
		}
	}
	if ok {
		// All or none: only when everything passed did the new keys'
		// requests pass uncounted.
		s.uncount.Add(uint64(bits.OnesCount64(fresh)))
	}
	return nil
}

// dup reports whether reqs[i]'s key appears elsewhere in reqs.
func dup(reqs []sluice.Request, i int) bool {
	for j := range reqs {
		if j != i && reqs[j].Key == reqs[i].Key {
			return true
		}
	}
	return false
}
