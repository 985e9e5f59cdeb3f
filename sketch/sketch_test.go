package sketch

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestZipf checks the stated bound on a Zipf stream of a million requests
// over 100,000 clients: the 10 heaviest are the top 10 listed, and every
// estimate is at least the true count and at most ErrorBound above it.
func TestZipf(t *testing.T) {
	t.Parallel()
	c, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	// a and b, siblings, count the same stream split between them (a third
	// to b, as denials might be): TopOf(a, b) must answer as c does.
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := a.Sibling()
	const requests, clients = 1_000_000, 100_000
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, clients-1)
	exact := map[string]uint64{}
	names := make([]string, clients)
	for i := range names {
		names[i] = fmt.Sprintf("2001:db8::%x", i*7919)
	}
	for i := range requests {
		v := names[z.Uint64()]
		exact[v]++
		// A million requests spread over 40 s: four fine slots.
		at := t0.Add(time.Duration(i) * 40 * time.Second / requests)
		c.Add(at, v)
		if i%3 == 0 {
			b.Add(at, v)
		} else {
			a.Add(at, v)
		}
	}
	now := t0.Add(40 * time.Second)
	want := make([]string, 0, len(exact))
	for v := range exact {
		want = append(want, v)
	}
	slices.SortFunc(want, func(a, b string) int { return int(exact[b]) - int(exact[a]) })
	want = want[:10]

	for _, w := range []time.Duration{Minute, Hour, -Minute, -Hour} {
		var top Top
		var err error
		if w > 0 {
			top, err = c.Top(now, w, 10)
		} else {
			w = -w
			top, err = TopOf(now, w, 10, a, b)
		}
		if err != nil {
			t.Fatal(err)
		}
		if top.Total != requests {
			t.Errorf("%v: total %d, want %d", w, top.Total, requests)
		}
		if wantBound := uint64(2655); top.ErrorBound != wantBound { // ceil(e/1024 x 1e6)
			t.Errorf("%v: bound %d, want %d", w, top.ErrorBound, wantBound)
		}
		var got []string
		for _, h := range top.Hits {
			got = append(got, h.Value)
			if ex := exact[h.Value]; h.Count < ex || h.Count > ex+top.ErrorBound {
				t.Errorf("%v: %s estimated %d, true %d, bound %d", w, h.Value, h.Count, ex, top.ErrorBound)
			}
		}
		slices.Sort(got)
		w10 := slices.Clone(want)
		slices.Sort(w10)
		if !slices.Equal(got, w10) {
			t.Errorf("%v: top 10 %v, want %v", w, got, w10)
		}
		t.Logf("%v: top %s %d (true %d), 10th true %d, bound %d at %.3f", w, top.Hits[0].Value, top.Hits[0].Count, exact[top.Hits[0].Value], exact[want[9]], top.ErrorBound, top.Confidence)
	}
}

// TestWindows checks that counts leave the minute window after a minute
// and the hour window after an hour.
func TestWindows(t *testing.T) {
	t.Parallel()
	c, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c.Add(t0, "a")
	}
	for range 3 {
		c.Add(t0.Add(30*time.Second), "b")
	}
	count := func(now time.Time, w time.Duration, v string) uint64 {
		t.Helper()
		top, err := c.Top(now, w, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range top.Hits {
			if h.Value == v {
				return h.Count
			}
		}
		return 0
	}
	for _, tc := range []struct {
		name string
		at   time.Duration
		w    time.Duration
		v    string
		want uint64
	}{
		{"a in the minute", 45 * time.Second, Minute, "a", 5},
		{"a gone from the minute", 65 * time.Second, Minute, "a", 0},
		{"b still in the minute", 65 * time.Second, Minute, "b", 3},
		{"a in the hour", 65 * time.Second, Hour, "a", 5},
		{"b in the hour", 30 * time.Minute, Hour, "b", 3},
		{"a gone from the hour", 61 * time.Minute, Hour, "a", 0},
	} {
		if got := count(t0.Add(tc.at), tc.w, tc.v); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if _, err := c.Top(t0, time.Second, 1); err != ErrWindow {
		t.Errorf("Top(1s) = %v, want ErrWindow", err)
	}
}

func TestTruncated(t *testing.T) {
	t.Parallel()
	c, err := New(Config{ValueBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 20)
	c.Add(t0, long)
	top, _ := c.Top(t0, Minute, 1)
	if len(top.Hits) != 1 || top.Hits[0].Value != long[:8] || !top.Hits[0].Truncated {
		t.Fatalf("hits %+v, want %q truncated", top.Hits, long[:8])
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{{Width: -1}, {Width: MaxWidth + 1}, {Depth: 17}, {TopK: -2}, {ValueBytes: 256}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	c, err := New(Config{Width: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Width != 1024 {
		t.Errorf("width %d, want 1024", c.cfg.Width)
	}
	if b := c.Bytes(); b < 12*4*1024*4 || b > 12*4*1024*4+20000 {
		t.Errorf("Bytes %d, want about %d", b, 12*4*1024*4)
	}
}

func BenchmarkAdd(b *testing.B) {
	c, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, 1<<16)
	for i := range names {
		names[i] = fmt.Sprintf("10.0.%d.%d", i>>8, i&255)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		c.Add(t0.Add(time.Duration(i)*time.Microsecond), names[i&(1<<16-1)])
	}
}
