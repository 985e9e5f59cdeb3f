// Package slots counts requests in flight for sluice's concurrency limits
// (a descriptor's `concurrency: N`): Memory is the in-process count; the
// Redis one is store/redis's SlotCounter; both are Counters, which package
// admit takes and gives back. A slot is held by a token until it is
// released or its lease ends, whichever comes first, so that a holder that
// never releases (a decision API caller, which has no "done" call, or a
// node that died) frees its slot at the end of the lease.
package slots

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Grant is the answer to an Acquire: sluice.Grant.
type Grant = sluice.Grant

// ErrFull is returned by Acquire when the Memory is at its MaxKeys or
// MaxHolds and none of its holds has expired.
var ErrFull = errors.New("slots: table full")

// Counter keeps the requests in flight of concurrency limits:
// sluice.SlotCounter, which Memory implements on one node and
// store/redis's SlotCounter across nodes.
type Counter = sluice.SlotCounter

var _ Counter = (*Memory)(nil)

// Config configures a Memory. A zero field means its default.
type Config struct {
	// MaxKeys bounds the keys with slots held at once. Default 100,000
	// (about 15 MiB with MaxHolds' entries).
	MaxKeys int
	// MaxHolds bounds the slots held at once over every key: 16 bytes
	// each. Default 1,000,000 (16 MiB).
	MaxHolds int
	// Now is the clock of leases. Default time.Now.
	Now func() time.Time
}

// DefaultConfig returns the defaults of a zero Config.
func DefaultConfig() Config {
	return Config{
		MaxKeys:  100_000,   // clients with requests in flight at once
		MaxHolds: 1_000_000, // requests in flight at once, 16 B each
		Now:      time.Now,
	}
}

const shardCount = 32

// Memory counts slots in process memory. It is safe for concurrent use
// and starts no goroutines; expired holds are swept when their key is
// next touched, or when the table is full.
type Memory struct {
	seed   maphash.Seed
	now    func() time.Time
	keys   int // per shard
	holds  int // per shard
	token  atomic.Uint64
	shards [shardCount]shard
}

type shard struct {
	mu    sync.Mutex
	m     map[string]*holders
	holds int
	_     [40]byte // keep shards on their own cache lines
}

// holders are the holds of one key; first is the earliest expiry among
// them (UnixNano), so that a key with nothing expired is not scanned.
type holders struct {
	h     []hold
	first int64
}

type hold struct {
	token uint64
	exp   int64 // UnixNano
}

// NewMemory returns a Memory for cfg.
func NewMemory(cfg Config) (*Memory, error) {
	def := DefaultConfig()
	if cfg.MaxKeys < 0 || cfg.MaxHolds < 0 {
		return nil, fmt.Errorf("slots: MaxKeys %d and MaxHolds %d must not be negative", cfg.MaxKeys, cfg.MaxHolds)
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = def.MaxKeys
	}
	if cfg.MaxHolds == 0 {
		cfg.MaxHolds = def.MaxHolds
	}
	if cfg.Now == nil {
		cfg.Now = def.Now
	}
	m := &Memory{seed: maphash.MakeSeed(), now: cfg.Now,
		keys: max(cfg.MaxKeys/shardCount, 1), holds: max(cfg.MaxHolds/shardCount, 1)}
	for i := range m.shards {
		m.shards[i].m = make(map[string]*holders)
	}
	return m, nil
}

// shard returns the shard of key.
func (m *Memory) shard(key string) *shard {
	return &m.shards[maphash.String(m.seed, key)%shardCount]
}

// Acquire takes a slot of key for lease unless limit slots of key are
// held: expired holds are dropped first. It fails only with ErrFull.
func (m *Memory) Acquire(_ context.Context, key string, limit int64, lease time.Duration) (Grant, error) {
	now := m.now().UnixNano()
	s := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	hs := s.m[key]
	if hs != nil && hs.first <= now {
		s.holds -= hs.sweep(now)
	}
	if hs != nil && int64(len(hs.h)) >= limit {
		return Grant{InFlight: int64(len(hs.h)), RetryAfter: time.Duration(hs.first - now)}, nil
	}
	if s.holds >= m.holds || (hs == nil && len(s.m) >= m.keys) {
		s.sweepAll(now)
		if s.holds >= m.holds || (hs == nil && len(s.m) >= m.keys) {
			return Grant{}, ErrFull
		}
	}
	exp := now + int64(lease)
	if hs == nil {
		hs = &holders{first: exp}
		s.m[key] = hs
	}
	tok := m.token.Add(1)
	hs.h = append(hs.h, hold{tok, exp})
	hs.first = min(hs.first, exp)
	s.holds++
	return Grant{OK: true, Token: tok, InFlight: int64(len(hs.h))}, nil
}

// Release gives back the slot token of key; a slot already expired or
// released is no error.
func (m *Memory) Release(_ context.Context, key string, token uint64) error {
	s := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	hs := s.m[key]
	if hs == nil {
		return nil
	}
	for i := range hs.h {
		if hs.h[i].token == token {
			last := len(hs.h) - 1
			hs.h[i] = hs.h[last]
			hs.h = hs.h[:last]
			s.holds--
			break
		}
	}
	if len(hs.h) == 0 {
		delete(s.m, key)
	}
	return nil
}

// InFlight returns how many slots of key are held now.
func (m *Memory) InFlight(key string) int64 {
	now := m.now().UnixNano()
	s := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	if hs := s.m[key]; hs != nil {
		for _, h := range hs.h {
			if h.exp > now {
				n++
			}
		}
	}
	return n
}

// sweep drops the holds expired at now and returns how many it dropped.
func (hs *holders) sweep(now int64) int {
	kept := hs.h[:0]
	first := int64(1<<63 - 1)
	for _, h := range hs.h {
		if h.exp > now {
			kept = append(kept, h)
			first = min(first, h.exp)
		}
	}
	n := len(hs.h) - len(kept)
	hs.h, hs.first = kept, first
	return n
}

// sweepAll drops every expired hold of the shard, and the keys left
// without one.
func (s *shard) sweepAll(now int64) {
	for k, hs := range s.m {
		if hs.first <= now {
			s.holds -= hs.sweep(now)
		}
		if len(hs.h) == 0 {
			delete(s.m, k)
		}
	}
}
