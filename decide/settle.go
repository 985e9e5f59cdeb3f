package decide

import (
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// A store that is slow but not down (its calls over the store timeout, the
// breaker closed) has some of a key's calls decided locally while the
// others reach it: when it answers again, a server whose own hits of the
// key are counted goes back to the store for it while another server's
// hits, admitted locally, are still being written back, and the store
// admits the same room again (decide's TestSlowStoreKeepsLimit: 1,114 of
// a limit of 1,000, bound 1,053; the weather suite's host stall on three
// servers: 330 of 300, bound 318). The breaker's way back has settleFor
// for that (Probe); this is the same for one key: a key that a decision
// of this server took locally because its store call timed out or failed
// stays local (on the server's share) until settleFor after the first
// answer of the store on it since, while every server writes back (each
// Probe, four a second, and each local decision, write back at once).

// keySettles holds, per key that a store call's timeout or failure sent
// local, when that last happened and when the store answered a call of
// the key since (µs on the Service's clock; 0: not yet). It holds at most
// maxSettleBytes, keys included: beyond, a key goes back to the store as
// before. It is safe for concurrent use; a nil *keySettles holds none (a
// Service without a write-back: no server writes back what the store has
// not counted).
type keySettles struct {
	keyShards[keySettle]
	n     atomic.Int64 // keys held
	bytes atomic.Int64 // what they cost (settleSize)
}

type keySettle struct{ local, answered int64 }

// maxSettleBytes bounds what the keys a keySettles holds cost, in bytes:
// 4 MiB, about 40,000 keys of 40 bytes.
const maxSettleBytes = 4 << 20

// settleOverhead is what a key costs a keySettles besides its bytes,
// rounded up: its map slot (string header and keySettle) and the map's
// share of empty slots.
const settleOverhead = 64

// settleSize returns what key costs a keySettles.
func settleSize(key string) int64 { return int64(len(key)) + settleOverhead }

// drop forgets key, held in sh. sh.mu is held.
func (k *keySettles) drop(sh *keyShard[keySettle], key string) {
	delete(sh.m, key)
	k.n.Add(-1)
	k.bytes.Add(-settleSize(key))
}

func newKeySettles() *keySettles {
	k := &keySettles{}
	k.init()
	return k
}

// local records that the keys of reqs were decided locally at now because
// the store did not answer in time or failed.
func (k *keySettles) local(reqs []sluice.Request, now int64) {
	if k == nil {
		return
	}
	for i := range reqs {
		sh := k.shard(reqs[i].Key)
		sh.mu.Lock()
		key := reqs[i].Key
		if _, ok := sh.m[key]; ok || k.bytes.Load()+settleSize(key) <= maxSettleBytes {
			if !ok {
				k.n.Add(1)
				k.bytes.Add(settleSize(key))
			}
			sh.m[key] = keySettle{local: now}
		}
		sh.mu.Unlock()
	}
}

// answered records that the store answered a call of the keys of reqs at
// now.
func (k *keySettles) answered(reqs []sluice.Request, now int64) {
	if k == nil || k.n.Load() == 0 {
		return
	}
	for i := range reqs {
		sh := k.shard(reqs[i].Key)
		sh.mu.Lock()
		if e, ok := sh.m[reqs[i].Key]; ok && e.answered == 0 {
			e.answered = max(now, e.local)
			sh.m[reqs[i].Key] = e
		}
		sh.mu.Unlock()
	}
}

// settling reports whether a key of reqs stays local at now: the store
// answered it again less than settleFor ago.
func (k *keySettles) settling(reqs []sluice.Request, now int64) bool { return k.end(reqs, now) != 0 }

// end returns when the last key of reqs settling at now stops settling
// (µs), or 0 when none is. A key whose settling is over is forgotten.
func (k *keySettles) end(reqs []sluice.Request, now int64) int64 {
	if k == nil || k.n.Load() == 0 {
		return 0
	}
	var end int64
	for i := range reqs {
		sh := k.shard(reqs[i].Key)
		sh.mu.Lock()
		if e, ok := sh.m[reqs[i].Key]; ok && e.answered != 0 {
			if now-e.answered < settleFor.Microseconds() {
				end = max(end, e.answered+settleFor.Microseconds())
			} else {
				k.drop(sh, reqs[i].Key)
			}
		}
		sh.mu.Unlock()
	}
	return end
}

// sweep forgets the keys whose settling ended before now, and those the
// store has not answered since a decision staleSettle ago: a key not
// decided again meanwhile. Probe calls it.
func (k *keySettles) sweep(now int64) {
	if k == nil || k.n.Load() == 0 {
		return
	}
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		for key, e := range sh.m {
			if (e.answered != 0 && now-e.answered >= settleFor.Microseconds()) || now-e.local >= staleSettle.Microseconds() {
				k.drop(sh, key)
			}
		}
		sh.mu.Unlock()
	}
}

// clear forgets every key: the breaker's settling covered them (Probe
// closes the breaker once every server has written back).
func (k *keySettles) clear() {
	if k == nil || k.n.Load() == 0 {
		return
	}
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		for key := range sh.m {
			k.drop(sh, key)
		}
		sh.mu.Unlock()
	}
}

// settlingKeys reports whether a key of reqs stays local at now while the
// other servers write back (keySettles.settling). A server alone has no
// other servers to wait for: its own hits keep a key local until the store
// counts them (ledger.busy).
func (s *Service) settlingKeys(reqs []sluice.Request, now int64) bool {
	k := s.settleKeys
	if k == nil || k.n.Load() == 0 || s.ledger.nodes() <= 1 {
		return false
	}
	return k.settling(reqs, now)
}

// settleLocal records that the keys of reqs were decided locally at now
// because the store did not answer in time or failed, when other servers
// share the store.
func (s *Service) settleLocal(reqs []sluice.Request, now int64) {
	if s.settleKeys != nil && s.ledger.nodes() > 1 {
		s.settleKeys.local(reqs, now)
	}
}

// staleSettle is how long a key decided locally waits for the store to
// answer it again before it is forgotten: one no decision asks for.
const staleSettle = time.Minute
