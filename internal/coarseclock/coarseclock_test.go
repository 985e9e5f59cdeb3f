package coarseclock

import (
	"testing"
	"time"
)

// TestCoarseClock drives the coarse clock's goroutine with ticks and a
// system clock of its own: it reads the clock at start and at each tick,
// and never goes back when the system clock does.
func TestCoarseClock(t *testing.T) {
	readings := []int64{100, 200, 150, 300, 300, 250, 301}
	ticks := make(chan time.Time) // unbuffered: a send returns once the goroutine takes it
	next := 0
	now := func() int64 { v := readings[next]; next++; return v }
	stopped := false
	c := startClock(ticks, now, func() { stopped = true })
	if got := c.Now(); got != 100 {
		t.Fatalf("at start: %d, want 100", got)
	}
	high := int64(100)
	for k := 1; k < len(readings); k++ {
		ticks <- time.Time{}
		// The goroutine has taken tick k; it has applied every tick
		// before it, and applies this one at most.
		got := c.Now()
		if got < high || got > max(high, readings[k]) {
			t.Fatalf("after tick %d: %d, want between %d and %d", k, got, high, max(high, readings[k]))
		}
		high = max(high, readings[k])
	}
	c.Close()
	c.Close() // a second close is harmless
	if got, want := c.Now(), int64(301); got != want {
		t.Fatalf("after the last tick: %d, want %d", got, want)
	}
	if !stopped {
		t.Fatal("close did not stop the ticker")
	}
}

// TestCoarseClockStartsAtNow checks that the real clock starts at the
// system clock's time.
func TestCoarseClockStartsAtNow(t *testing.T) {
	before := time.Now().UnixMicro()
	c := New(time.Hour) // no tick during the test
	defer c.Close()
	if got, after := c.Now(), time.Now().UnixMicro(); got < before || got > after {
		t.Fatalf("the clock starts at %d, outside [%d, %d]", got, before, after)
	}
}

func TestAdvanceNeverGoesBack(t *testing.T) {
	for _, tc := range []struct {
		name            string
		from, set, want int64
	}{
		{"forward", 0, 100, 100},
		{"back", 100, 50, 100},
		{"same", 100, 100, 100},
		{"forward again", 100, 101, 101},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &Clock{}
			c.us.Store(tc.from)
			c.advance(tc.set)
			if got := c.Now(); got != tc.want {
				t.Fatalf("at %d, after advance(%d): %d, want %d", tc.from, tc.set, got, tc.want)
			}
		})
	}
}
