package regions

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// grant is what a round decided for one global key. It is immutable and
// replaced whole.
type grant struct {
	window int64     // fixed_window: the window cap is for (µs, home clock)
	cap    int64     // the most the region's count may reach (weighted for sliding_window)
	full   bool      // the view had nothing left: a denial waits for the window, not a round
	cut    bool      // the round was cut off from a peer
	at     time.Time // the round's start, on Config.Now
	counts []int64   // the counts of the view: this region's, then each peer's (last known)
	charge []int64   // what the view counted for each: the count, or a peer's charge when not read
	others int64     // what the view counted for the peers: Σ charge[1:]
}

// known is a region's count of a key as last read: for window (µs, the
// home clock's window it counts in), by the round that began at at; base
// of it was counted by earlier incarnations of the region's Redis, inc
// the last one read.
type known struct {
	window, count, base int64
	inc                 string
	at                  time.Time
	ok                  bool
}

// entry is one global key the node decides.
type entry struct {
	req   sluice.Request // key, group, limit and scope (Cost 0): what rounds read
	grant atomic.Pointer[grant]
	// prev is the last round's grant, kept when grant is dropped or no
	// longer holds: what the region had counted of the key by then
	prev atomic.Pointer[grant]
	seen atomic.Int64 // Config.Now µs of the latest request

	own  known   // this region's count; touched by rounds only
	last []known // per peer; touched by rounds only
}

// entryOverhead is what an entry costs besides its key, group and peers,
// rounded up.
const entryOverhead = 256

func entrySize(r sluice.Request, peers int) int64 {
	return int64(len(r.Key)+len(r.Group)) + entryOverhead + int64(peers)*24
}

const tableShards = 32

// table holds the global keys in use, bounded in bytes.
type table struct {
	seed   maphash.Seed
	budget int64 // bytes per shard
	peers  int
	shards [tableShards]tableShard
}

type tableShard struct {
	mu    sync.Mutex
	m     map[string]*entry
	bytes int64
	_     [40]byte
}

func newTable(bytes int64, peers int) *table {
	t := &table{seed: maphash.MakeSeed(), budget: max(bytes/tableShards, 1), peers: peers}
	for i := range t.shards {
		t.shards[i].m = make(map[string]*entry)
	}
	return t
}

// get returns r's entry, made if new, or nil when it does not fit. An
// entry of another limit or group under r's key is replaced.
func (t *table) get(r sluice.Request) *entry {
	sh := &t.shards[maphash.String(t.seed, r.Key)%tableShards]
	id := sluice.Request{Key: r.Key, Group: r.Group, Limit: r.Limit, Scope: r.Scope}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[r.Key]
	if e != nil && e.req.Group == id.Group && e.req.Limit == id.Limit {
		return e
	}
	if e != nil {
		sh.drop(e)
	}
	size := entrySize(r, t.peers)
	for sh.bytes+size > t.budget && sh.evictOne() {
	}
	if sh.bytes+size > t.budget {
		return nil
	}
	e = &entry{req: id, last: make([]known, t.peers)}
	sh.m[r.Key] = e
	sh.bytes += size
	return e
}

func (sh *tableShard) drop(e *entry) {
	delete(sh.m, e.req.Key)
	sh.bytes -= entrySize(e.req, len(e.last))
}

// evictOne forgets the entry used longest ago, and reports whether there
// was one. A forgotten key is decided as a key never seen: never more
// than the bound allows.
func (sh *tableShard) evictOne() bool {
	var old *entry
	for _, e := range sh.m {
		if old == nil || e.seen.Load() < old.seen.Load() {
			old = e
		}
	}
	if old == nil {
		return false
	}
	sh.drop(old)
	return true
}

// active returns the entries a round reads: those asked for since
// since (µs on Config.Now), and those without a cap. It forgets those
// not asked for since idle whose counts' window has ended by homeNow (µs,
// the home clock; see entry.keeps). Rounds call it, holding roundMu.
func (t *table) active(since, idle, homeNow int64) []*entry {
	var out []*entry
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			switch seen := e.seen.Load(); {
			case seen < idle && !e.keeps(homeNow):
				sh.drop(e)
			case seen < idle: // kept for its window, not read
			case seen >= since || e.grant.Load() == nil:
				out = append(out, e)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// keeps reports whether e stays in the table, however idle, at homeNow
// (µs, the home clock): while the window its own count was last read in
// has not ended, with a sliding_window's next one, where that count
// still weighs. So an empty restart of a Redis in that window (a new
// incarnation) finds what the region had counted, and adds it to what the
// new one counts (known.update), however long the key idled before.
// Rounds call it, holding roundMu.
func (e *entry) keeps(homeNow int64) bool {
	if !e.own.ok {
		return false
	}
	p := e.req.Limit.Period.Microseconds()
	end := e.own.window + p
	if e.req.Limit.Algorithm == sluice.SlidingWindow {
		end += p
	}
	return homeNow < end
}

// dropGrants forgets every entry's cap. Rounds call it, holding roundMu.
func (t *table) dropGrants() {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			e.grant.Store(nil)
		}
		sh.mu.Unlock()
	}
}

// each calls f on every entry, a shard's lock held: f must not use the
// table. Rounds call it, holding roundMu.
func (t *table) each(f func(*entry)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			f(e)
		}
		sh.mu.Unlock()
	}
}

// lookup returns key's entry, or nil.
func (t *table) lookup(key string) *entry {
	sh := &t.shards[maphash.String(t.seed, key)%tableShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.m[key]
}
