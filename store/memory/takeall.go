package memory

import (
	"context"
	"fmt"
	"slices"

	"github.com/sluicehq/sluice"
)

// slot is one distinct key of a TakeAll batch while the batch is decided.
type slot struct {
	key string
	h   uint64 // the key's hash
	sh  *shard
	e   *entry // the key's entry when the batch began, or nil
	// st is the copy of the key's state that the batch decides on.
	st   sluice.State
	alg  sluice.Algorithm
	last sluice.Decision // the batch's last decision on the key
}

// batchInline is the batch size up to which TakeAll allocates nothing.
const batchInline = 8

// TakeAll applies every request if all of them are allowed and none of
// them otherwise, atomically, at one instant of the store's time, writing
// request i's decision to ds[i]. When one is denied, the others report what
// they would have decided. A key given twice sees its first request's hits
// when deciding the second. It locks the shards involved in index order, so
// batches never deadlock, and decides on copies of the states, which it
// writes back only if all requests pass; a batch of one request writes
// back the state its transition leaves, allowed or denied. Batches of up
// to 8 requests allocate nothing on keys the store holds.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if len(ds) < len(reqs) {
		return fmt.Errorf("memory take all: %d decisions for %d requests", len(ds), len(reqs))
	}
	if len(reqs) == 1 { // all or nothing by itself
		var err error
		ds[0], err = s.take(ctx, reqs[0].Key, reqs[0].Limit, reqs[0].Cost)
		return err
	}
	if err := s.check(ctx); err != nil {
		return fmt.Errorf("memory take all: %w", err)
	}
	if len(reqs) == 0 {
		return nil
	}
	now := s.now()

	var (
		hashBuf [batchInline]uint64
		lockBuf [batchInline]uint32
		slotBuf [batchInline]slot
	)
	hashes, locks, slots := hashBuf[:0], lockBuf[:0], slotBuf[:0]
	var byKey map[string]int // slots by key, for large batches
	if n := len(reqs); n > batchInline {
		hashes, locks, slots = make([]uint64, 0, n), make([]uint32, 0, n), make([]slot, 0, n)
		byKey = make(map[string]int, n)
	}
	for _, r := range reqs {
		h := s.hash(r.Key)
		hashes = append(hashes, h)
		locks = append(locks, uint32(h&s.mask))
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)
	for _, i := range locks {
		s.shards[i].mu.Lock()
	}

	allowed := true
	for i, r := range reqs {
		k := findSlot(slots, byKey, r.Key)
		if k < 0 {
			h := hashes[i]
			sh := &s.shards[h&s.mask]
			sl := slot{key: r.Key, h: h, sh: sh, alg: r.Limit.Algorithm}
			if j, ok := sh.lookup(h, r.Key); ok {
				sl.e = sh.at(j)
				sl.alg = sl.e.alg()
				sl.st = sl.e.state.Clone()
			}
			k = len(slots)
			slots = append(slots, sl)
			if byKey != nil {
				byKey[r.Key] = k
			}
		}
		sl := &slots[k]
		if r.Limit.Algorithm != sl.alg { // the key starts afresh
			sl.st, sl.alg = sluice.State{}, r.Limit.Algorithm
		}
		ds[i] = r.Limit.TakeMicros(&sl.st, now, r.Cost)
		sl.last = ds[i]
		allowed = allowed && ds[i].Allowed
	}
	if allowed {
		commit(slots, now)
	} else {
		touch(slots)
	}
	for _, i := range locks {
		s.shards[i].mu.Unlock()
	}
	return nil
}

// findSlot returns the index of key's slot, or -1.
func findSlot(slots []slot, byKey map[string]int, key string) int {
	if byKey != nil {
		if k, ok := byKey[key]; ok {
			return k
		}
		return -1
	}
	for k := range slots {
		if slots[k].key == key {
			return k
		}
	}
	return -1
}

// touch marks the entries of a denied batch as used: a client over its
// limit that keeps sending is in use, and a store that forgot it first
// would hand it a fresh allowance.
func touch(slots []slot) {
	for k := range slots {
		if e := slots[k].e; e != nil {
			e.meta = meta(e.alg(), slots[k].sh.tick)
		}
	}
}

// commit writes an allowed batch's states to the store: first to the
// entries that exist, then new entries, since inserting may evict and must
// not evict an entry before it is written.
func commit(slots []slot, now int64) {
	for k := range slots {
		sl := &slots[k]
		e := sl.e
		if e == nil {
			continue
		}
		before := e.state.HeapBytes()
		e.state = sl.st
		e.expiry = expiry(now, sl.last.ResetAfter)
		e.meta = meta(sl.alg, sl.sh.tick)
		if d := e.state.HeapBytes() - before; d != 0 { // a sliding_log's
			// Accounted now, evicted for below: evicting here could free
			// an entry this loop has yet to write.
			sl.sh.bytes += d
		}
	}
	for k := range slots {
		sl := &slots[k]
		if sl.e == nil && sl.last.ResetAfter > 0 {
			sl.sh.insert(sl.h, sl.key, sl.alg, sl.st, expiry(now, sl.last.ResetAfter), now)
		}
	}
	for k := range slots {
		if sh := slots[k].sh; sh.bytes > sh.maxBytes {
			sh.evict(now, 0)
		}
	}
}
