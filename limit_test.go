package sluice_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		limit sluice.Limit
		field string // "" when valid
		msg   string
	}{
		{"fixed window", sluice.Limit{Rate: 100, Period: time.Second}, "", ""},
		{"token bucket with burst", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 30, Period: time.Second, Burst: 100}, "", ""},
		{"zero rate", sluice.Limit{Period: time.Second}, "Rate", "at least 1"},
		{"negative rate", sluice.Limit{Rate: -5, Period: time.Second}, "Rate", "got -5"},
		{"zero period", sluice.Limit{Rate: 1}, "Period", "positive"},
		{"sub-microsecond period", sluice.Limit{Rate: 1, Period: 1500 * time.Nanosecond}, "Period", "whole microseconds"},
		{"negative burst", sluice.Limit{Algorithm: sluice.GCRA, Rate: 1, Period: time.Second, Burst: -1}, "Burst", "at least 1"},
		{"burst on a window", sluice.Limit{Rate: 1, Period: time.Second, Burst: 5}, "Burst", "fixed_window has no burst"},
		{"unknown algorithm", sluice.Limit{Algorithm: 42, Rate: 1, Period: time.Second}, "Algorithm", "unknown"},
		{"overflowing product", sluice.Limit{Rate: 1 << 40, Period: 24 * time.Hour}, "Rate", "too large"},
		{"gcra faster than a microsecond", sluice.Limit{Algorithm: sluice.GCRA, Rate: 2000, Period: time.Millisecond}, "Rate", "one hit per microsecond"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.limit.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var fe *sluice.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Validate = %v, want a %s error containing %q", err, tt.field, tt.msg)
			}
		})
	}
}

func TestCapacity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		limit sluice.Limit
		want  int64
	}{
		{"window: the rate", sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 100, Period: time.Minute}, 100},
		{"bucket without burst: the rate", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 30, Period: time.Second}, 30},
		{"token bucket: the burst", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 30, Period: time.Second, Burst: 100}, 100},
		{"leaky bucket: the burst", sluice.Limit{Algorithm: sluice.LeakyBucket, Rate: 5, Period: time.Second, Burst: 2}, 2},
		{"gcra: the burst", sluice.Limit{Algorithm: sluice.GCRA, Rate: 10, Period: time.Second, Burst: 3}, 3},
		{"burst on a window (invalid): the rate", sluice.Limit{Rate: 10, Period: time.Second, Burst: 50}, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.limit.Capacity(); got != tt.want {
				t.Fatalf("Capacity() = %d, want %d", got, tt.want)
			}
			if tt.limit.Validate() != nil {
				return
			}
			var s sluice.State
			if d := tt.limit.Take(&s, time.Unix(0, 0), 0); d.Limit != tt.want {
				t.Fatalf("Take's Decision.Limit = %d, want Capacity %d", d.Limit, tt.want)
			}
		})
	}
}

func TestParseLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want sluice.Limit
		err  string
	}{
		{in: "100/s", want: sluice.Limit{Rate: 100, Period: time.Second}},
		{in: "100/second", want: sluice.Limit{Rate: 100, Period: time.Second}},
		{in: "100/5m sliding_window", want: sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 100, Period: 5 * time.Minute}},
		{in: "30/1s token_bucket burst=100", want: sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 30, Period: time.Second, Burst: 100}},
		{in: "  3/d  ", want: sluice.Limit{Rate: 3, Period: 24 * time.Hour}},
		{in: "20/1m30s gcra", want: sluice.Limit{Algorithm: sluice.GCRA, Rate: 20, Period: 90 * time.Second}},
		{in: "", err: "empty"},
		{in: "100", err: "want RATE/PERIOD"},
		{in: "x/s", err: "not a whole number"},
		{in: "100/fortnight", err: `period "fortnight"`},
		{in: "100/s bogus", err: "unknown algorithm"},
		{in: "100/s gcra burst=x", err: "burst"},
		{in: "100/s gcra burst=0", err: "at least 1"},
		{in: "0/s", err: "at least 1"},
		{in: "10/s burst=5", err: "no burst"},
		{in: "1/99999999999999999d", err: "too long"},
		{in: "100/m sliding_window precision=10", want: sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 100, Period: time.Minute, Precision: 10}},
		{in: "100/s sliding_window precision=0", err: "between 1 and 60"},
		{in: "100/h sliding_window precision=61", err: "between 1 and 60"},
		{in: "100/s sliding_window precision=x", err: "not a whole number"},
		{in: "100/s precision=2", err: "precision is for sliding_window"},
		{in: "100/s sliding_window precision=3", err: "use 2 or 4"},
		{in: "100/7us sliding_window precision=2", err: "use 7"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := sluice.ParseLimit(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseLimit(%q) = %v, %v; want error containing %q", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseLimit(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestAlgorithmText(t *testing.T) {
	t.Parallel()
	for a := sluice.FixedWindow; a <= sluice.GCRA; a++ {
		b, err := a.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back sluice.Algorithm
		if err := back.UnmarshalText(b); err != nil || back != a {
			t.Fatalf("%v: round trip gave %v, %v", a, back, err)
		}
	}
	if _, err := sluice.Algorithm(99).MarshalText(); err == nil {
		t.Fatal("MarshalText of an unknown algorithm succeeded")
	}
}

func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"100/s", "30/1s token_bucket burst=100", "5/5m sliding_window", "5/5m sliding_window precision=6", "1/1us gcra", "9/-1s", "/", "1/1e9h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := sluice.ParseLimit(s)
		if err != nil {
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("ParseLimit(%q) returned an invalid limit %+v: %v", s, l, err)
		}
		back, err := sluice.ParseLimit(l.String())
		if err != nil || back != l {
			t.Fatalf("String %q does not parse back to %+v: %+v, %v", l.String(), l, back, err)
		}
	})
}

