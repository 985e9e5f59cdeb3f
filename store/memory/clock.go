package memory

import (
	"sync"
	"sync/atomic"
	"time"
)

// coarseClock is a clock that a goroutine of its own advances every
// resolution, so that reading it costs one atomic load instead of a system
// call. Its readings are microseconds since the Unix epoch, at most about one
// resolution behind time.Now, and never decrease: a wall clock that steps
// back holds it still until the wall clock catches up.
type coarseClock struct {
	us   atomic.Int64
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// newCoarseClock starts a clock that reads the system clock every
// resolution. Its goroutine runs until close is called.
func newCoarseClock(resolution time.Duration) *coarseClock {
	tick := time.NewTicker(resolution)
	return startClock(tick.C, func() int64 { return time.Now().UnixMicro() }, tick.Stop)
}

// startClock starts a clock that reads now (µs) at once and at every tick
// that ticks delivers, until close is called, which then calls stop.
func startClock(ticks <-chan time.Time, now func() int64, stop func()) *coarseClock {
	c := &coarseClock{stop: make(chan struct{}), done: make(chan struct{})}
	c.us.Store(now())
	go c.run(ticks, now, stop)
	return c
}

func (c *coarseClock) run(ticks <-chan time.Time, now func() int64, stop func()) {
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
func (c *coarseClock) advance(us int64) {
	if us > c.us.Load() {
		c.us.Store(us)
	}
}

// now returns the clock's reading in microseconds since the Unix epoch.
func (c *coarseClock) now() int64 { return c.us.Load() }

// close stops the clock's goroutine and waits for it to end. It is safe to
// call more than once.
func (c *coarseClock) close() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}
