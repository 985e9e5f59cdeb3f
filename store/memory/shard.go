package memory

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
)

// expiryShift sets the unit of an entry's expiry: 2^30 ns, about a second.
// A uint32 of such units reaches from the Unix epoch to the year 2116.
const expiryShift = 30

// entry is the state of one key.
type entry struct {
	key   string
	state sluice.State
	// expiry is when state is as good as fresh (the decision's ResetAfter
	// after its last update), in units of 2^expiryShift ns since the Unix
	// epoch, rounded up: an entry is never expired early.
	expiry uint32
	alg    sluice.Algorithm // the algorithm state belongs to
	ref    bool             // used since the eviction hand last passed (CLOCK)
	live   bool             // the slot holds a key; free slots are the zero entry
}

// pageBits sets the number of entries in a page of a shard's slab.
const pageBits = 8

// page is a fixed block of entries. The slab grows a page at a time, so
// that it never copies entries nor holds much more than it uses.
type page [1 << pageBits]entry

// shardState is a shard without its padding.
//
// The index is an open-addressing hash table with linear probing: each
// word is the upper half of the key's hash (the tag, whose low bits are also
// the key's home in the table) above the entry's slot + 1, and 0 is empty.
// It costs 8 bytes per word where a map[string]uint32 costs about 3 times
// as much, and spares hashing the key a second time.
type shardState struct {
	mu    sync.Mutex
	index []uint64
	count uint32 // live entries
	pages []*page
	used  uint32   // slots handed out from pages, live or free
	free  []uint32 // slots below used that hold no entry
	hand  uint32   // the CLOCK hand: the next slot eviction looks at
	// budget is the most live entries the shard holds.
	budget uint32
	seed   maphash.Seed // the store's, to find an evicted key's home
}

// cacheLine is the padding unit: two 64-byte lines, since x86 prefetches
// lines in pairs.
const cacheLine = 128

// shard is one lock's worth of keys, padded so that two shards' locks never
// share a cache line.
type shard struct {
	shardState
	_ [cacheLine - unsafe.Sizeof(shardState{})%cacheLine]byte
}

// at returns the entry in slot i.
func (sh *shard) at(i uint32) *entry {
	return &sh.pages[i>>pageBits][i&(1<<pageBits-1)]
}

// lookup returns the slot of key, whose hash is h, and whether it is there.
func (sh *shard) lookup(h uint64, key string) (uint32, bool) {
	if len(sh.index) == 0 {
		return 0, false
	}
	mask := uint32(len(sh.index) - 1)
	tag := uint32(h >> 32)
	for p := tag & mask; ; p = (p + 1) & mask {
		w := sh.index[p]
		if w == 0 {
			return 0, false
		}
		if uint32(w>>32) == tag {
			if i := uint32(w) - 1; sh.at(i).key == key {
				return i, true
			}
		}
	}
}

// takeNew applies cost hits of l at now (µs) to key, whose hash is h and
// which is not in the shard, and keeps its state unless it is as good as
// fresh. The caller holds sh.mu.
func (sh *shard) takeNew(h uint64, key string, l sluice.Limit, cost, now int64) sluice.Decision {
	var st sluice.State
	d := l.TakeMicros(&st, now, cost)
	if d.ResetAfter > 0 {
		sh.insert(h, key, l.Algorithm, st, expiry(now, d.ResetAfter), now)
	}
	return d
}

// insert adds an entry for key, whose hash is h and which is not in the
// shard, evicting others if the shard is at its budget. The caller holds
// sh.mu. A new entry starts without its reference bit, so that a flood of
// keys seen once evicts its own kind before the keys in use.
func (sh *shard) insert(h uint64, key string, alg sluice.Algorithm, st sluice.State, exp uint32, now int64) {
	if sh.count >= sh.budget {
		sh.evict(now)
	}
	var i uint32
	if n := len(sh.free); n > 0 {
		i = sh.free[n-1]
		sh.free = sh.free[:n-1]
	} else {
		i = sh.used
		if int(i>>pageBits) == len(sh.pages) {
			sh.pages = append(sh.pages, new(page))
		}
		sh.used++
	}
	key = strings.Clone(key) // do not keep the caller's larger buffer alive
	*sh.at(i) = entry{key: key, state: st, expiry: exp, alg: alg, live: true}
	if (sh.count+1)*4 > uint32(len(sh.index))*3 { // at most 3/4 full
		sh.grow()
	}
	sh.link(uint32(h>>32), i)
	sh.count++
}

