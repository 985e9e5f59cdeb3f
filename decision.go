package sluice

import (
	"errors"
	"math"
	"time"
)

// Never is the RetryAfter of a request that no amount of waiting lets pass:
// its cost is more than the limit admits at once.
const Never = time.Duration(math.MaxInt64)

// Decision is what a limit decides on one request.
type Decision struct {
	// Allowed reports whether the request passes. A denied request consumes
	// nothing.
	Allowed bool
	// Limit is how many hits the limit admits at once: the rate for the
	// window algorithms, the burst for the bucket algorithms.
	Limit int64
	// Remaining is how many hits would pass right now, after this request.
	Remaining int64
	// ResetAfter is how long until the limit is whole again, as if the key
	// had never been seen. Zero when it already is.
	ResetAfter time.Duration
	// RetryAfter is how long until a request of the same cost would pass:
	// zero when allowed, Never when the cost exceeds Limit.
	RetryAfter time.Duration
	// Wait is, for leaky_bucket, how long an admitted request waits in the
	// queue before its turn; a caller that shapes traffic delays it that long
	// instead of rejecting. Zero for the other algorithms.
	Wait time.Duration
}

// ErrLimit is wrapped by the errors a Store returns for a limit it cannot
// apply, such as one whose arithmetic it cannot do exactly: the error
// concerns the requests with that limit, not the store, which is healthy.
// Callers tell the two apart with errors.Is; package decide never counts
// such an error as a store failure.
var ErrLimit = errors.New("limit not supported by the store")

// ErrStoreFull is wrapped by the errors a Store returns when it refused to
// write a count for want of memory: a Redis at its maxmemory under the
// noeviction policy answers every script call that writes with OOM instead
// of evicting counts. The store is healthy but full; the metrics count such
// errors under their own reason (sluice_store_errors_total{reason="oom"}),
// and package decide answers them with the fail mode as any store error.
var ErrStoreFull = errors.New("store full")

// LimitChecker is an optional interface of a Store that cannot apply every
// limit that Limit.Validate accepts. CheckLimit returns nil for a limit the
// store decides as the Limit transitions do, and otherwise an error that
// wraps ErrLimit and says why (store/redis refuses limits beyond the exact
// range of its Lua arithmetic). It does no I/O and is safe for concurrent
// use. Rules are checked with it before they are put in force, so that a
// limit the store refuses is a configuration error, not an error on every
// decision. A store without it applies every valid limit. Layers over a
// store do not pass it on: store/stack finds it once, where it composes
// them.
type LimitChecker interface {
	CheckLimit(Limit) error
}

// State is the state of one key under one limit. The zero value is a key
// never seen. A State is not safe for concurrent use; stores guard it.
type State struct {
	t   int64   // µs since the Unix epoch: window start, last update, or TAT
	n   int64   // count in the window, bucket level in hit·µs, or latest admission (gcra)
	p   int64   // count in the previous window (sliding_window: the oldest sub-window)
	log *hitLog // sliding_log's hits; sliding_window's sub-windows between p's and n's
}

// StateOf returns the State of fields t, n and p, for a store that keeps
// states outside the process and replays a transition here (store/redis
// does, on the state its script found): t is the window start
// (fixed_window, sliding_window), the time of the last update
// (token_bucket, leaky_bucket) or the TAT (gcra), in µs since the Unix
// epoch; n the count in the window, the bucket level in hit·µs, or the
// time of the latest admission (gcra); p the previous window's count
// (sliding_window), else 0. A sliding_log's State has no such form.
func StateOf(t, n, p int64) State { return State{t: t, n: n, p: p} }

// Fields returns the fields of s as StateOf takes them: StateOf(s.Fields())
// is s, but for a sliding_log's log.
func (s State) Fields() (t, n, p int64) { return s.t, s.n, s.p }

// Clone returns a copy of s that shares nothing with it: a plain copy of a
// State shares the sliding_log's log. It allocates only for a non-empty log.
func (s State) Clone() State {
	if s.log != nil {
		l := *s.log
		l.hits = append([]hit(nil), s.log.hits[s.log.head:]...)
		l.head = 0
		s.log = &l
	}
	return s
}

// Take applies cost hits of l at now to s and returns the decision. Cost 0
// only reports; a negative cost, or an invalid limit, is denied with Never.
// A clock that goes backwards never makes the limit admit more.
func (l Limit) Take(s *State, now time.Time, cost int64) Decision {
	return l.TakeMicros(s, now.UnixMicro(), cost)
}

// TakeMicros is Take with now in microseconds since the Unix epoch.
func (l Limit) TakeMicros(s *State, now int64, cost int64) Decision {
	p := int64(l.Period / time.Microsecond)
	if cost < 0 || l.Rate <= 0 || p <= 0 || l.Burst < 0 || !l.cuts(p) {
		return Decision{Limit: l.Capacity(), RetryAfter: Never}
	}
	switch l.Algorithm {
	case FixedWindow:
		return fixedWindow(l.Rate, p, s, now, cost)
	case SlidingWindow:
		return slidingWindow(l.Rate, p, l.SubWindows(), s, now, cost)
	case SlidingLog:
		return slidingLog(l.Rate, p, s, now, cost)
	case TokenBucket:
		return tokenBucket(l.Rate, p, l.Capacity(), s, now, cost)
	case LeakyBucket:
		return leakyBucket(l.Rate, p, l.Capacity(), s, now, cost)
	case GCRA:
		return gcra(l.Rate, p, l.Capacity(), s, now, cost)
	}
	return Decision{RetryAfter: Never}
}

// micros converts microseconds to a Duration, saturating.
func micros(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

// ceilDiv returns ⌈a/b⌉ for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	q, r := a/b, a%b // one division
	if r != 0 {
		q++
	}
	return q
}

// windowStart returns the start of the period-long window, aligned to the
// Unix epoch, that holds now; known is the start of a window seen before,
// which spares the division while now is still in it.
func windowStart(now, period, known int64) int64 {
	if now >= known && now-known < period {
		return known
	}
	m := now % period
	if m < 0 {
		m += period
	}
	return now - m
}
