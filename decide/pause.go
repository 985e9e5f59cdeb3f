package decide

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
)

// A server that stopped deciding a while (stopped by SIGSTOP, a VM paused,
// starved of CPU) comes back with counts it read before the pause, while
// the other servers went on deciding on the store: a key's count there may
// have reached its limit meanwhile. Decided locally from the count it read
// (its share of the limit, less its share of that count), such a key would
// be admitted again what the others took since, beyond the bound of
// docs/stores.md (the weather suite's host stall admitted 350 of a limit of
// 300 on three servers). So, after a pause, a key whose count this server
// read before it is stale: its decision does not go local because of a
// call in flight (ledger.busy) nor once the store timeout passes, but
// waits for the store's answer, up to staleWait (in its own goroutine when
// MaxLateCalls are in flight), and that answer makes it fresh again. A
// server finds it paused by its own clock: nothing it does at least every
// 250 ms (a decision, the server's Probe) ran for pauseMin.

const (
	// pauseMin is the least time without a decision or a Probe that is a
	// pause: four of the server's Probes (every 250 ms) missed.
	pauseMin = time.Second
	// staleFor is how long after a pause the ledger is asked whether a
	// key is stale: a key in use is decided on the store again well
	// within it; past it the check costs nothing.
	staleFor = 10 * time.Second
	// staleWait is the most a decision of a stale key waits for the store
	// (unless the caller's context ends first): a server that resumes has
	// a burst of calls that waited to go through, slower than the store
	// timeout on a loaded machine, but the store is as healthy as the
	// other servers found it. A store that does not answer within it is
	// failing for this server too: the decision is local, the breaker
	// counts a timeout.
	staleWait = time.Second
	// markEvery is how often, at most, a decision records the time it ran.
	markEvery = 10 * time.Millisecond
)

// mark records that the Service runs at now (µs on its clock), and, when it
// had not run for pauseMin, that it resumes at now from a pause.
func (s *Service) mark(now int64) {
	prev := s.seen.Load()
	if now-prev < markEvery.Microseconds() {
		return
	}
	paused := now-prev >= pauseMin.Microseconds()
	if paused {
		// Before seen: whoever reads the new seen finds the pause too.
		s.resumed.Store(now)
		s.br.paused(now)
	}
	if s.seen.CompareAndSwap(prev, now) && paused {
		s.log.Info("resumed after a pause: keys whose counts were read before it are decided by the store",
			"paused", (time.Duration(now-prev) * time.Microsecond).Round(time.Millisecond).String())
	}
}

// stale reports whether a key of reqs has a count this server read before
// its last pause, if it ended within staleFor of now.
func (s *Service) stale(reqs []sluice.Request, now int64) bool {
	r := s.resumed.Load()
	if r == 0 || now-r > staleFor.Microseconds() {
		return false
	}
	return s.ledger.stale(reqs, r)
}

// staleNow decides reqs, of a stale key, on the store in the decision's
// own goroutine, when no late call can carry them (MaxLateCalls are in
// flight: a server that resumes has every call that queued meanwhile to
// decide at once): the call is cut short after staleWait, and then, or
// if the store fails, the decision is local (a call cut short may have
// reached the store: its hit is written back too, counted twice at
// worst). Once Close has begun, it is local at once.
func (s *Service) staleNow(ctx context.Context, resp *Response, reqs []sluice.Request, ds []sluice.Decision) outcome {
	s.lateMu.Lock()
	closed := s.closed
	s.lateMu.Unlock()
	if !closed {
		tctx, cancel := context.WithTimeout(ctx, staleWait)
		o := s.fromStore(ctx, tctx, reqs, ds)
		cancel()
		if o == decided {
			return decided
		}
	}
	return s.local(resp, reqs, ds, false)
}

// staleDeadline returns d, the store timeout's deadline, moved to
// staleWait from now unless ctx ends earlier.
func staleDeadline(ctx context.Context, d time.Time) time.Time {
	late := time.Now().Add(staleWait)
	if pd, ok := ctx.Deadline(); ok && pd.Before(late) {
		late = pd
	}
	if late.After(d) {
		return late
	}
	return d
}

// stale reports whether the ledger holds a key of reqs whose count was
// read on a call sent before since (µs), or that it only decided locally.
func (l *ledger) stale(reqs []sluice.Request, since int64) bool {
	for i := range reqs {
		sh := &l.shards[l.shardOf(reqs[i].Key)]
		sh.mu.Lock()
		e := sh.m[reqs[i].Key]
		st := e != nil && e.sent < since
		sh.mu.Unlock()
		if st {
			return true
		}
	}
	return false
}
