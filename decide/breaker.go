package decide

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// breaker is a circuit breaker over the store. A store that fails (it
// refuses, resets, errs) opens it after failures calls in a row; a store
// that is only slow (its calls time out) opens it once its calls have also
// failed for window with no success among them: a slow store is alive, and
// only one that has answered nothing for that long is taken for down. Open,
// no call goes to the store for coolDown; then one call probes, and closes
// it on success or opens it again on failure. It is safe for concurrent use.
type breaker struct {
	failures int64 // failures in a row that open it; 0 disables it
	window   int64 // µs that failing slow calls must span to open it
	coolDown time.Duration
	now      func() time.Time
	log      *slog.Logger
	// held says that an open breaker is closed by close alone (the fail
	// mode local's Probe, once every server has had the time to write
	// back its hits: Service.settles), never by a call's success: such a
	// call was sent before the breaker opened, and answers while the
	// other servers still hold hits the store has not counted.
	held bool

	fails     atomic.Int64 // store calls failed in a row
	since     atomic.Int64 // µs since the Unix epoch of the first of them; 0 with none
	slow      atomic.Bool  // the last of them timed out
	openUntil atomic.Int64 // µs since the Unix epoch; 0 when closed
	probing   atomic.Bool  // a probe is in flight
	// erred says a store call failed with an error, not a timeout, since
	// the last takeErred: the store may have restarted.
	erred atomic.Bool
}

// takeErred reports whether a store call failed with an error, not a
// timeout, since the last call of takeErred.
func (b *breaker) takeErred() bool { return b.erred.Load() && b.erred.Swap(false) }

// allow reports whether a decision may call the store, and whether that
// call is the probe that closes or reopens the breaker; a probe must be
// reported.
func (b *breaker) allow() (ok, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	if b.now().UnixMicro() < until {
		return false, false
	}
	if b.probing.CompareAndSwap(false, true) {
		return true, true
	}
	return false, false
}

// open reports whether the breaker keeps decisions away from the store.
func (b *breaker) open() bool { return b.openUntil.Load() != 0 }

// slowNow reports whether the store's last calls timed out, and none has
// succeeded since.
func (b *breaker) slowNow() bool { return b.fails.Load() != 0 && b.slow.Load() }

// success records a store call that succeeded: it closes the breaker,
// unless held.
func (b *breaker) success(probe bool) {
	if b.held && b.open() {
		b.clearFails()
		b.log.Debug("store answered a call sent before the breaker opened: decisions stay local until a Probe sends them back")
	} else {
		b.close()
	}
	if probe {
		b.probing.Store(false)
	}
}

// close closes the breaker, if it is open, and clears the failures.
func (b *breaker) close() {
	b.clearFails()
	if b.openUntil.Load() != 0 && b.openUntil.Swap(0) != 0 {
		b.log.Info("store recovered: decisions go to the store again")
	}
}

// clearFails forgets the failures in a row.
func (b *breaker) clearFails() {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
		b.since.Store(0)
		b.slow.Store(false)
	}
}

// failure records a store call that failed with err; slow says it timed
// out.
func (b *breaker) failure(probe bool, err error, slow bool) {
	n := b.fails.Add(1)
	now := b.now().UnixMicro()
	b.since.CompareAndSwap(0, now)
	b.slow.Store(slow)
	if !slow && !b.erred.Load() {
		b.erred.Store(true)
	}
	trip := b.failures > 0 && (probe || n >= b.failures)
	if trip && slow && !probe {
		trip = now-b.since.Load() >= b.window
	}
	if trip {
		until := now + b.coolDown.Microseconds()
		if b.openUntil.Swap(until) == 0 {
			b.log.Warn("store failing: circuit breaker open", "failures", n, "slow", slow, "cool_down", b.coolDown, "err", err)
		}
	}
	if probe {
		b.probing.Store(false)
	}
}

// paused starts again at now (µs) the time that failing slow calls must
// span to open it, if some are failing: the server was paused (pause.go),
// and a pause is no time the store spent failing (a call in flight when
// the server stopped times out when it resumes, the store never slow).
func (b *breaker) paused(now int64) {
	if b.since.Load() != 0 {
		b.since.Store(now)
	}
}

// cancel releases a probe whose outcome says nothing about the store (the
// caller gave up first).
func (b *breaker) cancel(probe bool) {
	if probe {
		b.probing.Store(false)
	}
}
