// Package clocktest is the fake clock of sluice's tests: a time that tests
// set and advance by hand, never by waiting, and a Sleep that advances it
// instead of sleeping.
package clocktest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is a fake clock. It is safe for concurrent use; the zero value
// reads the Unix epoch. Now, Set and Advance are lock-free, so a store
// may read it on its hot path.
type Clock struct {
	ns atomic.Int64 // nanoseconds since the Unix epoch

	mu    sync.Mutex
	slept []time.Duration
	// BeforeSleep, if set before the clock is shared, runs at the start
	// of each Sleep; an error it returns is Sleep's, and the clock does
	// not move.
	BeforeSleep func(ctx context.Context) error
}

// New returns a clock that reads t.
func New(t time.Time) *Clock {
	c := new(Clock)
	c.Set(t)
	return c
}

// Now returns the clock's time, in UTC.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Set moves the clock to t, forwards or back.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// Advance moves the clock d later (earlier when d is negative).
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Sleep advances the clock by d instead of waiting, and records d, as a
// caller that waits on the clock would see the time pass. It returns at
// once, with BeforeSleep's error if any.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	if f := c.BeforeSleep; f != nil {
		if err := f(ctx); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.slept = append(c.slept, d)
	c.mu.Unlock()
	c.Advance(d)
	return nil
}

// Slept returns the durations Sleep was called with, in order.
func (c *Clock) Slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.slept...)
}
