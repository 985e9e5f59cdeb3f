package memory

import (
	"hash/maphash"
	"math"
	"math/bits"
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
	// meta holds, in its low byte, 1 + the algorithm state belongs to, or
	// 0 in a slot that holds no key; above it, the shard's insertion
	// count, mod 2^24, when the key was last used (allowed or denied),
	// which eviction ages it by.
	meta uint32
}

// stampMask keeps the 24 bits of an insertion count that an entry stores.
const stampMask = 1<<24 - 1

func (e *entry) live() bool            { return uint8(e.meta) != 0 }
func (e *entry) alg() sluice.Algorithm { return sluice.Algorithm(uint8(e.meta) - 1) }
func (e *entry) stamp() uint32         { return e.meta >> 8 }

// meta returns an entry's meta for a use under alg at the shard's
// insertion count tick.
func meta(alg sluice.Algorithm, tick uint32) uint32 {
	return tick<<8 | (uint32(alg)+1)&0xff
}

// pageBits sets the number of entries in a page of a shard's slab.
const pageBits = 8

// page is a fixed block of entries. The slab grows a page at a time, so
// that it never copies entries nor holds much more than it uses.
type page [1 << pageBits]entry

// slotBytes is what a slot costs: its entry and its place in the free list.
const slotBytes = int64(unsafe.Sizeof(entry{})) + 4

// pageBytes is what a page costs, with the free list's room for its slots.
const pageBytes = slotBytes << pageBits

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
	tick  uint32 // keys inserted into the shard, mod 2^24; on a decision's cache line
	pages []*page
	used  uint32   // slots handed out from pages, live or free
	free  []uint32 // slots below used that hold no entry
	hand  uint32   // the next slot eviction looks at
	// budget is the most live entries the shard holds.
	budget uint32
	// bytes is the memory the shard accounts for: its pages, its index,
	// its keys and its states' logs; maxBytes is the most it may hold.
	bytes, maxBytes int64
	seed            maphash.Seed // the store's, to find an evicted key's home
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

// keyBytes returns what key and a state holding logBytes of log cost.
func keyBytes(key string, logBytes int64) int64 {
	return allocBytes(int64(len(key))) + logBytes
}

// allocBytes returns about how much heap an allocation of n bytes takes:
// Go rounds small objects up to size classes, 16 bytes apart up to 256 and
// about an eighth apart above, and large ones up to 8 KiB pages.
func allocBytes(n int64) int64 {
	switch {
	case n <= 0:
		return 0
	case n <= 256:
		return (n + 15) &^ 15
	case n <= 32<<10:
		step := int64(1) << (bits.Len64(uint64(n-1)) - 3)
		return (n + step - 1) &^ (step - 1)
	default:
		return (n + 8<<10 - 1) &^ (8<<10 - 1)
	}
}

// growth returns the bytes that inserting one more entry adds beyond the
// key's own: a page when no slot is free, a larger index when the index
// would be more than 3/4 full.
func (sh *shard) growth() int64 {
	var n int64
	if len(sh.free) == 0 && sh.used&(1<<pageBits-1) == 0 {
		n += pageBytes
	}
	if (sh.count+1)*4 > uint32(len(sh.index))*3 {
		n += 8 * int64(max(2*len(sh.index), 8)-len(sh.index))
	}
	return n
}

// fits reports whether an entry whose key and state cost b bytes fits
// beside those the shard holds.
func (sh *shard) fits(b int64) bool {
	return sh.count < sh.budget && sh.bytes+b+sh.growth() <= sh.maxBytes
}

// tooLarge reports whether an entry whose key and state cost b bytes would
// not fit even in the shard emptied of every other.
func (sh *shard) tooLarge(b int64) bool {
	fixed := int64(len(sh.pages))*pageBytes + 8*int64(len(sh.index))
	if len(sh.pages) == 0 {
		fixed += pageBytes
	}
	if len(sh.index) == 0 {
		fixed += 8 * 8
	}
	return sh.budget == 0 || fixed+b > sh.maxBytes
}

