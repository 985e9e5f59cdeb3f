// Package coarseclock is a clock that a goroutine of its own advances at
// a fixed resolution, for hot paths that read the time on every call
// (store/memory, observe).
package coarseclock

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock is a clock that a goroutine of its own advances every
// resolution, so that reading it costs one atomic load instead of a system
// call. Its readings are microseconds since the Unix epoch, at most about one
// resolution behind time.Now, and never decrease: a wall clock that steps
// back holds it still until the wall clock catches up.
type Clock struct {
	us   atomic.Int64
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// New starts a clock that reads the system clock every resolution. Its
// goroutine runs until Close is called.
func New(resolution time.Duration) *Clock {
	tick := time.NewTicker(resolution)
	return startClock(tick.C, func() int64 { return time.Now().UnixMicro() }, tick.Stop)
}

// startClock starts a clock that reads now (µs) at once and at every tick
// that ticks delivers, until Close is called, which then calls stop.
func startClock(ticks <-chan time.Time, now func() int64, stop func()) *Clock {
	c := &Clock{stop: make(chan struct{}), done: make(chan struct{})}
	c.us.Store(now())
	go c.run(ticks, now, stop)
	return c
}

func (c *Clock) run(ticks <-chan time.Time, now func() int64, stop func()) {
	defer close(c.done)
	defer stop()
	for {
		select {
		case <-c.stop:
			return
		case <-ticks:
			// The tick's own time may be stale if this goroutine ran late.
			c.advance(now())
		}
	}
}

// advance moves the clock to us if that is later than its reading. Only the
// clock's goroutine writes, so a load and a store suffice.
func (c *Clock) advance(us int64) {
	if us > c.us.Load() {
		c.us.Store(us)
	}
}

// Now returns the clock's reading in microseconds since the Unix epoch.
func (c *Clock) Now() int64 { return c.us.Load() }

// Close stops the clock's goroutine and waits for it to end. It is safe to
// call more than once.
func (c *Clock) Close() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}
