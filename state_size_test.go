package sluice_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestStateHeapBytes(t *testing.T) {
	l := sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 100, Period: time.Second}
	var s sluice.State
	if n := s.HeapBytes(); n != 0 {
		t.Fatalf("a fresh state holds %d bytes", n)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prev := int64(0)
	for i := range 50 {
		l.Take(&s, now.Add(time.Duration(i)*time.Millisecond), 1)
		n := s.HeapBytes()
		if n < int64(i+1)*16 || n < prev {
			t.Fatalf("after %d logged requests: %d bytes (before %d)", i+1, n, prev)
		}
		prev = n
	}
	l.Take(&s, now.Add(time.Hour), 0) // the log empties
	if n := s.HeapBytes(); n != 0 {
		t.Fatalf("an emptied log still holds %d bytes", n)
	}
	tb := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 100, Period: time.Second}
	var b sluice.State
	tb.Take(&b, now, 1)
	if n := b.HeapBytes(); n != 0 {
		t.Fatalf("a token bucket state holds %d bytes", n)
	}
}
