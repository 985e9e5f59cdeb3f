// Package sluice is the vocabulary of the sluice rate limiter: a Limit (an
// algorithm, a rate per period and a burst), the Decision a limit takes on a
// request, the per-key State the algorithms transform, and the Store
// interface that keeps those states for many keys.
//
// The algorithms are pure state transitions: they do no I/O, start no
// goroutines and read no clock. The caller passes the time, as with
// golang.org/x/time/rate. Time is kept at microsecond resolution, the
// resolution of Redis's TIME command, so that every store can reproduce the
// same decisions.
package sluice

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Algorithm names a rate limiting algorithm. The zero value is FixedWindow,
// the algorithm of Envoy's ratelimit service.
type Algorithm uint8

// The algorithms. Each is described at its transition function.
const (
	FixedWindow   Algorithm = iota // counter per window aligned to the Unix epoch
	SlidingWindow                  // sliding window counter: weighted previous window + current
	SlidingLog                     // exact log of admitted hits
	TokenBucket                    // bucket of Burst tokens refilled at Rate per Period
	LeakyBucket                    // queue of Burst drained at Rate per Period
	GCRA                           // generic cell rate algorithm (one timestamp per key)
	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{
	FixedWindow:   "fixed_window",
	SlidingWindow: "sliding_window",
	SlidingLog:    "sliding_log",
	TokenBucket:   "token_bucket",
	LeakyBucket:   "leaky_bucket",
	GCRA:          "gcra",
}

// String returns the algorithm's name as written in rules files, such as
// "token_bucket".
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// HasBurst reports whether the algorithm has a capacity separate from its
// rate: token_bucket, leaky_bucket and gcra.
func (a Algorithm) HasBurst() bool {
	return a == TokenBucket || a == LeakyBucket || a == GCRA
}

// ParseAlgorithm returns the algorithm named s ("fixed_window",
// "sliding_window", "sliding_log", "token_bucket", "leaky_bucket" or "gcra").
func ParseAlgorithm(s string) (Algorithm, error) {
	for a, name := range algorithmNames {
		if s == name {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", s, strings.Join(algorithmNames[:], ", "))
}

// MarshalText implements encoding.TextMarshaler.
func (a Algorithm) MarshalText() ([]byte, error) {
	if a >= numAlgorithms {
		return nil, fmt.Errorf("unknown algorithm %d", a)
	}
	return []byte(a.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Algorithm) UnmarshalText(b []byte) error {
	v, err := ParseAlgorithm(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Limit is a rate limit: Rate hits per Period, enforced by Algorithm. The
// zero value is not valid; call Validate before use.
//
// For token_bucket, leaky_bucket and gcra, Burst is the capacity: how many
// hits may pass at once after a quiet spell (a token bucket of 30 per second
// with burst 100 lets a client send 100 at once, then 30 a second). Zero
// means the rate. The window algorithms have no burst and reject one.
type Limit struct {
	Algorithm Algorithm
	Rate      int64         // hits per Period, at least 1
	Period    time.Duration // whole microseconds, at least 1µs
	Burst     int64         // capacity of the bucket algorithms; 0 means Rate
	// Precision is, for sliding_window, how many sub-windows the period is
	// cut into (1 to MaxPrecision, a divisor of the period in µs): the
	// estimate weighs only the oldest sub-window's count, so the more
	// sub-windows, the nearer the exact count, at 16 bytes of state each
	// (docs/rules.md states the bound). 0 means DefaultPrecision. The
	// other algorithms have none and reject one.
	Precision int64
}

// DefaultPrecision is a sliding_window's Precision when none is given: 1,
// the two-window counter (previous window weighted + current), whose state
// is three numbers and which every version of sluice has stored; the
// figures that chose it are in docs/algorithms.md.
const DefaultPrecision = 1

// MaxPrecision caps Limit.Precision: 60 sub-windows, a second each on a
// minute, whose estimate is off the exact count by at most one second's
// hits, while the state grows by 16 bytes a sub-window.
const MaxPrecision = 60

// SubWindows returns how many sub-windows a sliding_window limit cuts its
// period into: Precision, or DefaultPrecision when it is 0. It is 1 for
// the other algorithms.
func (l Limit) SubWindows() int64 {
	switch {
	case l.Algorithm != SlidingWindow:
		return 1
	case l.Precision == 0:
		return DefaultPrecision
	}
	return l.Precision
}

// cuts reports whether l's precision is valid for its period of p µs.
func (l Limit) cuts(p int64) bool {
	if l.Precision == 0 {
		return true
	}
	return l.Algorithm == SlidingWindow && l.Precision > 0 && l.Precision <= MaxPrecision && p%l.Precision == 0
}

// maxProduct bounds the products of counts and periods in microseconds that
// the algorithms compute, so that they fit in int64 and, up to 2^53, in the
// doubles of Redis's Lua.
const maxProduct = 1 << 62

// FieldError is a mistake in one field of a Limit.
type FieldError struct {
	Field  string // the Limit field, such as "Rate"
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Validate reports the first field of l that makes no sense, as a
// *FieldError: a rate or period that is zero or negative, a period that is
// not whole microseconds, a burst below 1 (other than the default 0) or on
// an algorithm without one, an unknown algorithm, or numbers so large that
// the algorithms' arithmetic would overflow.
func (l Limit) Validate() error {
	switch {
	case l.Algorithm >= numAlgorithms:
		return &FieldError{"Algorithm", fmt.Sprintf("unknown algorithm %d", l.Algorithm)}
	case l.Rate <= 0:
		return &FieldError{"Rate", fmt.Sprintf("must be at least 1, got %d", l.Rate)}
	case l.Period <= 0:
		return &FieldError{"Period", fmt.Sprintf("must be positive, got %v", l.Period)}
	case l.Period%time.Microsecond != 0:
		return &FieldError{"Period", fmt.Sprintf("must be whole microseconds, got %v", l.Period)}
	case l.Burst < 0:
		return &FieldError{"Burst", fmt.Sprintf("must be at least 1, got %d", l.Burst)}
	case l.Burst != 0 && !l.Algorithm.HasBurst():
		return &FieldError{"Burst", fmt.Sprintf("%s has no burst; use token_bucket, leaky_bucket or gcra", l.Algorithm)}
	case l.Precision != 0 && l.Algorithm != SlidingWindow:
		return &FieldError{"Precision", fmt.Sprintf("%s has no sub-windows; precision is for sliding_window", l.Algorithm)}
	case l.Precision < 0 || l.Precision > MaxPrecision:
		return &FieldError{"Precision", fmt.Sprintf("must be between 1 and %d, got %d", MaxPrecision, l.Precision)}
	}
	p := l.Period.Microseconds()
	if !l.cuts(p) {
		return &FieldError{"Precision", fmt.Sprintf("%d sub-windows do not cut %v into whole microseconds%s", l.Precision, l.Period, divisorsNear(p, l.Precision))}
	}
	if l.Rate > maxProduct/p || l.Capacity() > maxProduct/p {
		return &FieldError{"Rate", fmt.Sprintf("%d per %v is too large to compute exactly", max(l.Rate, l.Capacity()), l.Period)}
	}
	if l.Algorithm == GCRA && p < l.Rate {
		return &FieldError{"Rate", fmt.Sprintf("gcra emits at most one hit per microsecond; %d per %v is faster", l.Rate, l.Period)}
	}
	return nil
}

// divisorsNear suggests the precisions next to want that cut a period of p
// µs into whole microseconds, as ": use 4 or 6".
func divisorsNear(p, want int64) string {
	var lo, hi int64
	for d := want - 1; d >= 1 && lo == 0; d-- {
		if p%d == 0 {
			lo = d
		}
	}
	for d := want + 1; d <= MaxPrecision && hi == 0; d++ {
		if p%d == 0 {
			hi = d
		}
	}
	switch {
	case lo > 1 && hi > 0:
		return fmt.Sprintf(": use %d or %d", lo, hi)
	case hi > 0:
		return fmt.Sprintf(": use %d", hi)
	case lo > 0:
		return fmt.Sprintf(": use %d", lo)
	}
	return ""
}

// Capacity returns how many hits the limit admits at once: the burst of
// token_bucket, leaky_bucket and gcra (the rate when Burst is 0), the rate
// of the window algorithms. It is Decision.Limit for every decision of l.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 && l.Algorithm.HasBurst() {
		return l.Burst
	}
	return l.Rate
}

// String formats l in the syntax ParseLimit reads, such as
// "30/1s token_bucket burst=100" or "100/1m0s sliding_window precision=10".
func (l Limit) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(l.Rate, 10))
	b.WriteByte('/')
	b.WriteString(l.Period.String())
	if l.Algorithm != FixedWindow {
		b.WriteByte(' ')
		b.WriteString(l.Algorithm.String())
	}
	if l.Burst != 0 {
		b.WriteString(" burst=")
		b.WriteString(strconv.FormatInt(l.Burst, 10))
	}
	if l.Precision != 0 {
		b.WriteString(" precision=")
		b.WriteString(strconv.FormatInt(l.Precision, 10))
	}
	return b.String()
}

var unitPeriods = map[string]time.Duration{
	"us": time.Microsecond, "µs": time.Microsecond, "ms": time.Millisecond,
	"s": time.Second, "sec": time.Second, "second": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute,
	"h": time.Hour, "hour": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour,
	"w": 7 * 24 * time.Hour, "week": 7 * 24 * time.Hour,
}

// ErrSyntax is wrapped by the errors of ParseLimit for text it cannot read.
var ErrSyntax = errors.New("limit syntax")

// ParseLimit reads a limit written as "RATE/PERIOD [ALGORITHM] [burst=N]
// [precision=N]", such as "100/s", "100/5m sliding_window precision=10" or
// "30/1s token_bucket burst=100".
// PERIOD is a unit (us, ms, s, m, h, d, w, or second, minute, hour, day,
// week), optionally preceded by a count ("5m", "10s"), or a Go duration
// ("1m30s"). The result is validated.
func ParseLimit(s string) (Limit, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return Limit{}, fmt.Errorf("%w: empty limit", ErrSyntax)
	}
	rate, per, ok := strings.Cut(fields[0], "/")
	if !ok {
		return Limit{}, fmt.Errorf("%w: %q: want RATE/PERIOD, such as 100/s", ErrSyntax, fields[0])
	}
	var l Limit
	var err error
	if l.Rate, err = strconv.ParseInt(rate, 10, 64); err != nil {
		return Limit{}, fmt.Errorf("%w: rate %q is not a whole number", ErrSyntax, rate)
	}
	if l.Period, err = parsePeriod(per); err != nil {
		return Limit{}, err
	}
	for _, f := range fields[1:] {
		if v, ok := strings.CutPrefix(f, "burst="); ok {
			if l.Burst, err = strconv.ParseInt(v, 10, 64); err != nil {
				return Limit{}, fmt.Errorf("%w: burst %q is not a whole number", ErrSyntax, v)
			}
			if l.Burst == 0 {
				return Limit{}, &FieldError{"Burst", "must be at least 1, got 0"}
			}
			continue
		}
		if v, ok := strings.CutPrefix(f, "precision="); ok {
			if l.Precision, err = strconv.ParseInt(v, 10, 64); err != nil {
				return Limit{}, fmt.Errorf("%w: precision %q is not a whole number", ErrSyntax, v)
			}
			if l.Precision == 0 {
				return Limit{}, &FieldError{"Precision", fmt.Sprintf("must be between 1 and %d, got 0", MaxPrecision)}
			}
			continue
		}
		if l.Algorithm, err = ParseAlgorithm(f); err != nil {
			return Limit{}, fmt.Errorf("%w: %w", ErrSyntax, err)
		}
	}
	return l, l.Validate()
}

func parsePeriod(s string) (time.Duration, error) {
	if d, ok := unitPeriods[s]; ok {
		return d, nil
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i > 0 && i < len(s) {
		if unit, ok := unitPeriods[s[i:]]; ok {
			n, err := strconv.ParseInt(s[:i], 10, 64)
			if err != nil || n > math.MaxInt64/int64(unit) {
				return 0, fmt.Errorf("%w: period %q is too long", ErrSyntax, s)
			}
			return time.Duration(n) * unit, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%w: period %q: want a unit such as s, 5m or 1h", ErrSyntax, s)
	}
	return d, nil
}
