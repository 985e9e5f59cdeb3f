package redis

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

//go:embed take.lua
var takeBody string

// takeScript is take.lua after prelude.lua: the script Redis runs.
var takeScript = prelude + takeBody

// maxExact bounds the integers the Lua script computes with: Lua's numbers
// are doubles, exact for integers up to 2^53, and the script keeps every
// intermediate value within twice this bound.
const maxExact = 1 << 52

// ErrInexact is wrapped by the errors of limits whose arithmetic the Lua
// script cannot do exactly in doubles. See the package documentation for
// the bounds; limits that sluice.Limit.Validate accepts but that break them
// are rare (a token bucket of 1,000,003 per day, a period of 100 years).
// It wraps sluice.ErrLimit: such an error concerns the requests with that
// limit, never the store's health. Store.CheckLimit refuses such limits
// before they are used.
var ErrInexact error = inexactError{}

type inexactError struct{}

func (inexactError) Error() string {
	return "limit too large for exact arithmetic in Redis's Lua (doubles, exact below 2^53)"
}

func (inexactError) Unwrap() error { return sluice.ErrLimit }

// Script modes.
const (
	modeWrite  byte = 0 // one request for n keys, each applied and written (Takes)
	modeAll    byte = 1 // write all requests only if all are allowed (TakeAll)
	modeDryRun byte = 2 // decide, write nothing
)

// The sizes of the script's packed records: a group header '<Bi4', a
// request '<Bddddd' (the limit's part '<Bdddd', then the cost); and of its
// output: now '<d', the allowed bits of the states found, bitsPerWord per
// '<d' word, then a record per request '<Bdddd' (the state a Take found,
// or a decision).
const (
	headerSize  = 1 + 4
	limitSize   = 1 + 4*8
	requestSize = limitSize + 8
	nowSize     = 8
	recordSize  = 1 + 4*8
	wordSize    = 8
	bitsPerWord = 52
)

// local returns the decision sluice.Limit.TakeMicros makes without looking
// at the state: for a negative cost, a limit that makes no sense, or an
// unknown algorithm. ok is false for every request the script must decide.
func local(l sluice.Limit, cost int64) (d sluice.Decision, ok bool) {
	p := int64(l.Period / time.Microsecond)
	if cost < 0 || l.Rate <= 0 || p <= 0 || l.Burst < 0 {
		return sluice.Decision{Limit: l.Capacity(), RetryAfter: sluice.Never}, true
	}
	if l.Algorithm > sluice.GCRA {
		return sluice.Decision{RetryAfter: sluice.Never}, true
	}
	return sluice.Decision{}, false
}

// limitArgs caches the limit's part of the script's request record for
// each limit a store has seen: a service has few limits, and encoding one
// costs an allocation. It holds at most limitArgsMax limits and then
// encodes the rest each time. Safe for concurrent use.
type limitArgs struct {
	mu   sync.RWMutex
	m    map[sluice.Limit]*limitArg
	last atomic.Pointer[limitArg] // the limit converted last: no hash for a repeat
}

// limitArg is a limit and its part of a request record.
type limitArg struct {
	l sluice.Limit
	v [limitSize]byte
}

const limitArgsMax = 4096

// CheckLimit reports whether the Redis store can decide l exactly: nil, or
// an error wrapping ErrInexact (and so sluice.ErrLimit) that says which
// bound l passes (see the package documentation). Limits that
// sluice.Limit.Validate rejects, or that are decided without Redis (a rate
// or period of zero), pass. It needs no connection: a rules file can be
// checked for a Redis store without one. Store.CheckLimit, the
// sluice.LimitChecker of the store, calls it.
func CheckLimit(l sluice.Limit) error {
	if _, ok := local(l, 0); ok {
		return nil
	}
	_, err := encodeLimit(l)
	return err
}

// appendGroup appends a group header for n requests in mode to blob.
func appendGroup(blob []byte, mode byte, n int) []byte {
	return binary.LittleEndian.AppendUint32(append(blob, mode), uint32(n))
}