// insert adds an entry for key, whose hash is h and which is not in the
// shard, evicting others if the shard is at its budget. The caller holds
// sh.mu. A key and state that alone would take more than the shard's
// budget are not kept: the key stays as a fresh key.
func (sh *shard) insert(h uint64, key string, alg sluice.Algorithm, st sluice.State, exp uint32, now int64) {
	b := keyBytes(key, st.HeapBytes())
	if !sh.fits(b) {
		if sh.tooLarge(b) {
			return
		}
		sh.evict(now, b)
	}
	sh.bytes += b + sh.growth()
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
	sh.tick = (sh.tick + 1) & stampMask
	key = strings.Clone(key) // do not keep the caller's larger buffer alive
	*sh.at(i) = entry{key: key, state: st, expiry: exp, meta: meta(alg, sh.tick)}
	if (sh.count+1)*4 > uint32(len(sh.index))*3 { // at most 3/4 full
		sh.grow()
	}
	sh.link(uint32(h>>32), i)
	sh.count++
}

// takeLog applies cost hits of l, a sliding_log limit, at now (µs) to e,
// which the shard holds, accounting for its log's change in size. The
// caller holds sh.mu.
func (sh *shard) takeLog(e *entry, l sluice.Limit, now, cost int64) sluice.Decision {
	before := e.state.HeapBytes()
	d := l.TakeMicros(&e.state, now, cost)
	e.expiry = expiry(now, d.ResetAfter)
	e.meta = meta(l.Algorithm, sh.tick)
	sh.relog(e.state.HeapBytes()-before, now)
	return d
}

// relog accounts for a change of d bytes in the heap that an entry's state
// holds (only sliding_log states hold any), and evicts if that takes the
// shard over its budget. The caller holds sh.mu.
func (sh *shard) relog(d int64, now int64) {
	sh.bytes += d
	if d > 0 && sh.bytes > sh.maxBytes {
		sh.evict(now, 0)
	}
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

// evict makes room for an entry whose key and state cost b bytes. It frees
// every expired entry first (a state as good as fresh restricts nothing)
// and then, until it has freed a sixteenth of the entries and the new one
// fits, the entries unused longest: those not used (allowed or denied)
// while the last count/2 keys (at most 2^23, what a stamp of 24 bits tells
// apart) were inserted into the shard, as the hand finds them. Should a
// whole turn of the hand find too few such entries (more than 7/16 of the
// shard's keys in use), it halves that age and goes on, so that it
// approximates least-recently-used order. Freeing a batch at a time keeps
// the sweep's cost per insertion constant. The caller holds sh.mu.
func (sh *shard) evict(now int64, b int64) {
	limit := expiredBy(now)
	want := max(int(sh.count/16), 1)
	freed := 0
	for i := range sh.used {
		if e := sh.at(i); e.live() && e.expiry <= limit {
			sh.remove(i, e)
			freed++
		}
	}
	age := min(sh.count/2, 1<<23)
	seen := uint32(0) // slots looked at since age last changed
	for (freed < want || !sh.fits(b)) && sh.count > 0 {
		if sh.hand >= sh.used {
			sh.hand = 0
		}
		i := sh.hand
		sh.hand++
		if seen++; seen > sh.used {
			age, seen = age/2, 0
		}
		e := sh.at(i)
		if !e.live() {
			continue
		}
		if (sh.tick-e.stamp())&stampMask >= age {
			sh.remove(i, e)
			freed++
		}
	}
}

// remove frees slot i, which holds e.
func (sh *shard) remove(i uint32, e *entry) {
	sh.unlink(uint32(maphash.String(sh.seed, e.key)>>32), i)
	b := keyBytes(e.key, e.state.HeapBytes())
	sh.bytes -= b
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
