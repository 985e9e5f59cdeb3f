package clocktest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := New(t0)
	if got := c.Now(); !got.Equal(t0) || got.Location() != time.UTC {
		t.Fatalf("New(t0).Now() = %v", got)
	}
	c.Advance(1500 * time.Nanosecond)
	if got := c.Now(); !got.Equal(t0.Add(1500)) {
		t.Fatalf("after Advance: %v", got)
	}
	c.Set(t0.Add(-time.Hour))
	if got := c.Now(); !got.Equal(t0.Add(-time.Hour)) {
		t.Fatalf("after Set back: %v", got)
	}
	if err := c.Sleep(context.Background(), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := c.Now(); !got.Equal(t0.Add(-time.Hour + 2*time.Second)) {
		t.Fatalf("after Sleep: %v", got)
	}
	refuse := errors.New("refused")
	c.BeforeSleep = func(context.Context) error { return refuse }
	if err := c.Sleep(context.Background(), time.Minute); !errors.Is(err, refuse) {
		t.Fatalf("Sleep with BeforeSleep refusing: %v", err)
	}
	if got, want := c.Slept(), []time.Duration{2 * time.Second}; !slices.Equal(got, want) {
		t.Fatalf("Slept() = %v, want %v", got, want)
	}
	if got := (&Clock{}).Now(); !got.Equal(time.Unix(0, 0)) {
		t.Fatalf("the zero Clock reads %v", got)
	}
}

// TestClockConcurrent moves and reads one clock from many goroutines (run
// with -race).
func TestClockConcurrent(t *testing.T) {
	c := New(time.Unix(0, 0))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				c.Advance(time.Microsecond)
				_ = c.Now()
				if err := c.Sleep(context.Background(), time.Microsecond); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if got, want := c.Now(), time.Unix(0, 0).Add(16000*time.Microsecond); !got.Equal(want) {
		t.Fatalf("after 16,000 µs of moves: %v, want %v", got, want)
	}
	if n := len(c.Slept()); n != 8000 {
		t.Fatalf("%d sleeps recorded, want 8000", n)
	}
}
