package decide

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// The fail mode local (FailLocal) over a store that blocks: every store
// call runs in a goroutine of its own, and the decision waits for it until
// the store timeout. A call that answers in time decides, and its
// decisions teach the ledger what the store counted. One that does not is
// decided locally (ModeLocal) and goes on, bounded by StoreHardTimeout:
// if it ends well the store has counted its hits, and they are not
// written back; if it fails, the hits admitted locally are pending, and
// Probe writes them back once the store answers.

// storeCall is one store call of the fail mode local, which may outlive
// the decision that made it.
type storeCall struct {
	reqs  []sluice.Request
	ds    []sluice.Decision
	probe bool  // the call is the breaker's probe
	sent  int64 // the ledger's epoch when it was sent (see ledger.learn)
	done  chan struct{}

	mu        sync.Mutex
	err       error
	finished  bool // the store call ended
	abandoned bool // the decision went on without it
	settled   bool // the decision decided locally; admitted says how
	admitted  bool
}

// decideFrom decides reqs into ds: on the store, or, when it does not
// decide them, as the fail mode says, noting the mode in resp. ctx is the
// caller's context, tctx the one bounded by the store timeout.
func (s *Service) decideFrom(ctx, tctx context.Context, resp *Response, reqs []sluice.Request, ds []sluice.Decision) outcome {
	if s.fail == FailLocal && s.timeout > 0 {
		return s.fromStoreLate(ctx, tctx, resp, reqs, ds)
	}
	o := s.fromStore(ctx, tctx, reqs, ds)
	if o != decided {
		o = s.fallback(ctx, resp, reqs, ds, o)
	}
	return o
}

// fromStoreLate is decideFrom for the fail mode local over a store that
// blocks: see storeCall.
func (s *Service) fromStoreLate(ctx, tctx context.Context, resp *Response, reqs []sluice.Request, ds []sluice.Decision) outcome {
	if tctx.Err() != nil || s.ledger.busy(reqs) { // no time left for the store, or hits it must count first
		return s.local(resp, reqs, ds, false)
	}
	ok, probe := s.br.allow()
	if !ok {
		return s.local(resp, reqs, ds, false)
	}
	if probe && s.ping != nil && s.writeBack != nil {
		// Probe brings decisions back to the store, once every server
		// has written back its hits (settles), not a decision.
		s.br.cancel(probe)
		return s.local(resp, reqs, ds, false)
	}
	if !s.lateSlots.TryAcquire() {
		s.br.cancel(probe)
		return s.local(resp, reqs, ds, false)
	}
	c := &storeCall{reqs: slices.Clone(reqs), ds: make([]sluice.Decision, len(reqs)), probe: probe, done: make(chan struct{}),
		sent: s.ledger.epoch.Load()}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.hardTimeout)
	stop := context.AfterFunc(s.base, cancel) // Close ends it at once
	start := s.br.now()
	if !s.spawn(func() {
		defer s.lateSlots.Release()
		err := s.store.TakeAll(hctx, c.reqs, c.ds)
		stop()
		cancel()
		s.finish(c, err, start)
	}) {
		stop()
		cancel()
		s.lateSlots.Release()
		s.br.cancel(probe)
		return s.local(resp, reqs, ds, false)
	}
	select {
	case <-c.done:
	case <-tctx.Done():
	}
	c.mu.Lock()
	if c.finished {
		c.mu.Unlock()
		return s.answered(ctx, tctx, resp, c, reqs, ds)
	}
	c.abandoned = true
	c.mu.Unlock()
	switch {
	case ctx.Err() != nil: // the caller gave up: not the store's fault
		s.br.cancel(probe)
	default:
		s.br.failure(probe, context.DeadlineExceeded, true)
		s.log.Debug("store slow: decided locally", "timeout", s.latency.now())
	}
	admitted := s.local(resp, reqs, ds, true) == decided && allAllowed(ds)
	c.mu.Lock()
	c.settled, c.admitted = true, admitted
	fin := c.finished
	c.mu.Unlock()
	if fin {
		s.ended(c)
	}
	return decided
}

// answered decides from a store call that ended in time, as fromStore
// does.
func (s *Service) answered(ctx, tctx context.Context, resp *Response, c *storeCall, reqs []sluice.Request, ds []sluice.Decision) outcome {
	if c.err == nil {
		copy(ds, c.ds)
		return decided
	}
	if errors.Is(c.err, sluice.ErrLimit) {
		// A limit the store cannot apply: decided here, never written
		// back.
		resp.Mode = ModeLocal
		s.ledger.take(reqs, ds, s.br.now().UnixMicro(), false, false)
		return decided
	}
	return s.local(resp, reqs, ds, false)
}

// finish records how store call c ended, err its error, started at
// start: for the breaker and the latency when it ended in time or late,
// and, if the decision went on without it, the hits it carried.
func (s *Service) finish(c *storeCall, err error, start time.Time) {
	now := s.br.now()
	c.mu.Lock()
	c.err, c.finished = err, true
	abandoned, settled := c.abandoned, c.settled
	c.mu.Unlock()
	switch {
	case err == nil:
		s.latency.observe(now.Sub(start))
		s.br.success(c.probe && !abandoned)
		if s.learns {
			s.learn(c.reqs, c.ds, now.UnixMicro(), c.sent)
		}
	case errors.Is(err, sluice.ErrLimit):
		s.br.cancel(c.probe && !abandoned)
		s.log.Debug("store refused a limit", "err", err, "fail", s.fail)
	case !abandoned:
		s.br.failure(c.probe, err, false)
		s.log.Debug("store failed", "err", err, "fail", s.fail)
	default:
		s.br.failure(false, err, timedOut(context.Background(), err))
		s.log.Debug("store call decided locally failed", "err", err)
	}
	close(c.done)
	if abandoned && settled {
		s.ended(c)
	}
}