// appendRequest appends the script's record of cost hits of l, which
// local has let through, to blob.
func (c *limitArgs) appendRequest(blob []byte, l sluice.Limit, cost int64) ([]byte, error) {
	a := c.last.Load()
	if a == nil || a.l != l {
		c.mu.RLock()
		a = c.m[l]
		c.mu.RUnlock()
		if a == nil {
			v, err := encodeLimit(l)
			if err != nil {
				return blob, err
			}
			a = &limitArg{l, *v}
			c.mu.Lock()
			if c.m == nil {
				c.m = make(map[sluice.Limit]*limitArg)
			}
			if len(c.m) < limitArgsMax {
				c.m[l] = a
			}
			c.mu.Unlock()
		}
		c.last.Store(a)
	}
	blob = append(blob, a.v[:]...)
	return binary.LittleEndian.AppendUint64(blob, math.Float64bits(float64(cost))), nil
}

// encodeLimit returns the limit's part of a request record: the algorithm
// and its four parameters, as the script reads them.
func encodeLimit(l sluice.Limit) (*[limitSize]byte, error) {
	rate, p, c := l.Rate, int64(l.Period/time.Microsecond), l.Capacity()
	if p > maxExact/2 || rate > maxExact || c > maxExact {
		return nil, fmt.Errorf("%v: period or rate above 2^51µs or 2^52: %w", l, ErrInexact)
	}
	var a, b, cc, d int64
	switch l.Algorithm {
	case sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog:
		a, b = rate, p
	case sluice.TokenBucket, sluice.LeakyBucket:
		g := gcd(rate, p)
		a, b, cc, d = rate/g, p/g, c, g
		if hi, lo := bits.Mul64(uint64(c), uint64(b)); hi != 0 || lo > maxExact {
			return nil, fmt.Errorf("%v: capacity × period / gcd(rate, period) above 2^52: %w", l, ErrInexact)
		}
	case sluice.GCRA:
		T := (p + rate - 1) / rate
		if hi, lo := bits.Mul64(uint64(c), uint64(T)); hi != 0 || lo > maxExact/2 {
			return nil, fmt.Errorf("%v: capacity × emission interval above 2^51µs: %w", l, ErrInexact)
		}
		a, b, cc = T, c*T, c
	}
	var v [limitSize]byte
	v[0] = byte(l.Algorithm) // the script numbers them as sluice does (TestAlgorithmNumbers)
	if n := l.SubWindows(); n > 1 {
		v[0], cc = algWindows, n
	}
	for i, x := range [4]int64{a, b, cc, d} {
		binary.LittleEndian.PutUint64(v[1+8*i:], math.Float64bits(float64(x)))
	}
	return &v, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// float reads the script's '<d' at b, an integer below 2^53.
func float(b []byte) int64 {
	return int64(math.Float64frombits(binary.LittleEndian.Uint64(b)))
}

// algWindows is the script's number for a sliding_window of more than one
// sub-window (Limit.Precision), apart from sluice's numbers.
const algWindows byte = 16

// replays reports whether the script answers c with the state it found
// rather than a decision: c is a Take (one request, mode 0) of an
// algorithm whose state Go replays, every one but sliding_log and a
// sliding_window of sub-windows.
func (c *call) replays() bool {
	alg := c.blob[headerSize]
	return c.blob[0] == modeWrite && alg != byte(sluice.SlidingLog) && alg != algWindows
}

// decided reports whether the script returns a decision for l, not the
// state it found: for a sliding_log and a sliding_window of sub-windows,
// whose states Go does not replay (it checks their decisions with checkDecided).
func decided(l sluice.Limit) bool {
	return l.Algorithm == sluice.SlidingLog || l.SubWindows() > 1
}

// records returns how many records the script returns for c: one per
// request, and for a TakeAll's (mode 1 or 2) a second one each, the state
// found (see take.lua).
func (c *call) records() int {
	if c.blob[0] == modeWrite {
		return c.n
	}
	return 2 * c.n
}

// split hands each of calls, the calls of one script call in order, its
// part of the script's output out: now, its records and, when it replays,
// its allowed bit.
func split(calls []*call, out []byte) error {
	n, k := 0, 0
	for _, c := range calls {
		n += c.records()
		if c.replays() {
			k++
		}
	}
	words := wordSize * ((k + bitsPerWord - 1) / bitsPerWord)
	if want := nowSize + words + recordSize*n; len(out) != want {
		return fmt.Errorf("script returned %d bytes for %d records, want %d", len(out), n, want)
	}
	now, bits := float(out), out[nowSize:nowSize+words]
	off, bit := nowSize+words, 0
	for _, c := range calls {
		c.now = now
		size := recordSize * c.records()
		c.out = out[off : off+size : off+size]
		off += size
		if c.replays() {
			c.allowed = float(bits[wordSize*(bit/bitsPerWord):])>>(bit%bitsPerWord)&1 == 1
			bit++
		}
	}
	return nil
}

// decision returns the decision of c, a Take of cost hits of l that the
// script has answered.
func (c *call) decision(l sluice.Limit, cost int64) (sluice.Decision, error) {
	d, _, _, err := c.result(l, cost)
	return d, err
}

// result returns the decision of c, a Take of cost hits of l that the
// script has answered, and, when c replays (ok), the key's state after
// it.
func (c *call) result(l sluice.Limit, cost int64) (d sluice.Decision, st sluice.State, ok bool, err error) {
	if !c.replays() { // a sliding_log's, or sub-windows'
		d = decision(l, c.out)
		return d, st, false, checkDecided(l, cost, d)
	}
	st = found(l, c.out)
	d = l.TakeMicros(&st, c.now, cost)
	if d.Allowed != c.allowed {
		// A script and a Go transition that differ: never seen, but a
		// decision that may not be what Redis recorded is no decision.
		return sluice.Decision{}, st, false, fmt.Errorf("the script decided allowed=%v, Go's replay %v", c.allowed, d.Allowed)
	}
	return d, st, true, nil
}

// decisions writes the decisions of c, the TakeAll call (mode 1 or 2) of
// the requests reqs[i] for i in idx, to ds and reports whether all were
// allowed. It checks each against Go: a string state's decision is
// replayed on the state the script found (a key met earlier in the group
// goes on from Go's own working copy, afresh under another algorithm, as
// in the script), a sliding_log's with checkLog.
func (c *call) decisions(reqs []sluice.Request, idx []int, ds []sluice.Decision) (bool, error) {
	type working struct {
		alg  sluice.Algorithm
		subs int64 // a sliding_window's sub-windows, which the script numbers apart
		s    sluice.State
	}
	var states map[string]*working // by Redis key, made for a group of more than one
	if len(idx) > 1 {
		states = make(map[string]*working, len(idx))
	}
	allowed := true
	for k, i := range idx {
		r := reqs[i]
		d := decision(r.Limit, c.out[2*k*recordSize:])
		w := states[c.keys[k]]
		switch {
		case w == nil:
			w = &working{alg: r.Limit.Algorithm, subs: r.Limit.SubWindows()}
			if !decided(r.Limit) {
				w.s = found(r.Limit, c.out[(2*k+1)*recordSize:])
			}
			if states != nil {
				states[c.keys[k]] = w
			}
		case w.alg != r.Limit.Algorithm || w.subs != r.Limit.SubWindows(): // afresh, as in the script
			*w = working{alg: r.Limit.Algorithm, subs: r.Limit.SubWindows()}
		}
		if decided(r.Limit) {
			if err := checkDecided(r.Limit, r.Cost, d); err != nil {
				return false, fmt.Errorf("%s: %w", r.Key, err)
			}
		} else if want := r.Limit.TakeMicros(&w.s, c.now, r.Cost); d != want {
			return false, fmt.Errorf("%s: the script decided %+v, Go's replay %+v", r.Key, d, want)
		}
		ds[i] = d
		allowed = allowed && d.Allowed
	}
	return allowed, nil
}

// checkDecided checks d, the script's decision of cost hits of l, a sliding_log
// or a sliding_window of sub-windows, whose states Go does not replay.
func checkDecided(l sluice.Limit, cost int64, d sluice.Decision) error {
	if l.Algorithm == sluice.SlidingLog {
		return checkLog(l, cost, d)
	}
	return checkWindows(l, cost, d)
}

// checkWindows checks d, the script's decision of cost hits of l, a
// sliding_window of N > 1 sub-windows of g each, against what every such
// decision satisfies (see sluice's slidingWindow): no wait; room for no
// more than the rate, and no more than the rest when allowed; a reset of at
// most (N + 1) g, exactly that when it took hits (they are the newest); no
// retry when allowed, never exactly when the cost passes the rate, else one
// after a moment and no later than the reset.
func checkWindows(l sluice.Limit, cost int64, d sluice.Decision) error {
	p := l.Period.Truncate(time.Microsecond)
	g := p / time.Duration(l.SubWindows())
	ok := d.Wait == 0 && d.Remaining >= 0 && d.Remaining <= l.Rate && d.ResetAfter >= 0 && d.ResetAfter <= p+g
	switch {
	case d.Allowed:
		ok = ok && d.RetryAfter == 0 && d.Remaining <= l.Rate-cost && (cost == 0 || d.ResetAfter > p)
	case cost > l.Rate:
		ok = ok && d.RetryAfter == sluice.Never && d.Remaining < cost
	default:
		ok = ok && d.RetryAfter > 0 && d.RetryAfter <= d.ResetAfter && (d.Remaining < cost || d.Remaining == 0)
	}
	if !ok {
		return fmt.Errorf("the script decided %+v for %d hits of %v, which no sliding window decides", d, cost, l)
	}
	return nil
}

// checkLog checks d, the script's decision of cost hits of l, a
// sliding_log, whose state Go does not see, against what every sliding_log
// decision satisfies (see sluice's slidingLog): no wait; allowed, no retry
// and room left for no more than the rest, and a reset of a whole period
// when it took hits (they are the log's latest); denied, less room than
// the cost, and a retry of never exactly when the cost passes the rate,
// else one after a moment and no later than the reset; the reset at most a
// period, and 0 exactly when the log is empty.
func checkLog(l sluice.Limit, cost int64, d sluice.Decision) error {
	p := l.Period.Truncate(time.Microsecond) // the script's period, in µs
	ok := d.Wait == 0 && d.Remaining >= 0 && d.Remaining <= l.Rate &&
		d.ResetAfter >= 0 && d.ResetAfter <= p && (d.ResetAfter == 0) == (d.Remaining == l.Rate)
	if d.Allowed {
		ok = ok && d.RetryAfter == 0 && d.Remaining <= l.Rate-cost && (cost == 0 || d.ResetAfter == p)
	} else if cost > l.Rate {
		ok = ok && d.RetryAfter == sluice.Never && d.Remaining < cost
	} else {
		ok = ok && d.RetryAfter > 0 && d.RetryAfter <= d.ResetAfter && (d.Remaining < cost || d.Remaining == 0)
	}
	if !ok {
		return fmt.Errorf("the script decided %+v for %d hits of %v, which no sliding log decides", d, cost, l)
	}
	return nil
}

// found returns the sluice.State of rec, the state the script found for a
// request of l.
func found(l sluice.Limit, rec []byte) sluice.State {
	var t, n, x int64
	if rec[0] == byte(l.Algorithm) { // else none, or another algorithm's: afresh
		t, n, x = float(rec[1:]), float(rec[9:]), float(rec[17:])
	}
	switch l.Algorithm {
	case sluice.TokenBucket, sluice.LeakyBucket:
		// The script keeps the level in hit·µs over x = g, gcd(rate,
		// period) when it was written; one written under another g is
		// rescaled to this one, rounding up, as the script does.
		g := gcd(l.Rate, int64(l.Period/time.Microsecond))
		if x != g && n > 0 && x > 0 {
			// n·x is a level in hit·µs, below 2^63: hi is 0 (the % only
			// keeps a corrupt state from panicking)
			hi, lo := bits.Mul64(uint64(n), uint64(x))
			q, r := bits.Div64(hi%uint64(g), lo, uint64(g))
			if r > 0 {
				q++
			}
			n = int64(q)
		}
		return sluice.StateOf(t, n*g, 0)
	case sluice.SlidingWindow:
		return sluice.StateOf(t, n, x)
	default: // fixed_window; gcra, whose n is the latest admission
		return sluice.StateOf(t, n, 0)
	}
}

// decision builds the Decision of l from the script's decision record,
// which holds integers below 2^53 as doubles.
func decision(l sluice.Limit, rec []byte) sluice.Decision {
	v := func(i int) int64 { return float(rec[1+8*i:]) }
	d := sluice.Decision{
		Allowed:    rec[0] == 1,
		Limit:      l.Capacity(),
		Remaining:  v(0),
		ResetAfter: micros(v(1)),
		RetryAfter: micros(v(2)),
		Wait:       micros(v(3)),
	}
	if v(2) < 0 {
		d.RetryAfter = sluice.Never
	}
	return d
}

// micros converts µs to a Duration, saturating at sluice.Never as sluice
// does.
func micros(us int64) time.Duration {
	if us > int64(sluice.Never/time.Microsecond) {
		return sluice.Never
	}
	return time.Duration(us) * time.Microsecond
}