// link puts slot i, whose key's tag is tag, in the index.
func (sh *shard) link(tag, i uint32) {
	mask := uint32(len(sh.index) - 1)
	p := tag & mask
	for sh.index[p] != 0 {
		p = (p + 1) & mask
	}
	sh.index[p] = uint64(tag)<<32 | uint64(i+1)
}

// grow doubles the index.
func (sh *shard) grow() {
	old := sh.index
	sh.index = make([]uint64, max(2*len(old), 8))
	for _, w := range old {
		if w != 0 {
			sh.link(uint32(w>>32), uint32(w)-1)
		}
	}
}

// unlink takes slot i, whose key's tag is tag, out of the index, shifting
// the words after it back so that no probe sequence is broken.
func (sh *shard) unlink(tag, i uint32) {
	mask := uint32(len(sh.index) - 1)
	p := tag & mask
	for uint32(sh.index[p]) != i+1 {
		p = (p + 1) & mask
	}
	for {
		sh.index[p] = 0
		q := p
		for {
			q = (q + 1) & mask
			w := sh.index[q]
			if w == 0 {
				return
			}
			// The word at q may move to p unless its home lies cyclically
			// in (p, q].
			home := uint32(w>>32) & mask
			if (p < q && p < home && home <= q) || (p > q && (p < home || home <= q)) {
				continue
			}
			sh.index[p] = w
			p = q
			break
		}
	}
}

// evict frees slots: every expired entry first and then, if that freed
// fewer than a sixteenth of the budget, entries unused since the CLOCK hand
// last passed them, until it has freed that many. Freeing a batch at a
// time keeps the sweep's cost per insertion constant. The caller holds
// sh.mu.
func (sh *shard) evict(now int64) {
	limit := expiredBy(now)
	want := max(int(sh.budget/16), 1)
	freed := 0
	for i := range sh.used {
		if e := sh.at(i); e.live && e.expiry <= limit {
			sh.remove(i, e)
			freed++
		}
	}
	for freed < want && sh.count > 0 {
		if sh.hand >= sh.used {
			sh.hand = 0
		}
		i := sh.hand
		sh.hand++
		e := sh.at(i)
		switch {
		case !e.live:
		case e.ref:
			e.ref = false
		default:
			sh.remove(i, e)
			freed++
		}
	}
}

// remove frees slot i, which holds e.
func (sh *shard) remove(i uint32, e *entry) {
	sh.unlink(uint32(maphash.String(sh.seed, e.key)>>32), i)
	*e = entry{}
	sh.free = append(sh.free, i)
	sh.count--
}

// expiry returns when a state whose decision at now (µs) said reset after
// d is as good as fresh, in units of 2^expiryShift ns (about a second)
// since the Unix epoch, rounded up.
func expiry(now int64, d time.Duration) uint32 {
	const maxNs = math.MaxUint32 << expiryShift
	if now <= 0 {
		now = 0
	}
	if now >= maxNs/1000 || int64(d) >= maxNs-now*1000 {
		return math.MaxUint32
	}
	ns := now*1000 + int64(max(d, 0))
	return uint32((ns + 1<<expiryShift - 1) >> expiryShift)
}

// expiredBy returns the expiry at or before which an entry is expired at
// now (µs).
func expiredBy(now int64) uint32 {
	if now <= 0 {
		return 0
	}
	return uint32(min(now, math.MaxUint32<<expiryShift/1000) * 1000 >> expiryShift)
}
