package shed_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/clocktest"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/shed"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// TestPriorities: at a fixed limit of 4 (1 kept from sheddable traffic),
// sheddable requests are shed once 3 are in flight, critical and default
// ones wait, and freed slots go to critical first, first in first out.
func TestPriorities(t *testing.T) {
	t.Parallel()
	g, err := shed.New(shed.Config{InitialLimit: 4, MinLimit: 4, MaxLimit: 4, MaxWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var held []shed.Ticket
	for range 3 {
		tk, err := g.Acquire(ctx, shed.Sheddable)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, tk)
	}
	if _, err := g.Acquire(ctx, shed.Sheddable); !errors.Is(err, shed.ErrShed) {
		t.Fatalf("a 4th sheddable: %v, want ErrShed (the reserve)", err)
	}
	tk, err := g.Acquire(ctx, shed.Default) // the reserve's slot
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, tk)
	// Full: default and critical wait, in this order of arrival.
	order := make(chan string, 4)
	got := make(chan shed.Ticket, 4)
	wait := func(name string, p shed.Priority) {
		tk, err := g.Acquire(ctx, p)
		if err != nil {
			t.Error(err)
			return
		}
		order <- name
		got <- tk
	}
	for i, w := range []struct {
		name string
		p    shed.Priority
	}{{"default1", shed.Default}, {"critical1", shed.Critical}, {"default2", shed.Default}, {"critical2", shed.Critical}} {
		go wait(w.name, w.p)
		testenv.WaitFor(t, "a waiter queued", func() bool { return g.Stats().Waiting == i+1 })
	}
	if _, err := g.Acquire(ctx, shed.Sheddable); !errors.Is(err, shed.ErrShed) {
		t.Fatalf("sheddable beside waiters: %v, want ErrShed", err)
	}
	if !g.Stats().Saturated() {
		t.Fatal("not saturated with waiters")
	}
	var seen []string
	for _, tk := range held {
		tk.Done(false)
		seen = append(seen, <-order)
	}
	want := []string{"critical1", "critical2", "default1", "default2"}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("served %v, want %v", seen, want)
		}
	}
	st := g.Stats()
	if st.InFlight != 4 || st.Waiting != 0 || st.Shed[shed.Sheddable] != 2 || st.Admitted[shed.Critical] != 2 {
		t.Fatalf("stats %+v", st)
	}
	for range 4 {
		(<-got).Drop()
	}
	// A waiter whose time runs out is shed.
	g2, _ := shed.New(shed.Config{InitialLimit: 1, MinLimit: 1, MaxLimit: 1, MaxWait: time.Millisecond})
	tk, _ = g2.Acquire(ctx, shed.Critical)
	if _, err := g2.Acquire(ctx, shed.Critical); !errors.Is(err, shed.ErrShed) {
		t.Fatalf("past MaxWait: %v, want ErrShed", err)
	}
	tk.Done(false)
	if st := g2.Stats(); st.Waiting != 0 || st.InFlight != 0 || st.Shed[shed.Critical] != 1 {
		t.Fatalf("after a timed-out wait: %+v", st)
	}
}

// TestLaw: latency at its least grows the limit, latency that shows
// queueing shrinks it, and errors cut it.
func TestLaw(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(t0)
	g, err := shed.New(shed.Config{InitialLimit: 10, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// window runs n requests of latency rtt, all in flight together.
	window := func(n int, rtt time.Duration, failed bool) {
		tks := make([]shed.Ticket, 0, n)
		for range n {
			tk, err := g.Acquire(ctx, shed.Critical)
			if err != nil {
				t.Fatal(err)
			}
			tks = append(tks, tk)
		}
		clk.Advance(rtt)
		for _, tk := range tks {
			tk.Done(failed)
		}
	}
	window(10, 10*time.Millisecond, false) // minRTT 10ms, no queueing
	if l := g.Stats().Limit; l != 11 {
		t.Fatalf("after an unqueued window: limit %d, want 11", l)
	}
	for range 5 {
		window(g.Stats().Limit, 10*time.Millisecond, false)
	}
	if l := g.Stats().Limit; l != 16 {
		t.Fatalf("after 5 more: limit %d, want 16", l)
	}
	// Latency 3x: queued = 16 x 2/3 ≈ 10.7 > 4: down by (10.7-4)/2.
	window(16, 30*time.Millisecond, false)
	if l := g.Stats().Limit; l >= 14 {
		t.Fatalf("after a queued window: limit %d, want below 14", l)
	}
	before := g.Stats().Limit
	window(max(before, 8), 10*time.Millisecond, true)
	if l := g.Stats().Limit; l >= before || l < int(float64(before)*0.9)-1 {
		t.Fatalf("after a failed window: limit %d, want about 0.9 x %d", l, before)
	}
	// An idle upstream (fewer in flight than half the limit) does not
	// grow it.
	before = g.Stats().Limit
	for range before {
		window(1, 10*time.Millisecond, false)
	}
	if l := g.Stats().Limit; l != before {
		t.Fatalf("idle: limit %d, want %d", l, before)
	}
	if _, err := shed.New(shed.Config{MinLimit: 5, MaxLimit: 2}); err == nil {
		t.Fatal("MinLimit above MaxLimit accepted")
	}
}

// TestHasRoom: the upstream has room while even a sheddable request
// would go in at once: below the limit less its reserve, nobody waiting.
func TestHasRoom(t *testing.T) {
	t.Parallel()
	var none *shed.Gate
	if !none.HasRoom() {
		t.Error("a nil Gate has no room")
	}
	g, err := shed.New(shed.Config{InitialLimit: 10, MinLimit: 10, MaxLimit: 10, ReservePercent: 20})
	if err != nil {
		t.Fatal(err)
	}
	var ts []shed.Ticket
	for i := range 8 {
		if !g.HasRoom() {
			t.Fatalf("no room with %d of 10 in flight (8 for sheddable)", i)
		}
		tk, err := g.Acquire(context.Background(), shed.Critical)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tk)
	}
	if g.HasRoom() {
		t.Error("room with 8 of 10 in flight, the rest reserved")
	}
	ts[0].Drop()
	if !g.HasRoom() {
		t.Error("no room with 7 of 10 in flight")
	}
}
