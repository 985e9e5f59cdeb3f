package decide

import (
	"context"
	"errors"
	"math"
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
//
// What a decision costs here is kept to what it cost before the calls
// went into goroutines (BenchmarkDecide/descriptors=1/blocking): the
// store timeout is a deadlineCtx, which needs no timer; a storeCall is
// its own context, with no timer while the decision waits for it; and a
// call that ended in time goes back to a pool with its slices and
// channels.

// storeCall is one store call of the fail mode local, which may outlive
// the decision that made it. It is the call's context too: the caller's
// values, a deadline StoreHardTimeout after it began, and a Done that
// closes at that deadline, or when Close cuts the calls short (cut). Its
// timer is armed only once the decision goes on without it (or at once,
// when the hard timeout comes before the store timeout): until then the
// decision's own wait ends it first. A call that ended in time, whose
// context never ended, goes back to Service.calls; one the decision went
// on without never does (the store may still hold it). So a store must
// not use a call's context once its TakeAll returned, unless that context
// ended: none in this module does (store/redis leaves a queued call
// behind only when its context ended).
type storeCall struct {
	s        *Service
	reqs     []sluice.Request
	ds       []sluice.Decision
	probe    bool          // the call is the breaker's probe
	sent     int64         // the ledger's epoch when it was sent (see ledger.learn)
	start    time.Time     // by the breaker's clock, for the latency
	sig      chan struct{} // buffered: one value when the call ended
	wait     *time.Timer   // the decision's wait for it, until the store timeout
	parent   context.Context
	deadline time.Time // StoreHardTimeout after the call began
	ctxDone  chan struct{}
	prev     *storeCall // in Service.inflight, under Service.lateMu
	next     *storeCall

	mu        sync.Mutex
	ctxErr    error       // the context's Err, once ctxDone is closed
	timer     *time.Timer // ends the context at deadline, once armed
	err       error
	finished  bool // the store call ended
	abandoned bool // the decision went on without it
	settled   bool // the decision decided locally; admitted says how
	admitted  bool
	flying    bool  // its hits count in Service.flights
	seq       int64 // its number there
}

// Deadline is StoreHardTimeout after the call began.
func (c *storeCall) Deadline() (time.Time, bool) { return c.deadline, true }

// Done closes at the deadline, or when Close cuts the calls short.
func (c *storeCall) Done() <-chan struct{} { return c.ctxDone }

// Err is context.DeadlineExceeded or context.Canceled once Done is closed.
func (c *storeCall) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctxErr
}

// Value is the caller's: only its cancellation is dropped, as
// context.WithoutCancel drops it. Nil once the call went back to the
// pool (only a store that kept its context past TakeAll, which none
// may, would ask then).
func (c *storeCall) Value(key any) any {
	if c.parent == nil {
		return nil
	}
	return c.parent.Value(key)
}

// end ends c's context with err, if it has not ended. c.mu is held.
func (c *storeCall) end(err error) {
	if c.ctxErr == nil {
		c.ctxErr = err
		close(c.ctxDone)
	}
}

// expire ends c's context at its deadline.
func (c *storeCall) expire() {
	c.mu.Lock()
	c.end(context.DeadlineExceeded)
	c.mu.Unlock()
}

// arm starts the timer that ends c's context at its deadline. c.mu is
// held.
func (c *storeCall) arm() {
	if c.timer == nil && c.ctxErr == nil {
		c.timer = time.AfterFunc(time.Until(c.deadline), c.expire)
	}
}

// newCall returns a storeCall of reqs, from the pool, with a context of
// the caller's ctx.
func (s *Service) newCall(ctx context.Context, reqs []sluice.Request, probe bool) *storeCall {
	c, _ := s.calls.Get().(*storeCall)
	if c == nil {
		c = &storeCall{s: s, sig: make(chan struct{}, 1), ctxDone: make(chan struct{})}
		c.wait = time.NewTimer(time.Hour)
		c.wait.Stop()
	}
	c.reqs = append(c.reqs[:0], reqs...)
	if cap(c.ds) < len(reqs) {
		c.ds = make([]sluice.Decision, len(reqs))
	}
	c.ds = c.ds[:len(reqs)]
	clear(c.ds)
	c.probe, c.parent = probe, ctx
	c.sent = s.ledger.epoch.Load()
	c.start = s.br.now()
	c.deadline = time.Now().Add(s.hardTimeout)
	return c
}

