package redis

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

//go:embed take.lua
var takeScript string

// maxExact bounds the integers the Lua script computes with: Lua's numbers
// are doubles, exact for integers up to 2^53, and the script keeps every
// intermediate value within twice this bound.
const maxExact = 1 << 52

// ErrInexact is wrapped by the errors of limits whose arithmetic the Lua
// script cannot do exactly in doubles. See the package documentation for
// the bounds; limits that sluice.Limit.Validate accepts but that break them
// are rare (a token bucket of 1,000,003 per day, a period of 100 years).
var ErrInexact = errors.New("limit too large for exact arithmetic in Redis's Lua")

// Script modes.
const (
	modeWrite  byte = 0 // one request for n keys, each applied and written (Takes)
	modeAll    byte = 1 // write all requests only if all are allowed (TakeAll)
	modeDryRun byte = 2 // decide, write nothing
)

// The sizes of the script's packed records: a group header '<Bi4', a
// request '<Bddddd' (the limit's part '<Bdddd', then the cost), a decision
// '<Bdddd'.
const (
	headerSize   = 1 + 4
	limitSize    = 1 + 4*8
	requestSize  = limitSize + 8
	decisionSize = 1 + 4*8
)

// capacity returns how many hits l admits at once, as sluice does.
func capacity(l sluice.Limit) int64 {
	if l.Burst > 0 && l.Algorithm.HasBurst() {
		return l.Burst
	}
	return l.Rate
}

// local returns the decision sluice.Limit.TakeMicros makes without looking
// at the state: for a negative cost, a limit that makes no sense, or an
// unknown algorithm. ok is false for every request the script must decide.
func local(l sluice.Limit, cost int64) (d sluice.Decision, ok bool) {
	p := int64(l.Period / time.Microsecond)
	if cost < 0 || l.Rate <= 0 || p <= 0 || l.Burst < 0 {
		return sluice.Decision{Limit: capacity(l), RetryAfter: sluice.Never}, true
	}
	if l.Algorithm > sluice.GCRA {
		return sluice.Decision{RetryAfter: sluice.Never}, true
	}
	return sluice.Decision{}, false
}

// limitArgs caches the script's first five values of each limit a store
// has seen: a service has few limits, and their conversion to strings
// would otherwise cost allocations on every decision. It holds at most
// limitArgsMax limits and then converts the rest each time. Safe for
// concurrent use.
type limitArgs struct {
	mu sync.RWMutex
	m  map[sluice.Limit]*[limitSize]byte
}

const limitArgsMax = 4096

// CheckLimit reports whether the Redis store can decide l exactly: nil, or
// an error wrapping ErrInexact that says which bound l passes (see the
// package documentation). Limits that sluice.Limit.Validate rejects, or
// that are decided without Redis (a rate or period of zero), pass. Call it
// when loading rules for a Redis store, so that such a limit is a
// configuration error rather than an error on each decision.
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
	c.mu.RLock()
	v := c.m[l]
	c.mu.RUnlock()
	if v == nil {
		var err error
		if v, err = encodeLimit(l); err != nil {
			return blob, err
		}
		c.mu.Lock()
		if c.m == nil {
			c.m = make(map[sluice.Limit]*[limitSize]byte)
		}
		if len(c.m) < limitArgsMax {
			c.m[l] = v
		}
		c.mu.Unlock()
	}
	blob = append(blob, v[:]...)
	return binary.LittleEndian.AppendUint64(blob, math.Float64bits(float64(cost))), nil
}

// encodeLimit returns the limit's part of a request record: the algorithm
// and its four parameters, as the script reads them.
func encodeLimit(l sluice.Limit) (*[limitSize]byte, error) {
	rate, p, c := l.Rate, int64(l.Period/time.Microsecond), capacity(l)
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

// decision builds the Decision of l from the script's record, which holds
// integers below 2^53 as doubles.
func decision(l sluice.Limit, rec []byte) sluice.Decision {
	v := func(i int) int64 { return int64(math.Float64frombits(binary.LittleEndian.Uint64(rec[1+8*i:]))) }
	d := sluice.Decision{
		Allowed:    rec[0] == 1,
		Limit:      capacity(l),
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
