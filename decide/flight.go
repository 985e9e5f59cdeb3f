package decide

import (
	"sync/atomic"

	"github.com/sluicehq/sluice"
)

// A server's own store calls in flight count against its local share. A
// call sent and not yet answered may be admitted by the store, and its
// caller then gets the store's answer, while the count the ledger read does
// not hold it: a share that left such calls out admitted the same room a
// second time. A server that resumes after a pause (the weather suite's
// host stall) has every call that queued meanwhile in flight at once;
// those the store did not answer within staleWait were decided locally
// from a count that lacked the others, which the store then admitted too
// (323-431 of a limit of 300 on one server, bound 316, in 6 of 19 runs).
// So a local decision admits a key only while its share has room for the
// cost and the hits of this server's calls of the key in flight that were
// sent before its own (all of them for a decision without a call of its
// own): the store takes those first. Calls sent after it are left out:
// counted, they denied more calls that the store then admitted all the
// same, hits the client did not get (a client over its limit got 256-262
// of 300).

// flights holds, per key, the hits of this server's store calls in
// flight (the fail mode local's late calls) that no local decision
// admitted, each with its call's sequence number: those the store may
// count unseen. It is safe for concurrent use.
type flights struct {
	keyShards[flightList]
	seq atomic.Int64 // the last sequence number given
}

// flight is the hits of one call of a key; seq 0: none.
type flight struct{ seq, cost int64 }

// flightList is the calls in flight of a key: the first inline, so that a
// key with one call in flight, the common case, allocates nothing.
type flightList struct {
	first flight
	rest  []flight
}

func newFlights() *flights {
	f := &flights{}
	f.init()
	return f
}

// add records the hits of reqs, of the call numbered seq (above 0), as in
// flight.
func (f *flights) add(reqs []sluice.Request, seq int64) {
	f.edit(reqs, func(l flightList, cost int64) flightList {
		if fl := (flight{seq: seq, cost: cost}); l.first.seq == 0 {
			l.first = fl
		} else {
			l.rest = append(l.rest, fl)
		}
		return l
	})
}

// remove takes the hits of reqs, of the call numbered seq, out.
func (f *flights) remove(reqs []sluice.Request, seq int64) {
	f.edit(reqs, func(l flightList, _ int64) flightList {
		if l.first.seq == seq {
			l.first = flight{}
			if n := len(l.rest); n > 0 {
				l.first, l.rest = l.rest[n-1], l.rest[:n-1]
			}
			return l
		}
		for j := range l.rest {
			if l.rest[j].seq == seq {
				l.rest[j] = l.rest[len(l.rest)-1]
				l.rest = l.rest[:len(l.rest)-1]
				break
			}
		}
		return l
	})
}

// edit replaces the calls in flight of each key of reqs of a positive
// Cost with what fn makes of them and the request's cost, under the key's
// shard's lock; a key left with none is forgotten.
func (f *flights) edit(reqs []sluice.Request, fn func(l flightList, cost int64) flightList) {
	for i := range reqs {
		r := &reqs[i]
		if r.Cost <= 0 {
			continue
		}
		sh := f.shard(r.Key)
		sh.mu.Lock()
		if l := fn(sh.m[r.Key], r.Cost); l.first.seq == 0 {
			delete(sh.m, r.Key)
		} else {
			sh.m[r.Key] = l
		}
		sh.mu.Unlock()
	}
}

// before returns the hits in flight of key on calls numbered below seq.
func (f *flights) before(key string, seq int64) int64 {
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l, ok := sh.m[key]
	if !ok {
		return 0
	}
	var n int64
	if l.first.seq < seq {
		n += l.first.cost
	}
	for _, fl := range l.rest {
		if fl.seq < seq {
			n += fl.cost
		}
	}
	return n
}

// fly numbers c and counts its hits in flight until land takes them out.
// It is called before c starts.
func (s *Service) fly(c *storeCall) {
	c.seq = s.flights.seq.Add(1)
	c.flying = true
	s.flights.add(c.reqs, c.seq)
}

// land takes c's hits out of those in flight, if they are still counted
// there: c ended, or a local decision admitted them. c.mu is held.
func (s *Service) land(c *storeCall) {
	if c.flying {
		c.flying = false
		s.flights.remove(c.reqs, c.seq)
	}
}

// room reports whether each key of reqs that the ledger holds has room in
// this server's share for its cost and the hits of its calls in flight
// numbered below seq (sent before: the store takes them first), and if
// one has not, writes a denial of that share into ds. The ledger seeds a
// share it has not seeded (as take would).
func (s *Service) room(reqs []sluice.Request, ds []sluice.Decision, now, seq int64) bool {
	if s.flights == nil {
		return true
	}
	l := s.ledger
	for i := range reqs {
		r := &reqs[i]
		fly := s.flights.before(r.Key, seq)
		if fly == 0 {
			continue
		}
		sh := &l.shards[l.shardOf(r.Key)]
		sh.mu.Lock()
		e := sh.m[r.Key]
		if e == nil || e.req.Limit != r.Limit {
			sh.mu.Unlock()
			continue
		}
		if !e.seeded {
			l.seed(e, now)
		}
		st := e.local.Clone()
		d := e.share.TakeMicros(&st, now, r.Cost+fly)
		sh.mu.Unlock()
		if !d.Allowed {
			for j := range ds {
				ds[j] = sluice.Decision{Limit: reqs[j].Limit.Capacity()}
			}
			ds[i] = d
			return false
		}
	}
	return true
}
