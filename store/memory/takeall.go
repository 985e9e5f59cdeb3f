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
	// st is the copy of the key's state that the batch decides on, unless
	// shared is set.
	st  sluice.State
	alg sluice.Algorithm
	// shared is set while the key is a sliding log kept in e: a copy of a
	// sluice.State shares its log, so the batch decides on e.state without
	// changing it (see logTake) and pending counts the hits it admitted.
	shared  bool
	pending int64
	last    sluice.Decision // the batch's last decision on the key
}

// batchInline is the batch size up to which TakeAll allocates nothing.
const batchInline = 8

// TakeAll applies every request if all of them are allowed and none of
// them otherwise, atomically, at one instant of the store's time, writing
// request i's decision to ds[i]. When one is denied, the others report what
// they would have decided. A key given twice sees its first request's hits
// when deciding the second. It locks the shards involved in index order, so
// batches never deadlock, and decides on copies of the states, which it
// writes back only if all requests pass. Batches of up to 8 requests
// allocate nothing on keys the store holds.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision) error {
	if len(ds) < len(reqs) {
		return fmt.Errorf("memory take all: %d decisions for %d requests", len(ds), len(reqs))
	}
	if err := s.check(ctx); err != nil {
		return fmt.Errorf("memory take all: %w", err)
	}
	if len(reqs) == 0 {
		return nil
	}
	now := s.now()

	var (
		hashBuf   [batchInline]uint64
		lockBuf   [batchInline]uint32
		slotOfBuf [batchInline]int
		slotBuf   [batchInline]slot
	)
	hashes, locks, slotOf, slots := hashBuf[:0], lockBuf[:0], slotOfBuf[:0], slotBuf[:0]
	var byKey map[string]int // slots by key, for large batches
	if n := len(reqs); n > batchInline {
		hashes, locks, slotOf, slots = make([]uint64, 0, n), make([]uint32, 0, n), make([]int, 0, n), make([]slot, 0, n)
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
				sl.alg = sl.e.alg
				sl.st = sl.e.state
				sl.shared = sl.alg == sluice.SlidingLog
			}
			k = len(slots)
			slots = append(slots, sl)
			if byKey != nil {
				byKey[r.Key] = k
			}
		}
		slotOf = append(slotOf, k)
		sl := &slots[k]
		if r.Limit.Algorithm != sl.alg { // the key starts afresh
			sl.st, sl.alg, sl.shared, sl.pending = sluice.State{}, r.Limit.Algorithm, false, 0
		}
		if sl.shared {
			ds[i] = sl.logTake(r.Limit, now, r.Cost)
		} else {
			ds[i] = r.Limit.TakeMicros(&sl.st, now, r.Cost)
		}
		sl.last = ds[i]
		allowed = allowed && ds[i].Allowed
	}
	if allowed {
		commit(reqs, ds, slotOf, slots, now)
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

// commit writes an allowed batch's states to the store: first to the
// entries that exist, then new entries, since inserting may evict and must
// not evict an entry before it is written.
func commit(reqs []sluice.Request, ds []sluice.Decision, slotOf []int, slots []slot, now int64) {
	for k := range slots {
		sl := &slots[k]
		e := sl.e
		if e == nil {
			continue
		}
		if sl.shared {
			// Apply the requests for real now; the decisions are the same.
			for i, r := range reqs {
				if slotOf[i] == k {
					ds[i] = r.Limit.TakeMicros(&e.state, now, r.Cost)
					sl.last = ds[i]
				}
			}
		} else {
			e.state, e.alg = sl.st, sl.alg
		}
		e.expiry = expiry(now, sl.last.ResetAfter)
		e.ref = true
	}
	for k := range slots {
		sl := &slots[k]
		if sl.e == nil && sl.last.ResetAfter > 0 {
			sl.sh.insert(sl.h, sl.key, sl.alg, sl.st, expiry(now, sl.last.ResetAfter), now)
		}
	}
}

// logTake decides a request on a sliding log that the batch must not
// change before it knows that every request passes: sluice.State offers no
// deep copy, and a copy of the struct shares the log. A report (cost 0) on
// the log changes nothing that matters at now or later; the rest follows
// from the sliding log's rules with the batch's pending hits, all at now,
// counted on top.
func (sl *slot) logTake(l sluice.Limit, now, cost int64) sluice.Decision {
	e := sl.e
	if cost < 0 {
		return l.TakeMicros(&e.state, now, cost) // denied, untouched
	}
	rep := l.TakeMicros(&e.state, now, 0)
	if !rep.Allowed { // an invalid limit
		return l.TakeMicros(&e.state, now, cost)
	}
	free := rep.Remaining - sl.pending
	switch {
	case cost <= free:
		d := sluice.Decision{Allowed: true, Limit: rep.Limit, Remaining: free - cost, ResetAfter: rep.ResetAfter}
		sl.pending += cost
		if sl.pending > 0 { // the newest hit is at now
			d.ResetAfter = l.Period
		}
		return d
	case sl.pending == 0:
		return l.TakeMicros(&e.state, now, cost) // denied, so unchanged
	}
	d := sluice.Decision{Limit: rep.Limit, Remaining: max(free, 0), ResetAfter: l.Period}
	switch {
	case cost > rep.Limit:
		d.RetryAfter = sluice.Never
	case cost+sl.pending <= rep.Limit:
		// The pending hits are the newest: the request passes once the
		// log's own hits fall to rate − cost − pending, when a request of
		// cost + pending (denied too, so the log is unchanged) would.
		d.RetryAfter = l.TakeMicros(&e.state, now, cost+sl.pending).RetryAfter
	default:
		d.RetryAfter = l.Period // only when the pending hits expire
	}
	return d
}
