package observe

import (
	"sync"
	"sync/atomic"
	"time"
)

// clockResolution is how often the Decider's own clock reads the system
// clock: the windows' slots are 10 s, so a reading up to 100 ms late
// places a count in the wrong slot only within 100 ms of a slot's end,
// and reading the system clock for every decision would cost more than
// the rest of the counting (about 50 ns of 125 on the machine measured).
const clockResolution = 100 * time.Millisecond

// coarseClock is a clock read from an atomic, which a goroutine moves
// every clockResolution until close.
type coarseClock struct {
	ns   atomic.Int64
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newCoarseClock() *coarseClock {
	c := &coarseClock{stop: make(chan struct{}), done: make(chan struct{})}
	c.ns.Store(time.Now().UnixNano())
	tick := time.NewTicker(clockResolution)
	go func() {
		defer close(c.done)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
				c.ns.Store(time.Now().UnixNano())
			}
		}
	}()
	return c
}

func (c *coarseClock) now() time.Time { return time.Unix(0, c.ns.Load()) }

func (c *coarseClock) close() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}