// FuzzTake drives any valid limit with arbitrary times and costs and checks
// what every decision promises.
func FuzzTake(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(1000000), int64(0), []byte{0, 1, 5, 200, 3, 9})
	f.Add(uint8(3), int64(30), int64(1000000), int64(100), []byte{255, 0, 0, 7, 7, 7})
	f.Add(uint8(5), int64(3), int64(1000000), int64(2), []byte{1, 1, 1, 1})
	f.Add(uint8(2), int64(2), int64(999), int64(0), []byte{9, 8, 7, 6, 5, 4, 3, 2, 1})
	f.Fuzz(func(t *testing.T, alg uint8, rate, periodUs, burst int64, ops []byte) {
		l := sluice.Limit{Algorithm: sluice.Algorithm(alg % 6), Rate: rate, Period: time.Duration(periodUs) * time.Microsecond, Burst: burst}
		if l.Validate() != nil {
			var s sluice.State // an invalid limit must not panic either
			for i := range ops {
				l.TakeMicros(&s, t0.UnixMicro()+int64(i)*periodUs/3, int64(ops[i])-100)
			}
			return
		}
		capacity := l.Capacity()
		var s sluice.State
		now := t0.UnixMicro()
		for i := 0; i+1 < len(ops); i += 2 {
			now += (int64(int8(ops[i])) * periodUs) / 64 // forwards and backwards
			cost := int64(ops[i+1]) % (capacity + 2)
			d := l.TakeMicros(&s, now, cost)
			switch {
			case d.Limit != capacity:
				t.Fatalf("Limit %d, want %d", d.Limit, capacity)
			case d.Remaining < 0 || d.Remaining > capacity:
				t.Fatalf("Remaining %d out of [0, %d]", d.Remaining, capacity)
			case d.ResetAfter < 0 || d.Wait < 0:
				t.Fatalf("negative duration in %+v", d)
			case d.Allowed && d.RetryAfter != 0:
				t.Fatalf("allowed with RetryAfter %v", d.RetryAfter)
			case !d.Allowed && d.RetryAfter <= 0:
				t.Fatalf("denied with RetryAfter %v", d.RetryAfter)
			case !d.Allowed && cost > capacity && d.RetryAfter != sluice.Never:
				t.Fatalf("cost %d above capacity %d with RetryAfter %v", cost, capacity, d.RetryAfter)
			}
		}
	})
}

func ExampleLimit_Take() {
	// 30 requests a second with bursts to 100.
	l := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 30, Period: time.Second, Burst: 100}
	if err := l.Validate(); err != nil {
		panic(err)
	}
	var s sluice.State // one client's state; a sluice.Store keeps many
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fmt.Println(l.Take(&s, now, 100).Allowed) // the whole burst at once
	d := l.Take(&s, now, 1)
	fmt.Println(d.Allowed, d.RetryAfter) // then one every 1/30 s
	fmt.Println(l.Take(&s, now.Add(time.Second), 30).Allowed)
	// Output:
	// true
	// false 33.334ms
	// true
}