// putCall gives back to the pool a call that ended in time, its signal
// taken, unless its context ended or has a timer (anything may hold it
// then).
func (s *Service) putCall(c *storeCall) {
	c.mu.Lock()
	keep := !c.abandoned && c.ctxErr == nil && c.timer == nil
	c.mu.Unlock()
	if !keep {
		return
	}
	clear(c.reqs)
	c.reqs = c.reqs[:0]
	c.parent, c.err = nil, nil
	c.finished, c.settled, c.admitted = false, false, false
	s.calls.Put(c)
}

// deadlineCtx is the store timeout of a decision of the fail mode local
// over a store that blocks (Service.boundLate): ctx with a deadline, and
// no timer. Its Done is ctx's, so it does not close at the deadline: it
// never leaves this package, and fromStoreLate, the one that waits on it,
// waits for the deadline with a timer of its own (storeCall.wait).
type deadlineCtx struct {
	context.Context
	deadline time.Time
}

// Deadline is the store timeout's, or ctx's when it comes first.
func (d *deadlineCtx) Deadline() (time.Time, bool) {
	if pd, ok := d.Context.Deadline(); ok && pd.Before(d.deadline) {
		return pd, true
	}
	return d.deadline, true
}

// Err is ctx's, or context.DeadlineExceeded once the deadline passed.
func (d *deadlineCtx) Err() error {
	if err := d.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(d.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// boundLate returns ctx bounded by the store timeout, as bound does, but
// as a deadlineCtx in b, when decisions go through fromStoreLate (which
// is all tctx is given to); else bound's.
func (s *Service) boundLate(ctx context.Context, b *batch) (context.Context, context.CancelFunc) {
	if s.fail != FailLocal || s.timeout <= 0 {
		return s.bound(ctx)
	}
	b.tctx = deadlineCtx{Context: ctx, deadline: time.Now().Add(s.latency.now())}
	return &b.tctx, noCancel
}

// noCancel is the CancelFunc of a context with nothing to cancel.
func noCancel() {}

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
	now := s.br.now().UnixMicro()
	s.mark(now)
	// A key whose count was read before a pause waits for the store
	// (pause.go).
	stale := s.stale(reqs, now)
	if !stale && tctx.Err() != nil { // no time left for the store
		return s.local(resp, reqs, ds, false)
	}
	// Hits the store must count first: the other servers' (a key settling,
	// settle.go), or this server's (calls in flight, a count being put
	// back): local, unless the share denies it while the store answers
	// and has not lost the key's count (see holdDenial).
	waited := false
	if !stale && (s.settlingKeys(reqs, now) || s.ledger.busy(reqs)) {
		if o := s.local(resp, reqs, ds, false); allAllowed(ds) || s.ledger.losing(reqs) || !s.holdDenial(ctx, reqs) {
			return o
		}
		resp.Mode, waited = ModeStore, true
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
	c := s.newCall(ctx, reqs, probe)
	d := s.callDeadline(ctx, tctx, stale, waited)
	if !c.deadline.After(d) { // the hard timeout comes first: no call shares c yet
		c.arm()
	}
	s.fly(c)
	if !s.startLate(c) { // Close has begun, or MaxLateCalls are in flight
		s.land(c)
		if c.timer != nil {
			c.timer.Stop()
		}
		s.putCall(c)
		s.br.cancel(probe)
		if stale {
			return s.staleNow(ctx, resp, reqs, ds)
		}
		return s.local(resp, reqs, ds, false)
	}
	c.wait.Reset(time.Until(d))
	got := false
	select {
	case <-c.sig:
		got = true
	case <-c.wait.C:
	case <-tctx.Done():
	}
	c.wait.Stop()
	c.mu.Lock()
	if c.finished {
		c.mu.Unlock()
		if !got {
			<-c.sig // sent just after finished was set
		}
		o := s.answered(ctx, tctx, resp, c, reqs, ds)
		s.putCall(c)
		return o
	}
	c.abandoned = true
	c.arm() // the decision no longer ends it
	c.mu.Unlock()
	return s.goOn(ctx, resp, c, reqs, ds)
}

// callDeadline returns when a decision stops waiting for its store call:
// at tctx's deadline (the store timeout), staleWait from now for a stale
// key, the store timeout from now after a wait (holdDenial, which may have
// used up tctx's).
func (s *Service) callDeadline(ctx, tctx context.Context, stale, waited bool) time.Time {
	d, _ := tctx.Deadline()
	switch {
	case stale:
		d = staleDeadline(ctx, d)
	case waited:
		d = time.Now().Add(s.latency.now())
		if pd, ok := ctx.Deadline(); ok && pd.Before(d) {
			d = pd
		}
	}
	return d
}

// goOn decides locally the requests of store call c, which the decision
// goes on without (it did not end in time), and settles them with c if it
// has ended meanwhile. c.abandoned is set.
func (s *Service) goOn(ctx context.Context, resp *Response, c *storeCall, reqs []sluice.Request, ds []sluice.Decision) outcome {
	switch {
	case ctx.Err() != nil: // the caller gave up: not the store's fault
		s.br.cancel(c.probe)
	default:
		s.br.failure(c.probe, context.DeadlineExceeded, true)
		s.log.Debug("store slow: decided locally", "timeout", s.latency.now())
		s.settleLocal(reqs, s.br.now().UnixMicro())
	}
	// Its hits in flight before, in the share after when admitted; else
	// still in flight, the store may count them.
	admitted := s.localAfter(resp, reqs, ds, true, c.seq) == decided && allAllowed(ds)
	// After a pause of this server, a denial waits on for the store (see
	// holdDenial).
	if !admitted && s.afterPause() && s.mayWait(ctx) {
		if s.waitCall(ctx, c) {
			// The store answered: its decisions, not the share's denial.
			s.heldStore.Add(1)
			copy(ds, c.ds)
			resp.Mode = ModeStore
			c.mu.Lock()
			c.settled = true
			c.mu.Unlock()
			return decided
		}
		s.heldLocal.Add(1)
	}
	c.mu.Lock()
	if admitted {
		s.land(c)
	}
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
	s.settleLocal(reqs, s.br.now().UnixMicro())
	return s.local(resp, reqs, ds, false)
}

// finish records how store call c ended, err its error, started at
// start: for the breaker and the latency when it ended in time or late,
// and, if the decision went on without it, the hits it carried.
func (s *Service) finish(c *storeCall, err error, start time.Time) {
	now := s.br.now()
	c.mu.Lock()
	c.err, c.finished = err, true
	s.land(c)
	abandoned, settled := c.abandoned, c.settled
	if c.timer != nil || abandoned { // as context.WithTimeout's cancel, once the call is done
		if c.timer != nil {
			c.timer.Stop()
		}
		c.end(context.Canceled)
	}
	c.mu.Unlock()
	switch {
	case err == nil:
		s.latency.observe(now.Sub(start))
		s.br.success(c.probe && !abandoned)
		s.settleKeys.answered(c.reqs, now.UnixMicro())
		if s.learns {
			s.learn(c.reqs, c.ds, now.UnixMicro(), c.sent, c.start.UnixMicro())
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
	c.sig <- struct{}{} // the decision may take c back to the pool now
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
			s.learn(c.reqs, c.ds, now, c.sent, c.start.UnixMicro())
		}
		return
	}
	s.ledger.ended(c.reqs, c.ds, c.err, now, c.sent, c.start.UnixMicro(), record)
}

// local decides reqs on this server into ds (ModeLocal): the store
// failed, timed out, or the breaker keeps decisions away from it. An
// admitted hit is in flight when inflight (a store call still carries
// it), else pending for the write-back.
func (s *Service) local(resp *Response, reqs []sluice.Request, ds []sluice.Decision, inflight bool) outcome {
	return s.localAfter(resp, reqs, ds, inflight, math.MaxInt64)
}

// localAfter is local for the requests of the store call numbered seq
// (flight.go): the hits of calls in flight numbered below it count against
// the share.
func (s *Service) localAfter(resp *Response, reqs []sluice.Request, ds []sluice.Decision, inflight bool, seq int64) outcome {
	resp.Mode = ModeLocal
	now := s.br.now().UnixMicro()
	if s.room(reqs, ds, now, seq) {
		s.ledger.take(reqs, ds, now, inflight, s.writeBack != nil)
	}
	s.kick()
	return decided
}

// learn teaches the ledger the store's decisions ds on reqs, made at now
// (µs) on a call sent at the ledger's epoch sent, at sentAt (µs), and puts
// back at once the counts it finds the store lost.
func (s *Service) learn(reqs []sluice.Request, ds []sluice.Decision, now, sent, sentAt int64) {
	s.ledger.learn(reqs, ds, now, sent, sentAt)
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

// startLate starts store call c in a goroutine of its own, which Close
// waits for and cuts short, and reports false, starting nothing, once
// Close has begun or while MaxLateCalls are in flight.
func (s *Service) startLate(c *storeCall) bool {
	s.lateMu.Lock()
	defer s.lateMu.Unlock()
	if s.closed || s.lateN >= s.maxLate {
		return false
	}
	s.lateN++
	c.prev, c.next = nil, s.inflight
	if s.inflight != nil {
		s.inflight.prev = c
	}
	s.inflight = c
	s.late.Add(1)
	go c.run()
	return true
}

// run makes store call c, and settles it.
func (c *storeCall) run() {
	s := c.s
	err := s.store.TakeAll(c, c.reqs, c.ds)
	s.lateMu.Lock()
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		s.inflight = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
	s.lateN--
	s.lateMu.Unlock()
	s.finish(c, err, c.start)
	s.late.Done()
}

// cut ends the context of every store call in flight: Close cuts them
// short.
func (s *Service) cut() {
	s.lateMu.Lock()
	for c := s.inflight; c != nil; c = c.next {
		c.mu.Lock()
		c.end(context.Canceled)
		c.mu.Unlock()
	}
	s.lateMu.Unlock()
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

// writeBackTimeout bounds a write-back of the hits admitted locally.
const writeBackTimeout = 5 * time.Second

// writePending puts back the counts the store lost (restoreLost), then
// writes the hits admitted locally that the store did not count back to it
// (Config.WriteBack), and keeps those it fails to write for the next time.
// One runs at a time (a Probe's, the write-back a decision kicked,
// Close's): a write-back that reached a store back empty while a count of
// its key was being put back was hidden by the merge by maximum, and its
// hits lost (TestWeatherRefusedThenEmpty counted 60 of 70 in 2 of about
// 50 runs beside the weather suite); in turn, the count put back holds the
// hits written back before it (ledger.lostCounts), and those written after
// it add to it.
func (s *Service) writePending(ctx context.Context) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
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
// admitted without the store, within ctx. Those it cannot write (the store
// is down) are logged at WARN, with how many: a store that fails is the
// weather the fail mode local is for, not an error of the Service's. The
// Service decides no more after Close.
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
		s.cut()
		<-done
	}
	s.stop()
	if err := s.writePending(context.WithoutCancel(ctx)); err != nil {
		hits, keys := s.ledger.unwritten()
		s.log.Warn("hits admitted without the store could not be written back to it", "hits", hits, "keys", keys,
			"counts_not_put_back", s.ledger.lost.Load(), "err", err)
	}
	if n := s.ledger.dropped.Load(); n > 0 {
		// Evicted from a full ledger, or of a limit the rules changed.
		s.log.Warn("hits admitted without the store were forgotten, never written back", "hits", n)
	}
	return nil
}

// A local decision that denies while the store answers is a false 429 if
// the client is under its limit across the servers: the share it denies
// from is one server's part of the limit, and a server that has a burst
// of one client's calls to decide at once (one that resumes after a
// pause, whose calls queued meanwhile) finds its part used up while the
// others' are not. The weather suite's host stall on three servers denied
// 1-8 of 600 calls of clients at a fifth of their limit in about one run
// in four on a loaded machine: keys of the stopped server settling, or
// busy with its calls in flight, decided locally. So such a denial goes
// to the store instead, while the store answers (mayWait), as the key
// would a little later:
//
//   - a key busy with this server's hits in flight waits for those calls
//     to end (ledger.idleCh), unless the store lost its count (the put
//     back comes first);
//   - a key settling waits for its settling to end (at most settleFor),
//     when the other servers have written back;
//
// then the call goes to the store, and is decided as any call: by the
// store if it answers within the store timeout, else locally. A call that
// timed out is not waited for past the store timeout, but after a pause
// of this server: its answer may come after a stall of the store, while
// every server has hits it decided locally and not written back, which
// the store's count lacks (decide's TestSlowStoreKeepsLimit admitted
// 1,061 of 1,000, bound 1,053, when denials waited so); after a pause, the other
// servers decided on the store meanwhile, as for a stale key (pause.go).
// Only denials wait: an admission is as quick as before, and a client
// over its limit is answered by the store. The waits are bounded: by
// holdFor, by three quarters of the time the caller gives, and to
// MaxLateCalls decisions at once; past those, the denial stands.

// holdFor is the most a denial waits for its keys (holdDenial): their calls
// in flight to end, as a stale key waits for the store (staleWait), then
// the settling that starts then (settleFor).
const holdFor = staleWait + settleFor

// mayWait reports whether a local denial may wait for the store: it
// answers (the breaker is closed, and its last call did not time out,
// unless this server resumed from a pause within staleFor: its calls
// then time out behind the burst that queued meanwhile, the store as
// healthy as the other servers find it) and the caller still waits.
func (s *Service) mayWait(ctx context.Context) bool {
	if s.br.open() || ctx.Err() != nil {
		return false
	}
	return !s.br.slowNow() || s.afterPause()
}

// afterPause reports whether this server resumed from a pause within
// staleFor (pause.go).
func (s *Service) afterPause() bool {
	r := s.resumed.Load()
	return r != 0 && s.br.now().UnixMicro()-r <= staleFor.Microseconds()
}

// waitCall waits for store call c, which the decision went on without, up
// to holdUntil(ctx, staleWait), and reports whether it ended in that time
// with the store's decisions. It takes c's signal.
func (s *Service) waitCall(ctx context.Context, c *storeCall) bool {
	t := time.NewTimer(time.Until(holdUntil(ctx, staleWait)))
	defer t.Stop()
	select {
	case <-c.sig:
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil
}

// holdDenial reports whether a local denial of reqs, keys settling or
// busy, goes to the store instead, once no key of reqs is either: it waits
// for that (for hits in flight to end, for settling to end) while the
// store answers (mayWait) and no key's count is lost, up to holdFor and
// three quarters of the time to ctx's deadline (a key that settles past
// that is denied at once).
func (s *Service) holdDenial(ctx context.Context, reqs []sluice.Request) bool {
	if !s.mayWait(ctx) {
		return false
	}
	held := s.hold(ctx, reqs)
	if held {
		s.heldStore.Add(1)
	} else {
		s.heldLocal.Add(1)
	}
	return held
}

// HeldDenials returns how many local denials waited for the store since
// New, while it answered (holdDenial; after a pause, goOn): those that
// went to it then (store), and those whose denial stood (local: the wait's
// bound passed, or the store stopped answering).
func (s *Service) HeldDenials() (store, local uint64) {
	return s.heldStore.Load(), s.heldLocal.Load()
}

// holdUntil returns when a denial that waits at most d stops waiting: d
// from now, or three quarters of the time to ctx's deadline when that is
// sooner, so that the denial reaches its caller before it gives up
// (Envoy's rate limit filter waits 20 ms by default, then admits).
func holdUntil(ctx context.Context, d time.Duration) time.Time {
	deadline := time.Now().Add(d)
	if pd, ok := ctx.Deadline(); ok {
		if pd = time.Now().Add(time.Until(pd) * 3 / 4); pd.Before(deadline) {
			deadline = pd
		}
	}
	return deadline
}

// hold is holdDenial once the store answers.
func (s *Service) hold(ctx context.Context, reqs []sluice.Request) bool {
	deadline := holdUntil(ctx, holdFor)
	now := s.br.now().UnixMicro()
	if end := s.settleKeys.end(reqs, now); end != 0 && deadline.Before(time.Now().Add(time.Duration(end-now)*time.Microsecond)) {
		return false
	}
	if s.holding.Add(1) > int64(s.maxLate) {
		s.holding.Add(-1)
		return false
	}
	defer s.holding.Add(-1)
	s.ledger.waiters.Add(1)
	defer s.ledger.waiters.Add(-1)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		idle := s.ledger.idleCh() // before the check: no end is missed
		now = s.br.now().UnixMicro()
		if !s.mayWait(ctx) || s.ledger.losing(reqs) {
			return false
		}
		end := s.settleKeys.end(reqs, now) // by the Service's clock, which the timer's need not be (a test's)
		busy := s.ledger.busy(reqs)
		if end == 0 && !busy {
			return true
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return false
		}
		if end != 0 {
			wait = min(wait, time.Duration(end-now)*time.Microsecond)
		}
		t.Reset(wait)
		select {
		case <-idle:
			t.Stop()
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
}
