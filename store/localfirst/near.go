package localfirst

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// nearShards is how many independently locked parts the near cache has.
const nearShards = 32

// entryOverhead is what a near cache entry costs besides its key's bytes:
// the entry (group, limit, state, times: 152 bytes), its pointer and the
// map's share of a bucket (about 50 bytes), rounded up.
const entryOverhead = 208

// nearCache holds, per key, the state a store's denial left and until when
// that denial holds. It is bounded in bytes: a shard that is full drops
// entries at random (a map's iteration order) to make room; lookups drop
// the expired entries they find. Safe for concurrent use.
type nearCache struct {
	seed   maphash.Seed
	budget int64 // bytes per shard
	shards [nearShards]nearShard
}

type nearShard struct {
	mu      sync.Mutex
	entries map[string]*nearEntry
	bytes   int64
	_       [40]byte // keeps shards' locks on separate cache lines
}

// nearEntry is one denial the store gave.
type nearEntry struct {
	group string // the request's Group: where the store keeps the key
	limit sluice.Limit
	cost  int64        // the denied cost: the entry answers this cost or more
	state sluice.State // the key's state after the denial (no sliding log)
	at    int64        // the store's instant of the denial, µs
	sent  time.Time    // when the request was sent, by Config.Now
	until time.Time    // sent + the denial's RetryAfter
}

func newNearCache(bytes int64) *nearCache {
	c := &nearCache{seed: maphash.MakeSeed(), budget: max(bytes/nearShards, 1)}
	for i := range c.shards {
		c.shards[i].entries = make(map[string]*nearEntry)
	}
	return c
}

func (c *nearCache) shard(key string) *nearShard {
	return &c.shards[maphash.String(c.seed, key)%nearShards]
}

// lookup returns the decision on cost hits of l at now for key, if the
// cache holds a denial of key under l that covers it.
func (c *nearCache) lookup(key string, l sluice.Limit, cost int64, now time.Time) (sluice.Decision, bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	e := sh.entries[key]
	if e == nil || e.limit != l || cost < e.cost {
		sh.mu.Unlock()
		return sluice.Decision{}, false
	}
	if !now.Before(e.until) {
		sh.remove(key, e)
		sh.mu.Unlock()
		return sluice.Decision{}, false
	}
	st, at := e.state, e.at+now.Sub(e.sent).Microseconds()
	sh.mu.Unlock()
	// The state is a copy: a denial leaves it as it is.
	d := l.TakeMicros(&st, at, cost)
	if d.Allowed { // cannot be before until; the store will say
		return sluice.Decision{}, false
	}
	return d, true
}

// put records e for key, in place of what the cache held for it.
func (c *nearCache) put(key string, e *nearEntry) {
	size := int64(len(key)) + entryOverhead
	if size > c.budget {
		return
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if old := sh.entries[key]; old != nil {
		sh.remove(key, old)
	}
	for k, o := range sh.entries { // at random: a map's order
		if sh.bytes+size <= c.budget {
			break
		}
		sh.remove(k, o)
	}
	sh.entries[key] = e
	sh.bytes += size
}

// drop forgets key.
func (c *nearCache) drop(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	if e := sh.entries[key]; e != nil {
		sh.remove(key, e)
	}
	sh.mu.Unlock()
}

// remove deletes key's entry e; sh.mu is held.
func (sh *nearShard) remove(key string, e *nearEntry) {
	delete(sh.entries, key)
	sh.bytes -= int64(len(key)) + entryOverhead
}

// size returns the entries held and their bytes.
func (c *nearCache) size() (n int, bytes int64) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		bytes += sh.bytes
		sh.mu.Unlock()
	}
	return n, bytes
}
