package memory

import (
	"math"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
)

// expiryShift sets the unit of an entry's expiry: 2^20 µs, about a second.
// A uint32 of such units reaches from the Unix epoch to the year 2112.
const expiryShift = 20

// entry is the state of one key. An entry is live while its key is in the
// shard's index; a free slot is the zero entry.
type entry struct {
	key   string
	state sluice.State
	// expiry is when state is as good as fresh (the decision's ResetAfter
	// after its last update), in units of 2^expiryShift µs since the Unix
	// epoch, rounded up: an entry is never expired early.
	expiry uint32
	alg    sluice.Algorithm // the algorithm state belongs to
	ref    bool             // used since the eviction hand last passed (CLOCK)
}

// pageBits sets the number of entries in a page of a shard's slab.
const pageBits = 8

// page is a fixed block of entries. The slab grows a page at a time, so
// that it never copies entries nor holds much more than it uses.
type page [1 << pageBits]entry

// shardState is a shard without its padding.
type shardState struct {
	mu    sync.Mutex
	index map[string]uint32 // key -> slot in pages
	pages []*page
	used  uint32   // slots handed out from pages, live or free
	free  []uint32 // slots below used that hold no entry
	hand  uint32   // the CLOCK hand: the next slot eviction looks at
	// budget is the most live entries the shard holds.
	budget uint32
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

// take applies cost hits of l at now (µs) to key. The caller holds sh.mu.
func (sh *shard) take(key string, l sluice.Limit, cost, now int64) sluice.Decision {
	if i, ok := sh.index[key]; ok {
		e := sh.at(i)
		if e.alg != l.Algorithm {
			e.state, e.alg = sluice.State{}, l.Algorithm
		}
		d := l.TakeMicros(&e.state, now, cost)
		e.expiry = expiry(now, d.ResetAfter)
		e.ref = true
		return d
	}
	var st sluice.State
	d := l.TakeMicros(&st, now, cost)
	if d.ResetAfter > 0 { // a state as good as fresh need not be kept
		sh.insert(key, l.Algorithm, st, expiry(now, d.ResetAfter), now)
	}
	return d
}

// insert adds an entry for key, which is not in the index, evicting others
// if the shard is at its budget. The caller holds sh.mu. A new entry starts
// without its reference bit, so that a flood of keys seen once evicts its
// own kind before the keys in use.
func (sh *shard) insert(key string, alg sluice.Algorithm, st sluice.State, exp uint32, now int64) {
	if len(sh.free) == 0 && uint32(len(sh.index)) >= sh.budget {
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
	*sh.at(i) = entry{key: key, state: st, expiry: exp, alg: alg}
	sh.index[key] = i
}

// evict frees slots: every expired entry first and then, if that freed
// fewer than a sixteenth of the budget, entries unused since the CLOCK hand
// last passed them, until it has freed that many. Freeing a batch at a
// time keeps the sweep's cost per insertion constant. The caller holds
// sh.mu.
func (sh *shard) evict(now int64) {
	limit := uint32(0)
	if now > 0 {
		limit = uint32(min(now>>expiryShift, math.MaxUint32))
	}
	want := max(int(sh.budget/16), 1)
	freed := 0
	for i := range sh.used {
		if e := sh.at(i); e.expiry <= limit && sh.live(i, e) {
			sh.remove(i, e)
			freed++
		}
	}
	for freed < want && len(sh.index) > 0 {
		if sh.hand >= sh.used {
			sh.hand = 0
		}
		i := sh.hand
		sh.hand++
		e := sh.at(i)
		switch {
		case !sh.live(i, e):
		case e.ref:
			e.ref = false
		default:
			sh.remove(i, e)
			freed++
		}
	}
}

// live reports whether slot i holds an entry. Free slots are the zero entry;
// a live entry with the empty key is told apart through the index.
func (sh *shard) live(i uint32, e *entry) bool {
	if e.key != "" {
		return true
	}
	j, ok := sh.index[""]
	return ok && j == i
}

// remove frees slot i, which holds e.
func (sh *shard) remove(i uint32, e *entry) {
	delete(sh.index, e.key)
	*e = entry{}
	sh.free = append(sh.free, i)
}

// expiry returns when a state whose decision at now (µs) said reset after
// d is as good as fresh, in units of 2^expiryShift µs rounded up.
func expiry(now int64, d time.Duration) uint32 {
	const maxUs = math.MaxUint32 << expiryShift
	us := int64(d / time.Microsecond)
	if now >= maxUs || us >= maxUs-now {
		return math.MaxUint32
	}
	us += now
	if us <= 0 {
		return 0
	}
	return uint32((us + 1<<expiryShift - 1) >> expiryShift)
}
