package decide

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// breaker is a circuit breaker over the store: after failures store calls
// in a row fail it opens, and for coolDown no call goes to the store; then
// one call probes, and closes it on success or opens it again on failure.
// It is safe for concurrent use.
type breaker struct {
	failures int64 // failures in a row that open it; 0 disables it
	coolDown time.Duration
	now      func() time.Time
	log      *slog.Logger

	fails     atomic.Int64 // store calls failed in a row
	openUntil atomic.Int64 // µs since the Unix epoch; 0 when closed
	probing   atomic.Bool  // a probe is in flight
}

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

// success records a store call that succeeded.
func (b *breaker) success(probe bool) {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if b.openUntil.Load() != 0 && b.openUntil.Swap(0) != 0 {
		b.log.Info("store recovered: decisions go to the store again")
	}
	if probe {
		b.probing.Store(false)
	}
}

// failure records a store call that failed with err.
func (b *breaker) failure(probe bool, err error) {
	n := b.fails.Add(1)
	if b.failures > 0 && (probe || n >= b.failures) {
		until := b.now().Add(b.coolDown).UnixMicro()
		if b.openUntil.Swap(until) == 0 {
			b.log.Warn("store failing: circuit breaker open", "failures", n, "cool_down", b.coolDown, "err", err)
		}
	}
	if probe {
		b.probing.Store(false)
	}
}

// cancel releases a probe whose outcome says nothing about the store (the
// caller gave up first).
func (b *breaker) cancel(probe bool) {
	if probe {
		b.probing.Store(false)
	}
}
