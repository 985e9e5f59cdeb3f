package persecond

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// newMemory returns a memory store by the clock now, closed when the test
// ends.
func newMemory(t *testing.T, now func() time.Time) *memory.Store {
	t.Helper()
	m, err := memory.New(memory.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestConformance runs the store suite on a Store over two memory
// stores: routing changes no decision.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
		s, err := New(newMemory(t, now), newMemory(t, now), Config{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

var (
	t0     = time.Date(2026, 3, 14, 12, 30, 30, 0, time.UTC)
	second = sluice.Limit{Rate: 2, Period: time.Second}           // short
	hour   = sluice.Limit{Rate: 10, Period: time.Hour}            // long
	minute = sluice.Limit{Rate: 10, Period: time.Minute}          // long: not below a minute
	sub    = sluice.Limit{Rate: 5, Period: 59 * time.Second}      // short
	gcra   = sluice.Limit{Rate: 5, Period: 10 * time.Millisecond} // short
)

// remaining returns what key has left under l in st, by a report.
func remaining(t *testing.T, st sluice.Store, key string, l sluice.Limit) int64 {
	t.Helper()
	d, err := sluice.Take(context.Background(), st, key, l, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// TestRoute checks where each limit's state is kept, and what a TakeAll
// over both stores decides and takes: the short store first; when it
// denies, the long store's decisions are what it would have decided, and
// nothing is taken there; when the long store denies, the short store's
// hits stay taken.
func TestRoute(t *testing.T) {
	t.Parallel()
	now := func() time.Time { return t0 }
	short, long := newMemory(t, now), newMemory(t, now)
	s, err := New(short, long, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tt := range []struct {
		l       sluice.Limit
		inShort bool
	}{{second, true}, {sub, true}, {gcra, true}, {minute, false}, {hour, false}} {
		key := "where/" + tt.l.String() // a key per limit
		if d, err := sluice.Take(ctx, s, key, tt.l, 1); err != nil || !d.Allowed {
			t.Fatalf("Take %v = %+v, %v", tt.l, d, err)
		}
		in, out := long, short
		if tt.inShort {
			in, out = short, long
		}
		if got := remaining(t, in, key, tt.l); got != tt.l.Capacity()-1 {
			t.Errorf("limit %v: %d left in its store, want %d", tt.l, got, tt.l.Capacity()-1)
		}
		if got := remaining(t, out, key, tt.l); got != tt.l.Capacity() {
			t.Errorf("limit %v: %d left in the other store, want it untouched (%d)", tt.l, got, tt.l.Capacity())
		}
	}

	mixed := func(key string) []sluice.Request {
		return []sluice.Request{
			{Key: key + "/hour", Limit: hour, Cost: 3, Group: key},
			{Key: key + "/second", Limit: second, Cost: 1, Group: key},
			{Key: key + "/minute", Limit: minute, Cost: 2, Group: key},
		}
	}
	ds := make([]sluice.Decision, 3)
	// Both allow: all taken, decisions in the requests' order.
	if err := s.TakeAll(ctx, mixed("a"), ds); err != nil {
		t.Fatal(err)
	}
	if !ds[0].Allowed || ds[0].Remaining != 7 || !ds[1].Allowed || ds[1].Remaining != 1 || !ds[2].Allowed || ds[2].Remaining != 8 {
		t.Fatalf("TakeAll of fresh keys = %+v, want all allowed, 7, 1 and 8 left", ds)
	}

	// The short store denies: the long store takes nothing, and reports
	// what it would have decided (with its hits taken).
	if d, err := sluice.Take(ctx, s, "b/second", second, 2); err != nil || !d.Allowed {
		t.Fatalf("exhausting b/second: %+v, %v", d, err)
	}
	if err := s.TakeAll(ctx, mixed("b"), ds); err != nil {
		t.Fatal(err)
	}
	if ds[1].Allowed || !ds[0].Allowed || ds[0].Remaining != 7 || !ds[2].Allowed || ds[2].Remaining != 8 {
		t.Fatalf("TakeAll with the per-second key exhausted = %+v, want it denied and the others allowed with 7 and 8 left", ds)
	}
	if a, b := remaining(t, long, "b/hour", hour), remaining(t, long, "b/minute", minute); a != 10 || b != 10 {
		t.Errorf("after a denied TakeAll the long keys have %d and %d left, want 10 and 10: nothing taken", a, b)
	}
	if got := remaining(t, long, denialKey, denial("").Limit); got != 1 {
		t.Errorf("the denial's key has %d left, want 1: never a state", got)
	}

	// The long store denies: the short store's hit stays taken.
	if d, err := sluice.Take(ctx, s, "c/minute", minute, 10); err != nil || !d.Allowed {
		t.Fatalf("exhausting c/minute: %+v, %v", d, err)
	}
	if err := s.TakeAll(ctx, mixed("c"), ds); err != nil {
		t.Fatal(err)
	}
	if ds[2].Allowed || !ds[1].Allowed {
		t.Fatalf("TakeAll with the minute key exhausted = %+v, want it denied, the second allowed", ds)
	}
	if a, b := remaining(t, long, "c/hour", hour), remaining(t, short, "c/second", second); a != 10 || b != 1 {
		t.Errorf("after the long store denied: c/hour has %d left (want 10), c/second %d (want 1: the short hit stays)", a, b)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	m := newMemory(t, nil)
	if _, err := New(nil, m, Config{}); err == nil {
		t.Error("New with a nil store: no error")
	}
	if _, err := New(m, m, Config{Below: -time.Second}); err == nil {
		t.Error("New with a negative Below: no error")
	}
	s, err := New(m, m, Config{Below: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if s.Short(second) || !s.Short(gcra) {
		t.Errorf("Below 1s: a 1s limit short %v, a 10ms one %v; want false, true", s.Short(second), s.Short(gcra))
	}
}
