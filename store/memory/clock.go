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

// newCoarseClock starts a clock that ticks every resolution. Its goroutine
// runs until stop is called.
func newCoarseClock(resolution time.Duration) *coarseClock {
	c := &coarseClock{stop: make(chan struct{}), done: make(chan struct{})}
	c.us.Store(time.Now().UnixMicro())
	go c.run(resolution)
	return c
}

func (c *coarseClock) run(resolution time.Duration) {
	defer close(c.done)
	tick := time.NewTicker(resolution)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
			// The tick's own time may be stale if this goroutine ran late.
			c.advance(time.Now().UnixMicro())
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