// ended settles the hits of store call c, which the decision went on
// without, once both the call and the local decision are done.
func (s *Service) ended(c *storeCall) {
	now := s.br.now().UnixMicro()
	record := s.writeBack != nil && !errors.Is(c.err, sluice.ErrLimit)
	if !c.admitted {
		if c.err == nil && s.learns {
			s.learn(c.reqs, c.ds, now, c.sent)
		}
		return
	}
	s.ledger.ended(c.reqs, c.ds, c.err, now, c.sent, record)
}

// local decides reqs on this server into ds (ModeLocal): the store
// failed, timed out, or the breaker keeps decisions away from it. An
// admitted hit is in flight when inflight (a store call still carries
// it), else pending for the write-back.
func (s *Service) local(resp *Response, reqs []sluice.Request, ds []sluice.Decision, inflight bool) outcome {
	resp.Mode = ModeLocal
	s.ledger.take(reqs, ds, s.br.now().UnixMicro(), inflight, s.writeBack != nil)
	s.kick()
	return decided
}

// learn teaches the ledger the store's decisions ds on reqs, made at now
// (µs) on a call sent at the ledger's epoch sent, and puts back at once the
// counts it finds the store lost.
func (s *Service) learn(reqs []sluice.Request, ds []sluice.Decision, now, sent int64) {
	s.ledger.learn(reqs, ds, now, sent)
	if s.ledger.lost.Load() != 0 {
		s.kick()
	}
}

// spawn runs f in a goroutine that Close waits for, and reports false,
// running nothing, once Close has begun.
func (s *Service) spawn(f func()) bool {
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	if s.closed {
		return false
	}
	s.late.Add(1)
	go func() {
		defer s.late.Done()
		f()
	}()
	return true
}

// kick writes back the pending hits in a goroutine of its own, one at a
// time, while the breaker lets decisions go to the store: so a key decided
// locally because the store had not counted its hits (ledger.busy) goes
// back to the store as soon as it has.
func (s *Service) kick() {
	if (s.writeBack == nil || s.ledger.pending.Load() == 0) && (s.restore == nil || s.ledger.lost.Load() == 0) ||
		s.br.open() || !s.writing.CompareAndSwap(false, true) {
		return
	}
	if !s.spawn(func() {
		defer s.writing.Store(false)
		// Again while hits came meanwhile (decided locally while the
		// last write was in flight), a few times at most.
		for range 3 {
			if s.writePending(s.base) != nil || (s.ledger.pending.Load() == 0 && s.ledger.lost.Load() == 0) || s.br.open() {
				return
			}
		}
	}) {
		s.writing.Store(false)
	}
}

// allAllowed reports whether every decision of ds allows.
func allAllowed(ds []sluice.Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// slots is a counting semaphore that never blocks.
type slots struct {
	mu   sync.Mutex
	n, k int
}

// TryAcquire takes a slot, and reports false when none is free.
func (sl *slots) TryAcquire() bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.n >= sl.k {
		return false
	}
	sl.n++
	return true
}

// Release gives back a slot.
func (sl *slots) Release() {
	sl.mu.Lock()
	sl.n--
	sl.mu.Unlock()
}

// writeBackTimeout bounds a write-back of the hits admitted locally.
const writeBackTimeout = 5 * time.Second

// writePending writes the hits admitted locally that the store did not
// count back to it (Config.WriteBack), and keeps those it fails to write
// for the next time.
func (s *Service) writePending(ctx context.Context) error {
	if err := s.restoreLost(ctx); err != nil {
		return err
	}
	if s.writeBack == nil {
		return nil
	}
	now := s.br.now().UnixMicro()
	reqs, windows := s.ledger.drain(now)
	if len(reqs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, writeBackTimeout)
	defer cancel()
	err := s.writeBack(ctx, reqs, windows)
	s.ledger.written(reqs, windows, s.br.now().UnixMicro(), err == nil)
	if err != nil {
		// A store that takes no hits back is failing: enough such writes
		// open the breaker, which stops them until a ping succeeds.
		s.br.failure(false, err, timedOut(ctx, err))
		return err
	}
	var hits int64
	for _, r := range reqs {
		hits += r.Cost
	}
	s.log.Info("wrote back to the store the hits admitted without it", "keys", len(reqs), "hits", hits)
	return nil
}

// restoreLost puts back the counts the store lost (Config.Restore), as
// far as the ledger knew them, and keeps those it fails to write for the
// next time.
func (s *Service) restoreLost(ctx context.Context) error {
	if s.restore == nil {
		return nil
	}
	reqs, windows := s.ledger.lostCounts(s.br.now().UnixMicro())
	if len(reqs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, writeBackTimeout)
	defer cancel()
	err := s.restore(ctx, reqs, windows)
	s.ledger.restored(reqs, err == nil)
	if err != nil {
		s.br.failure(false, err, timedOut(ctx, err))
		return err
	}
	s.log.Info("put back counts the store lost", "keys", len(reqs))
	return nil
}

// Close waits for the store calls that went on past the store timeout,
// until ctx ends (then it cuts them short), and writes back the hits
// admitted without the store, within ctx. The Service decides no more
// after Close.
func (s *Service) Close(ctx context.Context) error {
	s.lateMu.Lock()
	s.closed = true
	s.lateMu.Unlock()
	done := make(chan struct{})
	go func() {
		s.late.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.stop()
		<-done
	}
	s.stop()
	if err := s.writePending(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	if n := s.ledger.dropped.Load(); n > 0 {
		// Evicted from a full ledger, or of a limit the rules changed.
		s.log.Warn("hits admitted without the store were forgotten, never written back", "hits", n)
	}
	return nil
}
